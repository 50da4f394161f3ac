// Writes a plan directory: stage files, plan.json and schedule.json, replaced atomically.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <random>

#include "compiler/partition/graph_problem.h"
#include "compiler/plan/attention_function.h"
#include "compiler/plan/conv_function.h"
#include "compiler/plan/gelu_function.h"
#include "compiler/plan/loss_function.h"
#include "compiler/plan/planner.h"
#include "compiler/plan/pool_function.h"
#include "compiler/plan/stage_files.h"
#include "compiler/plan/stage_weights.h"
#include "passes/autodiff.h"
#include "runtime/format/error.h"

namespace stagecraft::plan {
namespace fs = std::filesystem;
namespace {

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.flush();
  if (!f) fail(ErrorKind::kIo, "{}: cannot write {} bytes", path.string(), bytes.size());
}

/// Flushes a file or folder to disk so a rename after it is durable.
void sync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

/// The staging folder of a plan being written is named PLAN + this + the writer's pid.
constexpr const char* kStagingInfix = ".partial-";

/// Removes staging folders of `target` left by writers that died (killed mid-write): those
/// whose pid no longer runs. A live writer's folder is left alone.
void remove_stale_staging(const fs::path& target) {
  std::error_code ec;
  const std::string prefix = target.filename().string() + kStagingInfix;
  for (fs::directory_iterator it(target.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9)
      continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH)) fs::remove_all(it->path(), ec);
  }
}

/// Reads `text` back the way the runtime reads plan.json (plan_from_json, validate_plan), so a
/// plan stagec writes is one stagerun accepts. A refusal here is a bug in the planner.
void check_readable(const std::string& text, const std::string& path) {
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    validate_plan(plan_from_json(json, path), path);
    if (plan_json_hash(json) != json.value("plan_hash", std::string()))
      fail(ErrorKind::kPlan, "its field 'plan_hash' does not match its content");
  } catch (const Error& e) {
    fail(ErrorKind::kInternal, "the plan about to be written does not read back: {}", e.what());
  }
}

/// ZeRO-1's boundaries of a stage as the runtime will count its sharded parameters: the
/// weights of the stage file whose gradient the backward file outputs ("W@grad"), less the
/// shared ones, split evenly over the replicas.
std::vector<int64_t> shards_of(const onnx::ModelProto& forward, const onnx::ModelProto& backward,
                               const Stage& stage, const Plan& plan) {
  int64_t elements = 0;
  for (const onnx::TensorProto& w : forward.graph().initializer()) {
    if (w.data_type() != onnx::TensorProto::FLOAT) continue;
    const bool trained = std::any_of(
        backward.graph().output().begin(), backward.graph().output().end(),
        [&](const onnx::ValueInfoProto& out) { return out.name() == w.name() + "@grad"; });
    const bool shared =
        std::any_of(stage.shared_weights.begin(), stage.shared_weights.end(),
                    [&](const SharedWeight& sw) { return sw.name == w.name(); });
    if (!trained || shared) continue;
    int64_t n = 1;
    for (int64_t d : w.dims()) n *= d;
    elements += n;
  }
  return even_shards(elements, plan.data_parallel);
}

/// A symbolic link at each referenced file's location, so that ONNX's own tools (the checker,
/// onnx.load, ONNX Runtime) open a stage file with its weights. stagerun never follows them: it
/// resolves these locations through plan.json's weight_files alone.
void link_weight_files(const fs::path& staging, const std::vector<WeightFile>& files) {
  for (const WeightFile& w : files) {
    const fs::path link = staging / w.location;
    std::error_code ec;
    fs::create_directories(link.parent_path(), ec);
    fs::create_symlink(w.path, link, ec);
    if (ec) fail(ErrorKind::kIo, "{}: cannot link to {}: {}", link.string(), w.path, ec.message());
  }
}

}  // namespace

void write_plan(PlannedModel& planned, const std::string& plan_dir, const WeightWriting& writing) {
  fs::path target = fs::absolute(plan_dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  remove_stale_staging(target);
  std::error_code ec;
  if (fs::exists(target, ec)) {
    if (!fs::is_directory(target, ec)) fail(ErrorKind::kIo, "{}: exists and is not a directory", plan_dir);
    if (!fs::is_empty(target, ec) && !fs::exists(target / "plan.json", ec)) {
      fail(ErrorKind::kIo, "{}: is a non-empty directory without plan.json; refusing to replace it", plan_dir);
    }
  }
  check_has_loss(planned.plan);
  // Every refusal above comes before anything is written; from here on the staging folder is
  // removed on every way out but the final rename, so no PLAN.partial-* stays behind.
  fs::create_directories(target.parent_path(), ec);
  fs::path staging = target.parent_path() / (target.filename().string() + kStagingInfix + std::to_string(::getpid()));
  fs::remove_all(staging, ec);
  if (!fs::create_directory(staging, ec)) {
    fail(ErrorKind::kIo, "{}: cannot create: {}", staging.string(), ec.message());
  }
  try {
    Plan& p = planned.plan;
    p.weight_files.clear();
    int64_t placed = 0;
    const ir::Graph& graph = planned.model.graph;
    const std::vector<ir::NodeId> partition = partition::partition_order(graph);
    const std::vector<ir::NodeId> topological = graph.topological_order();
    for (auto& stage : p.stages) {
      // The weights' bytes go to external data (or stay embedded when small) one tensor at a
      // time: the stage file itself holds the graph.
      auto model = stage_model(graph, planned.stage_of, stage.index, ir::WeightMode::kNoData,
                               &partition);
      place_stage_weights(model, planned.model.graph, staging, stage, p.weight_files, writing,
                          placed, static_cast<int>(p.stages.size()));
      placed += stage.weights_bytes;
      // Fused Attention and Gelu nodes, 16-bit Convs and pools and a loss on 16-bit scores come
      // with their standard-op body, so the file stays plain ONNX.
      add_attention_function(model);
      add_gelu_function(model);
      add_conv_function(model);
      add_loss_function(model);
      add_pool_functions(model);
      fs::path file = staging / stage.file;
      write_file(file, model.SerializeAsString());
      sync_path(file);
      stage.file_hash = file_hash(file.string());
      if (p.training) {
        stage.backward_file = fmt::format("stage_{}_bwd.onnx", stage.index);
        fs::path bwd = staging / stage.backward_file;
        onnx::ModelProto backward = backward_stage_model(
            graph, planned.stage_of, stage, p.training_config.loss_output, &topological);
        add_attention_function(backward);
        add_gelu_function(backward);
        add_conv_function(backward);
        add_loss_function(backward);
        add_pool_functions(backward);
        write_file(bwd, backward.SerializeAsString());
        if (p.shard_optimizer) stage.optimizer_shards = shards_of(model, backward, stage, p);
        sync_path(bwd);
        stage.backward_file_hash = file_hash(bwd.string());
      }
    }
    link_weight_files(staging, p.weight_files);
    const std::string schedule_text = schedule::to_json(planned.schedule).dump(1) + "\n";
    p.schedule_hash = json_hash(nlohmann::json::parse(schedule_text));
    nlohmann::ordered_json plan_json = to_json(p);
    if (!planned.instruction_costs.empty())
      plan_json["instruction_costs"] = instruction_costs_json(planned.instruction_costs);
    const std::string text = plan_json_text(plan_json);
    check_readable(text, (target / "plan.json").string());
    write_file(staging / "plan.json", text);
    write_file(staging / "schedule.json", schedule_text);
    sync_path(staging / "plan.json");
    sync_path(staging / "schedule.json");
    sync_path(staging);
    // Swap in: the old plan (if any) moves aside first, so a crash leaves one complete plan.
    fs::path old = target.parent_path() / (target.filename().string() + ".old-" + std::to_string(::getpid()));
    bool had_old = fs::exists(target, ec);
    if (had_old) fs::rename(target, old);
    fs::rename(staging, target);
    if (had_old) fs::remove_all(old, ec);
    sync_path(target.parent_path());
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

void check_has_loss(const Plan& plan) {
  if (plan.training && plan.training_config.loss_output.empty())
    fail(ErrorKind::kUsage,
         "{}: a training plan needs a loss: the model has no scalar float32 output; give --loss "
         "mse|cross-entropy (and --labels NAME)",
         plan.model_path);
}

}  // namespace stagecraft::plan
