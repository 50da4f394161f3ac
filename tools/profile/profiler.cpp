#include "tools/profile/profiler.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "compiler/ir/onnx_bridge.h"
#include "passes/autodiff.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
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

/// Deterministic inputs: floats uniform in [-1, 1) drawn from `seed`, everything else zero
/// (integers 0, bools false).
std::vector<rt::Tensor> make_inputs(const rt::Program& program, uint32_t seed) {
  std::mt19937 rng(seed);
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

/// The input sets the timed runs take in turn: `kInputSets` of them when the inputs are at most
/// `kRotatedBytes`, else one. A kernel that branches on its data (a pooling gradient's argmax)
/// runs one input's branches again and again in a profile, and a branch predictor learns them
/// while a run feeds it new values every microbatch: MaxPoolGrad of [2,32,26,26] measured 42 us
/// a call on one repeated input and 160-179 us in a training run (bench/RESULTS.md). Larger
/// inputs hold more branches than a predictor keeps, and four copies would cost memory.
constexpr int kInputSets = 4;
constexpr int64_t kRotatedBytes = int64_t{16} << 20;

std::vector<std::vector<rt::Tensor>> make_input_sets(const rt::Program& program) {
  int64_t bytes = 0;
  for (const rt::ValueInfo& info : program.inputs()) bytes += info.numel_bytes();
  const int sets = bytes <= kRotatedBytes ? kInputSets : 1;
  std::vector<std::vector<rt::Tensor>> out;
  for (int k = 0; k < sets; ++k) out.push_back(make_inputs(program, 20261121u + k));
  return out;
}

/// The median time of one run of a model and the runs it is over.
struct Timing {
  double ms = 0;
  int64_t runs = 0;
};

/// Binds `model` on the backend with its outputs made arena intermediates (a run then
/// times the kernels, not the allocation and zero-fill of owned output tensors) and times it
/// as the file comment says. `what` names it in errors.
Timing time_model(onnx::ModelProto model, const std::string& what, int threads,
                  std::string_view backend_name) {
  OmpThreads omp_scope(threads);
  const rt::Backend& backend = rt::backend_by_name(backend_name);
  auto* g = model.mutable_graph();
  for (const auto& out : g->output()) *g->add_value_info() = out;
  g->clear_output();

  auto program = [&] {
    try {
      return rt::Program::from_model(model, backend, what);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("{} cannot be profiled on the {} backend: {}", what,
                                        backend.name(), e.message()));
    }
  }();
  std::vector<std::vector<rt::Tensor>> input_sets = make_input_sets(program);
  auto context = backend.make_device(0, threads);
  if (!context->host_visible()) {  // a GPU: inputs and weights on it
    for (auto& inputs : input_sets)
      for (rt::Tensor& t : inputs) t = rt::to_device(*context, t);
    std::map<std::string, rt::Tensor> weights;
    for (const auto& [name, w] : program.weights()) weights[name] = rt::to_device(*context, w);
    program.rebind_weights(weights);
  }
  // The device's own arena (its first touch is the warm-up run's).
  auto arena = with_context(what + ": profiling", ErrorKind::kIo,
                            [&] { return context->allocate(program.arena_bytes()); });

  size_t runs = 0;
  auto run_once = [&] {
    try {
      program.run(*context, input_sets[runs++ % input_sets.size()], arena->base());
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("{} cannot be profiled on the {} backend: {}", what,
                                        backend.name(), e.message()));
    }
  };
  // Warm-up, once per input set: first touch of the arena, oneDNN primitive creation, caches.
  for (size_t k = 0; k < input_sets.size(); ++k) run_once();
  std::vector<double> samples;
  double total = 0;
  while (static_cast<int>(samples.size()) < kMinRuns ||
         (total < kBudgetS && static_cast<int>(samples.size()) < kMaxRuns)) {
    double s = context->time_ms(run_once) * 1e-3;  // CUDA: events around the run
    samples.push_back(s);
    total += s;
  }
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  double median = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  // A positive time even for an op below the clock's resolution (the database refuses 0).
  return Timing{std::max(median * 1e3, 1e-6), static_cast<int64_t>(n)};
}

void check_threads(int threads) {
  if (threads < 1)
    fail(ErrorKind::kUsage, "--profile-threads must be at least 1 (got {})", threads);
}

}  // namespace

std::string kernels_stamp(std::string_view backend) {
  return backend == "cuda" ? STAGECRAFT_CUDA_KERNELS : STAGECRAFT_CPU_KERNELS;
}

std::string refresh_kernels(cost::ProfileDb& db, const std::string& path) {
  const std::string stamp = kernels_stamp(db.backend());
  std::string note;
  const bool measured = db.size() > 0 || !db.instruction_ms().empty() || !db.calibrations().empty();
  if (measured && db.kernels() != stamp) {
    note = fmt::format(
        "{}: measured with other {} kernels ({}; these are {}): its {} signatures and "
        "calibrations are measured again",
        path, db.backend(), db.kernels().empty() ? "no kernels stamp" : "kernels " + db.kernels(),
        stamp, db.size());
    db.clear_measurements();
  }
  db.set_kernels(stamp);
  return note;
}

cost::ProfileEntry measure_node(const ir::Graph& graph, ir::NodeId id, int threads,
                                std::string_view backend) {
  check_threads(threads);
  const ir::Node& node = graph.node(id);
  ir::ExportOptions options;
  options.nodes = std::vector<ir::NodeId>{id};
  options.weights = ir::WeightMode::kEmbed;
  options.value_info = true;
  Timing t =
      time_model(ir::model_from_graph(graph, options), node.describe(graph), threads, backend);
  return cost::ProfileEntry{node.op_type, t.ms, t.runs, {}};
}

cost::BackwardEntry measure_backward(const ir::Graph& graph, ir::NodeId id, int threads,
                                     std::string_view backend) {
  check_threads(threads);
  const ir::Node& node = graph.node(id);
  // The node alone as a stage: every floating-point output receives a gradient.
  passes::BackwardSpec spec;
  spec.nodes = {id};
  for (ir::ValueId out : node.outputs) {
    if (out != ir::kNoId && is_floating(graph.value(out).dtype)) spec.output_grads.push_back(out);
  }
  // B: the activations at differentiable positions (graph inputs included, see
  // cost::input_kinds); W: the trainable weights, by the pass's own rule.
  std::vector<ir::ValueId> activations;
  for (std::size_t k = 0; k < node.inputs.size(); ++k) {
    ir::ValueId v = node.inputs[k];
    if (v == ir::kNoId) continue;
    const ir::Value& value = graph.value(v);
    if (value.is_initializer() || !is_floating(value.dtype) || !passes::differentiable_at(node, k))
      continue;
    if (std::find(activations.begin(), activations.end(), v) == activations.end())
      activations.push_back(v);
  }
  std::vector<ir::ValueId> weights = passes::trainable_weights(graph, spec.nodes);

  const std::string grad_op = node.op_type + std::string(grad::kGradSuffix);
  auto time_part = [&](std::vector<ir::ValueId> wanted, const char* part) {
    spec.wanted = std::move(wanted);
    std::string what =
        fmt::format("{} backward ({}, {} gradients)", node.describe(graph), grad_op, part);
    onnx::ModelProto model = with_context(what, ErrorKind::kInternal,
                                          [&] { return passes::build_backward(graph, spec); });
    return time_model(std::move(model), what, threads, backend);
  };
  cost::BackwardEntry entry;
  if (spec.output_grads.empty()) return entry;
  if (!activations.empty()) {
    Timing t = time_part(activations, "input");
    entry.input_ms = t.ms;
    entry.input_runs = t.runs;
  }
  if (!weights.empty()) {
    Timing t = time_part(weights, "weight");
    entry.weight_ms = t.ms;
    entry.weight_runs = t.runs;
  }
  return entry;
}

ProfileStats profile_graph(const ir::Graph& graph, cost::ProfileDb& db, int threads,
                           Direction direction, const Progress& progress) {
  auto start = Clock::now();
  if (threads != db.threads()) {
    fail(ErrorKind::kUsage, "profiling with {} threads into a database measured with {}", threads,
         db.threads());
  }
  if (db.backend() != "cpu" && db.backend() != "cuda") {
    fail(ErrorKind::kUnsupported, "only the cpu and cuda backends can be profiled, not '{}'",
         db.backend());
  }
  struct BackwardTodo {
    std::string key, kinds;
    ir::NodeId id;
  };
  ProfileStats stats;
  std::map<std::string, bool> seen;     // signature -> already in the database
  std::set<std::string> seen_backward;  // signature + "|" + input kinds
  std::vector<std::pair<std::string, ir::NodeId>> todo;
  std::vector<BackwardTodo> backward_todo;
  for (ir::NodeId id : graph.topological_order()) {
    const ir::Node& node = graph.node(id);
    std::string key = cost::signature_key(graph, node);
    if (!seen.count(key)) {
      bool cached = db.find(key) != nullptr;
      seen[key] = cached;
      if (cached) {
        ++stats.cached;
      } else {
        todo.emplace_back(key, id);
      }
    }
    if (direction != Direction::kForwardAndBackward || !cost::may_have_backward(graph, node))
      continue;
    std::string kinds = cost::input_kinds(graph, node);
    if (!seen_backward.insert(key + "|" + kinds).second) continue;
    ++stats.backward_signatures;
    if (db.find_backward(key, kinds) != nullptr) {
      ++stats.backward_cached;
    } else {
      backward_todo.push_back({std::move(key), std::move(kinds), id});
    }
  }
  stats.signatures = static_cast<int>(seen.size());
  const int total = static_cast<int>(todo.size() + backward_todo.size());
  int done = 0;
  for (const auto& [key, id] : todo) {
    db.put(key, measure_node(graph, id, threads, db.backend()));
    ++stats.measured;
    if (progress) progress(++done, total);
  }
  for (const auto& [key, kinds, id] : backward_todo) {
    try {
      db.put_backward(key, kinds, measure_backward(graph, id, threads, db.backend()));
      ++stats.backward_measured;
    } catch (const Error& e) {
      // A gradient op the backend lacks (or refuses for these dtypes): the roofline ratio
      // stands in, and the next profile tries again.
      if (e.kind() != ErrorKind::kUnsupported) throw;
      stats.backward_by_ratio.push_back(e.what());
    }
    if (progress) progress(++done, total);
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace stagecraft::profile

namespace stagecraft::profile {

double measure_empty_program(int threads, std::string_view backend) {
  check_threads(threads);
  onnx::ModelProto model;
  model.set_ir_version(8);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(17);
  onnx::GraphProto* g = model.mutable_graph();
  g->set_name("empty_instruction");
  auto add_value = [](onnx::ValueInfoProto* v, const char* name) {
    v->set_name(name);
    auto* tensor = v->mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(onnx::TensorProto::FLOAT);
    tensor->mutable_shape()->add_dim()->set_dim_value(1);
  };
  add_value(g->add_input(), "x");
  add_value(g->add_output(), "y");
  onnx::NodeProto* node = g->add_node();
  node->set_op_type("Identity");
  node->set_name("empty");
  node->add_input("x");
  node->add_output("y");
  return time_model(model, "an empty instruction's program", threads, backend).ms;
}

}  // namespace stagecraft::profile
