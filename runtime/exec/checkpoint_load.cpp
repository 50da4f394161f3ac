// Loading a checkpoint (runtime/exec/checkpoint.h) into any training plan of its model: each
// weight of the stages held here, and its optimizer state, is found by name in whichever saved
// stage holds it, so another device count, other cuts, schedule, chunk count, replica count,
// ZeRO-1 or precision loads alike.
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "runtime/core/tensor_io.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/format/error.h"
#include "runtime/format/inside_folder.h"
#include "runtime/format/json_reader.h"

namespace stagecraft::rt {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxStep = int64_t{1} << 53;

/// A weight and its file in a manifest (`dtype` and `shape` are checked against the file's).
struct SavedWeight {
  std::string name, file;
};

/// One optimizer state tensor of a weight.
struct SavedState {
  std::string weight, state, file;
};

struct SavedStage {
  std::vector<SavedWeight> weights;
  std::vector<SavedState> optimizer;
};

/// What load_checkpoint needs of manifest.json.
struct Manifest {
  std::string model_hash, optimizer;
  int64_t step = 0;
  std::vector<SavedStage> stages;
  /// Dynamic loss scaling's state ("loss_scale", version 3, fp16 plans): S and clean steps.
  std::optional<std::pair<double, int64_t>> loss_scale;
  nlohmann::json data;  ///< The caller's data position ("data", SaveOptions::data), or null.
};

/// Reads `file` (a manifest.json): every field it needs required and checked, each error naming
/// the file and the field. Top-level fields it does not know are left alone (a later stagerun's
/// additions); inside `plan` and the stages unknown fields are refused. `data` (the caller's
/// data position) must be an object.
Manifest read_manifest(const std::string& file) {
  nlohmann::json json = read_json_file(file);
  JsonObject top = JsonValue(json, file).object();
  if (top.string("format") != kCheckpointFormat)
    top.fail("format", fmt::format("is not '{}'", kCheckpointFormat));
  int version = top.int32("version");
  if (version < 1 || version > kCheckpointVersion)
    fail(ErrorKind::kUnsupported, "{}: field 'version' is {}; this stagerun reads versions 1 to {}",
         file, version, kCheckpointVersion);
  top.object("plan", {"schedule", "devices", "microbatches"});
  Manifest m;
  m.model_hash = top.string("model_hash");
  m.optimizer = top.string("optimizer");
  m.step = top.int64("step");
  if (m.step < 0) top.fail("step", fmt::format("is negative ({})", m.step));
  // Past 2^53 the step no longer fits a double exactly (the lr schedule's arithmetic) and
  // the workers' step + 1 would soon overflow: no run takes that many steps.
  if (m.step > kMaxStep)
    top.fail("step", fmt::format("is {}, more than 2^53 ({}) optimizer steps", m.step, kMaxStep));
  if (std::optional<JsonValue> ls = top.find("loss_scale")) {
    JsonObject o = ls->object({"scale", "clean_steps"});
    const int64_t clean = o.int64("clean_steps");
    if (clean < 0) o.fail("clean_steps", fmt::format("is negative ({})", clean));
    m.loss_scale = {o.positive_number("scale"), clean};
  }
  if (json.contains("data")) {
    if (!json["data"].is_object()) top.fail("data", "is not an object");
    m.data = json["data"];
  }
  m.stages = top.array("stages", [](const JsonValue& v) {
    JsonObject f = v.object({"index", "file", "file_hash", "weights", "optimizer"});
    SavedStage stage;
    stage.weights = f.array("weights", [](const JsonValue& w) {
      JsonObject o = w.object({"name", "file", "dtype", "shape"});
      return SavedWeight{o.string("name"), o.string("file")};
    });
    stage.optimizer = f.array("optimizer", [](const JsonValue& w) {
      JsonObject o = w.object({"weight", "state", "file"});
      return SavedState{o.string("weight"), o.string("state"), o.string("file")};
    });
    return stage;
  });
  return m;
}

/// An entry of the manifest: stages[stage].weights[entry] or .optimizer[entry].
struct Entry {
  size_t stage = 0, entry = 0;
};

/// Where the checkpoint holds each weight and optimizer state tensor, by name: the first saved
/// stage that lists it. A shared weight is saved by its lowest holder alone; a version-1
/// checkpoint saved every holder's copy (equal), and the lowest holder's is taken.
struct Index {
  std::map<std::string, Entry> weights;
  std::map<std::pair<std::string, std::string>, Entry> states;  ///< (weight, state)

  explicit Index(const Manifest& m) {
    for (size_t k = 0; k < m.stages.size(); ++k) {
      for (size_t i = 0; i < m.stages[k].weights.size(); ++i)
        weights.emplace(m.stages[k].weights[i].name, Entry{k, i});
      for (size_t i = 0; i < m.stages[k].optimizer.size(); ++i) {
        const SavedState& o = m.stages[k].optimizer[i];
        states.emplace(std::make_pair(o.weight, o.state), Entry{k, i});
      }
    }
  }
};

/// What a load writes, all read before anything changes (a refused or damaged checkpoint leaves
/// the pipeline as it was): per stage of the plan held here, each weight's (target, value) and
/// the optimizer state of those it trains.
struct Restored {
  std::vector<std::vector<std::pair<Tensor, Tensor>>> weights;
  std::vector<std::map<std::string, optim::OptimizerState>> states;
};

/// Reads from checkpoint `dir` (manifest `file`) every float32 weight of the stages `pipeline`
/// holds, and the optimizer state of each it trains, from whichever saved stage holds them.
/// Refuses a weight the checkpoint lacks (`Error(kPlan)`), a value of another dtype or shape
/// (`kShape`), and after the first step a trained weight's missing state (`kFormat`).
Restored read_restored(const Pipeline& pipeline, const Manifest& m, const std::string& dir,
                       const std::string& file) {
  const plan::Plan& plan = pipeline.plan();
  const Index index(m);
  optim::OptimizerConfig config;
  config.kind = plan.optimizer;
  const std::vector<std::string> state_names = optim::Optimizer::make(config)->state_names();
  // A `file` entry stays inside the checkpoint: no absolute path, no '..', no symlink, no FIFO
  // or device (which would block or never end), with the rule of external data.
  auto read = [&](const std::string& saved, const std::string& at) {
    return with_context(file + ": field '" + at + ".file' ('" + saved + "')", ErrorKind::kFormat,
                        [&] { return read_npy(resolve_inside_folder(dir, saved)); });
  };
  Restored r;
  r.weights.resize(plan.stages.size());
  r.states.resize(plan.stages.size());
  for (const plan::Stage& stage : plan.stages) {
    if (!pipeline.holds_stage(stage.index)) continue;  // another process restores it
    const auto k = static_cast<size_t>(stage.index);
    for (const auto& [name, target] : pipeline.stage_weights(stage.index)) {
      if (target.dtype != DType::kFloat32) continue;  // constants: training never changes them
      auto found = index.weights.find(name);
      if (found == index.weights.end())
        fail(ErrorKind::kPlan,
             "{}: field 'stages' lacks weight '{}' of the plan (its stage {} holds it; the "
             "checkpoint has {} weights in {} stages)",
             file, name, stage.index, index.weights.size(), m.stages.size());
      const auto [j, i] = found->second;
      const std::string at = fmt::format("stages[{}].weights[{}]", j, i);
      Tensor value = read(m.stages[j].weights[i].file, at);
      if (value.dtype != target.dtype || value.shape != target.shape)
        fail(ErrorKind::kShape, "{}: field '{}' ('{}') is {} but the plan's weight is {}", file, at,
             name, value.describe(), target.describe());
      r.weights[k].emplace_back(target, value);
      // No optimizer step yet, or a weight the optimizer does not update here: no state.
      if (!pipeline.trains(stage.index, name)) continue;
      for (const std::string& state : state_names) {
        auto s = index.states.find({name, state});
        if (s == index.states.end()) {
          if (m.step == 0) continue;
          // Resuming would silently reset the weight's moments.
          fail(ErrorKind::kFormat,
               "{}: field 'stages[{}].optimizer' lacks state '{}' of weight '{}' ({} keeps it; "
               "the checkpoint is at step {})",
               file, j, state, name, to_string(plan.optimizer), m.step);
        }
        const auto [sj, si] = s->second;
        const std::string sat = fmt::format("stages[{}].optimizer[{}]", sj, si);
        // Read once per holder: each stage's state is its own (a shared weight's holders each
        // update theirs).
        Tensor t = read(m.stages[sj].optimizer[si].file, sat);
        if (t.dtype != DType::kFloat32 || t.shape != target.shape)
          fail(ErrorKind::kShape, "{}: field '{}' ('{}' of '{}') is {} but the weight is {}", file,
               sat, state, name, t.describe(), target.describe());
        r.states[k][name].tensors[state] = t;
      }
    }
  }
  return r;
}

/// Refuses a checkpoint weight that no stage of the plan holds (the training it had would be
/// dropped). Only a pipeline that holds every stage can tell; a rank of mpirun sees its own.
void check_all_used(const Pipeline& pipeline, const Manifest& m, const std::string& dir) {
  const plan::Plan& plan = pipeline.plan();
  for (const plan::Stage& stage : plan.stages)
    if (!pipeline.holds_stage(stage.index)) return;
  std::set<std::string> held;
  for (const plan::Stage& stage : plan.stages)
    for (const auto& [name, t] : pipeline.stage_weights(stage.index)) held.insert(name);
  for (size_t k = 0; k < m.stages.size(); ++k)
    for (const SavedWeight& w : m.stages[k].weights)
      if (held.count(w.name) == 0)
        fail(ErrorKind::kPlan,
             "checkpoint {} was written for another plan: its weight '{}' (stages[{}]) is in no "
             "stage of this plan",
             dir, w.name, k);
}

}  // namespace

int64_t load_checkpoint(Pipeline& pipeline, const std::string& dir_in, nlohmann::json* data) {
  const std::string dir = checkpoint_to_load(dir_in);
  const std::string file = (fs::path(dir) / "manifest.json").string();
  const plan::Plan& plan = pipeline.plan();
  if (!plan.training)
    fail(ErrorKind::kUsage, "checkpoint {}: the plan is not a training plan (nothing to resume)",
         dir);
  const Manifest manifest = read_manifest(file);
  // What no plan can change: the model and the optimizer (whose state the checkpoint holds).
  auto other = [&](const std::string& what, const std::string& theirs, const std::string& ours) {
    fail(ErrorKind::kPlan, "checkpoint {} was written for another plan: {} {}, this plan has {}",
         dir, what, theirs, ours);
  };
  if (manifest.model_hash != plan.model_hash)
    other("model hash", manifest.model_hash, plan.model_hash);
  if (manifest.optimizer != to_string(plan.optimizer))
    other("optimizer", manifest.optimizer, std::string(to_string(plan.optimizer)));
  check_all_used(pipeline, manifest, dir);
  Restored restored = read_restored(pipeline, manifest, dir, file);

  for (const plan::Stage& stage : plan.stages) {
    if (!pipeline.holds_stage(stage.index)) continue;
    const auto k = static_cast<size_t>(stage.index);
    for (auto& [target, value] : restored.weights[k])
      std::memcpy(target.data, value.data, static_cast<size_t>(value.bytes()));
    pipeline.optimizer_state(stage.index) = std::move(restored.states[k]);
  }
  // Data parallelism: every replica starts from what the first one restored (the checkpoint
  // holds one copy whatever the replica count; with ZeRO-1 each replica keeps its shard).
  pipeline.copy_first_replica();
  pipeline.set_steps_done(manifest.step);
  // Dynamic loss scaling goes on from the saved scale (a checkpoint without one, of an older
  // stagerun or of an fp32 or mixed plan, leaves the scale the run was given).
  if (manifest.loss_scale && pipeline.scales_loss()) {
    pipeline.loss_scale().scale = manifest.loss_scale->first;
    pipeline.loss_scale().clean_steps = manifest.loss_scale->second;
  }
  if (data) *data = manifest.data;
  return manifest.step;
}

}  // namespace stagecraft::rt
