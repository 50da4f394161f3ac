#include "tools/profile/profiler.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "compiler/ir/onnx_bridge.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/format/error.h"
#include "runtime/format/memory_plan.h"

namespace stagecraft::profile {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kBudgetS = 10e-3;  // time the timed runs until they add up to this ...
constexpr int kMaxRuns = 100;       // ... or this many, whichever comes first,
constexpr int kMinRuns = 3;         // but never fewer than this.

/// Sets the calling thread's OpenMP thread count for a scope.
class OmpThreads {
 public:
  explicit OmpThreads(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~OmpThreads() { omp_set_num_threads(saved_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

/// Deterministic inputs: floats uniform in [-1, 1), everything else zero (integers 0, bools false).
std::vector<rt::Tensor> make_inputs(const rt::Program& program) {
  std::mt19937 rng(20261121);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<rt::Tensor> inputs;
  for (const rt::ValueInfo& info : program.inputs()) {
    rt::Tensor t = rt::Tensor::owned(info.dtype, info.shape);
    const int64_t n = t.numel();
    if (info.dtype == DType::kFloat32) {
      for (int64_t i = 0; i < n; ++i) t.as<float>()[i] = uniform(rng);
    } else if (info.dtype == DType::kFloat64) {
      for (int64_t i = 0; i < n; ++i) t.as<double>()[i] = uniform(rng);
    }
    inputs.push_back(std::move(t));
  }
  return inputs;
}

}  // namespace

cost::ProfileEntry measure_node(const ir::Graph& graph, ir::NodeId id, int threads) {
  const ir::Node& node = graph.node(id);
  if (threads < 1) fail(ErrorKind::kUsage, "--profile-threads must be at least 1 (got {})", threads);
  OmpThreads omp_scope(threads);
  const rt::Backend& backend = rt::cpu_backend();

  ir::ExportOptions options;
  options.nodes = std::vector<ir::NodeId>{id};
  options.weights = ir::WeightMode::kEmbed;
  options.value_info = true;
  onnx::ModelProto model = ir::model_from_graph(graph, options);
  // The node's outputs become arena intermediates: a run then times the kernel, not the
  // allocation and zero-fill of owned output tensors.
  auto* g = model.mutable_graph();
  for (const auto& out : g->output()) *g->add_value_info() = out;
  g->clear_output();

  std::string what = node.describe(graph);
  auto program = [&] {
    try {
      return rt::Program::from_model(model, backend, what);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("{} cannot be profiled on the {} backend: {}", what, backend.name(), e.message()));
    }
  }();
  std::vector<rt::Tensor> inputs = make_inputs(program);
  auto context = backend.make_device(0, threads);
  const auto arena_size = static_cast<size_t>((program.arena_bytes() + plan::kArenaAlignment - 1) /
                                              plan::kArenaAlignment * plan::kArenaAlignment + plan::kArenaAlignment);
  std::unique_ptr<std::byte[], void (*)(std::byte*)> arena(
      static_cast<std::byte*>(std::aligned_alloc(plan::kArenaAlignment, arena_size)), [](std::byte* b) { std::free(b); });
  if (!arena) fail(ErrorKind::kIo, "{}: cannot allocate a {}-byte arena to profile it", what, arena_size);

  auto run_once = [&] {
    try {
      program.run(*context, inputs, arena.get());
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("{} cannot be profiled on the {} backend: {}", what, backend.name(), e.message()));
    }
  };
  run_once();  // warm-up: first-touch of the arena, oneDNN primitive creation, caches
  std::vector<double> samples;
  double total = 0;
  while (static_cast<int>(samples.size()) < kMinRuns ||
         (total < kBudgetS && static_cast<int>(samples.size()) < kMaxRuns)) {
    auto start = Clock::now();
    run_once();
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    samples.push_back(s);
    total += s;
  }
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  double median = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  // A positive time even for an op below the clock's resolution (the database refuses 0).
  return cost::ProfileEntry{node.op_type, std::max(median * 1e3, 1e-6), static_cast<int64_t>(n)};
}

ProfileStats profile_graph(const ir::Graph& graph, cost::ProfileDb& db, int threads, const Progress& progress) {
  auto start = Clock::now();
  if (threads != db.threads()) {
    fail(ErrorKind::kUsage, "profiling with {} threads into a database measured with {}", threads, db.threads());
  }
  if (db.backend() != "cpu") {
    fail(ErrorKind::kUnsupported, "only the cpu backend can be profiled, not '{}'", db.backend());
  }
  ProfileStats stats;
  std::map<std::string, bool> seen;  // signature -> already in the database
  std::vector<std::pair<std::string, ir::NodeId>> todo;
  for (ir::NodeId id : graph.topological_order()) {
    std::string key = cost::signature_key(graph, graph.node(id));
    if (seen.count(key)) continue;
    bool cached = db.find(key) != nullptr;
    seen[key] = cached;
    if (cached) {
      ++stats.cached;
    } else {
      todo.emplace_back(std::move(key), id);
    }
  }
  stats.signatures = static_cast<int>(seen.size());
  const int total = static_cast<int>(todo.size());
  for (const auto& [key, id] : todo) {
    db.put(key, measure_node(graph, id, threads));
    ++stats.measured;
    if (progress) progress(stats.measured, total);
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace stagecraft::profile
