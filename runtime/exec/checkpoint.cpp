#include "runtime/exec/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <onnx/onnx_pb.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "runtime/core/tensor_io.h"
#include "runtime/format/error.h"
#include "runtime/format/inside_folder.h"
#include "runtime/format/json_reader.h"

namespace stagecraft::rt {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormatName = "stagecraft-checkpoint";
constexpr uint64_t kProtobufLimit = (uint64_t{1} << 31) - 1;
constexpr int64_t kMaxStep = int64_t{1} << 53;

/// The stage whose copy of `weight` a checkpoint holds: the lowest holder of a shared weight,
/// `stage` itself for any other.
int saving_stage(const plan::Stage& stage, const std::string& weight) {
  for (const plan::SharedWeight& w : stage.shared_weights)
    if (w.name == weight) return w.stages.front();
  return stage.index;
}

// `dir` without trailing separators ("ckpt/" and "ckpt" name the same checkpoint).
std::string clean(const std::string& dir) {
  std::string out = dir;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), O_RDONLY | (directory ? O_DIRECTORY : 0));
  if (fd < 0) fail(ErrorKind::kIo, "{}: cannot open to sync ({})", path, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) fail(ErrorKind::kIo, "{}: fsync failed ({})", path, std::strerror(err));
}

/// Flushes every file and folder of the file system that holds `folder` (syncfs): one commit for
/// a whole save's files, where an fsync per file cost a journal commit each (an 11 MB
/// checkpoint of a few hundred tensors took 15-19 s on a slow disk).
void sync_file_system(const std::string& folder) {
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail(ErrorKind::kIo, "{}: cannot open to sync ({})", folder, std::strerror(errno));
  int rc = ::syncfs(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) fail(ErrorKind::kIo, "{}: syncfs failed ({})", folder, std::strerror(err));
}

std::string parent_of(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

void rename_or_fail(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) fail(ErrorKind::kIo, "{}: cannot rename to {} ({})", from, to, ec.message());
}

/// A weight and its file in a manifest (`dtype` and `shape` are checked against the file's).
struct SavedWeight {
  std::string name, file;
};

/// One optimizer state tensor of a weight.
struct SavedState {
  std::string weight, state, file;
};

struct SavedStage {
  std::string file_hash;
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

/// Reads `file` (a manifest.json) strictly: every field required, unknown ones refused, each
/// error naming the file and the field.
Manifest read_manifest(const std::string& file) {
  nlohmann::json json = read_json_file(file);
  JsonObject top =
      JsonValue(json, file)
          .object({"format", "version", "model_hash", "plan", "step", "optimizer", "stages",
                   "loss_scale", "data"});
  if (top.string("format") != kFormatName)
    top.fail("format", fmt::format("is not '{}'", kFormatName));
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
    stage.file_hash = f.string("file_hash");
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

/// Removes `DIR.tmp-<pid>` folders left by saves that were killed: those whose process is gone
/// (a live pid may be another run saving to the same place right now, and is left alone).
void remove_stale_saves(const std::string& dir) {
  const std::string prefix = fs::path(dir).filename().string() + ".tmp-";
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(parent_of(dir), ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const std::string digits = name.substr(prefix.size());
    pid_t pid = 0;
    auto [last, err] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (digits.empty() || err != std::errc() || last != digits.data() + digits.size() || pid <= 0)
      continue;
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code ignored;
    if (entry.is_directory(ignored) && !entry.is_symlink(ignored))
      fs::remove_all(entry.path(), ignored);
  }
}

/// Refuses a manifest that leaves out a weight the plan trains, or (after the first step) an
/// optimizer state of one: resuming would silently start that weight from its initial value
/// or reset its moments.
void check_complete(const Pipeline& pipeline, const Manifest& manifest, const std::string& file) {
  optim::OptimizerConfig config;
  config.kind = pipeline.plan().optimizer;
  const std::vector<std::string> state_names = optim::Optimizer::make(config)->state_names();
  for (const plan::Stage& stage : pipeline.plan().stages) {
    if (!pipeline.holds_stage(stage.index)) continue;  // another process's
    const SavedStage& saved = manifest.stages[static_cast<size_t>(stage.index)];
    for (const auto& [name, t] : pipeline.stage_weights(stage.index)) {
      if (t.dtype != DType::kFloat32 || saving_stage(stage, name) != stage.index) continue;
      if (std::none_of(saved.weights.begin(), saved.weights.end(),
                       [&n = name](const SavedWeight& w) { return w.name == n; }))
        fail(ErrorKind::kFormat, "{}: field 'stages[{}].weights' lacks weight '{}' of the plan",
             file, stage.index, name);
      // No optimizer step yet, or a weight the optimizer does not update: no state.
      if (manifest.step == 0 || !pipeline.trains(stage.index, name)) continue;
      for (const std::string& state : state_names)
        if (std::none_of(saved.optimizer.begin(), saved.optimizer.end(),
                         [&n = name, &state](const SavedState& o) {
                           return o.weight == n && o.state == state;
                         }))
          fail(ErrorKind::kFormat,
               "{}: field 'stages[{}].optimizer' lacks state '{}' of weight '{}' ({} keeps it; the "
               "checkpoint is at step {})",
               file, stage.index, state, name, to_string(pipeline.plan().optimizer), manifest.step);
    }
  }
}

}  // namespace

std::string begin_save(const std::string& dir_in, long pid) {
  const std::string dir = clean(dir_in);
  const std::string tmp = fmt::format("{}.tmp-{}", dir, pid);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  remove_stale_saves(dir);
  fs::create_directories(tmp, ec);
  if (ec) fail(ErrorKind::kIo, "{}: cannot create ({})", tmp, ec.message());
  return tmp;
}

nlohmann::ordered_json save_stage(const Pipeline& pipeline, int index,
                                  const std::map<std::string, optim::OptimizerState>& state_of,
                                  const std::string& tmp,
                                  const std::function<void()>& after_file) {
  const plan::Stage& stage = pipeline.plan().stages.at(static_cast<size_t>(index));
  std::error_code ec;
  auto write = [&](const std::string& stage_dir, const std::string& file, const Tensor& t) {
    std::string path = (fs::path(tmp) / stage_dir / file).string();
    write_npy(path, t);  // made durable together, below (sync_file_system)
    if (after_file) after_file();
  };
  std::string stage_dir = fmt::format("stage_{}", stage.index);
  fs::create_directories(fs::path(tmp) / stage_dir, ec);
  if (ec) fail(ErrorKind::kIo, "{}/{}: cannot create ({})", tmp, stage_dir, ec.message());
  nlohmann::ordered_json weights = nlohmann::ordered_json::array(), state = weights;
  int n = 0;
  for (const auto& [name, t] : pipeline.stage_weights(stage.index)) {
    if (t.dtype != DType::kFloat32) continue;  // constants: training never changes them
    if (saving_stage(stage, name) != stage.index) continue;  // saved by its lowest holder
    std::string file = fmt::format("w{:04}.npy", n++);
    write(stage_dir, file, t);
    weights.push_back({{"name", name},
                       {"file", stage_dir + "/" + file},
                       {"dtype", dtype_name(t.dtype)},
                       {"shape", t.shape}});
  }
  n = 0;
  for (const auto& [name, st] : state_of) {
    if (saving_stage(stage, name) != stage.index) continue;
    for (const auto& [key, t] : st.tensors) {
      std::string file = fmt::format("o{:04}.npy", n++);
      write(stage_dir, file, t);
      state.push_back({{"weight", name}, {"state", key}, {"file", stage_dir + "/" + file}});
    }
  }
  // The stage's files and folder on disk before the manifest can name them (a rank of an mpirun
  // save writes only its stages: world.h).
  sync_file_system(tmp);
  return {{"index", stage.index},
          {"file", stage.file},
          {"file_hash", stage.file_hash},
          {"weights", weights},
          {"optimizer", state}};
}

void finish_save(const Pipeline& pipeline, const std::string& dir_in, const std::string& tmp,
                 nlohmann::ordered_json stages, const nlohmann::json& data) {
  const plan::Plan& plan = pipeline.plan();
  const std::string dir = clean(dir_in), old = dir + ".old";
  nlohmann::ordered_json manifest;
  manifest["format"] = kFormatName;
  manifest["version"] = kCheckpointVersion;
  manifest["model_hash"] = plan.model_hash;
  manifest["plan"] = {{"schedule", std::string(to_string(plan.schedule))},
                      {"devices", plan.devices},
                      {"microbatches", plan.microbatches}};
  manifest["step"] = pipeline.steps_done();
  manifest["optimizer"] = std::string(to_string(plan.optimizer));
  manifest["stages"] = std::move(stages);
  if (pipeline.scales_loss())
    manifest["loss_scale"] = {{"scale", pipeline.loss_scale().scale},
                              {"clean_steps", pipeline.loss_scale().clean_steps}};
  if (!data.is_null()) manifest["data"] = data;
  std::string manifest_path = (fs::path(tmp) / "manifest.json").string();
  {
    std::ofstream out(manifest_path, std::ios::binary | std::ios::trunc);
    out << manifest.dump(1) << "\n";
    if (!out.flush()) fail(ErrorKind::kIo, "{}: cannot write", manifest_path);
  }
  sync_file_system(tmp);  // the manifest and the folder, before the rename publishes them
  // Keep the last good checkpoint until the new one is in place.
  std::error_code ec;
  if (fs::exists(dir)) {
    fs::remove_all(old, ec);
    rename_or_fail(dir, old);
  }
  rename_or_fail(tmp, dir);
  fsync_path(parent_of(dir), true);
  fs::remove_all(old, ec);
}

void save_checkpoint(const Pipeline& pipeline, const std::string& dir_in,
                     const SaveOptions& options) {
  const plan::Plan& plan = pipeline.plan();
  const std::string dir = clean(dir_in);
  if (!plan.training)
    fail(ErrorKind::kUsage, "checkpoint {}: the plan is not a training plan (nothing to save)",
         dir);
  std::string tmp;
  int files_written = 0;
  try {
    tmp = begin_save(dir, ::getpid());
    nlohmann::ordered_json stages = nlohmann::ordered_json::array();
    for (const plan::Stage& stage : plan.stages)
      stages.push_back(save_stage(pipeline, stage.index,
                                  pipeline.whole_optimizer_state(stage.index), tmp, [&] {
                                    if (++files_written == options.fail_after_files)
                                      throw Error(ErrorKind::kIo,
                                                  fmt::format("{}: save failed after {} files "
                                                              "(test hook)",
                                                              tmp, files_written));
                                  }));
    finish_save(pipeline, dir, tmp, std::move(stages), options.data);
  } catch (const Error&) {
    std::error_code ec;
    if (options.fail_after_files < 0 && !tmp.empty()) fs::remove_all(tmp, ec);  // a crash would leave it
    throw;
  }
}

std::string checkpoint_to_load(const std::string& dir_in) {
  const std::string dir = clean(dir_in);
  if (fs::exists(fs::path(dir) / "manifest.json")) return dir;
  if (!fs::exists(dir) && fs::exists(fs::path(dir + ".old") / "manifest.json")) return dir + ".old";
  fail(ErrorKind::kIo, "checkpoint {}: no such checkpoint ({}/manifest.json is missing)", dir, dir);
}

int64_t load_checkpoint(Pipeline& pipeline, const std::string& dir_in, nlohmann::json* data) {
  const std::string dir = checkpoint_to_load(dir_in);
  const std::string file = (fs::path(dir) / "manifest.json").string();
  const plan::Plan& plan = pipeline.plan();
  if (!plan.training)
    fail(ErrorKind::kUsage, "checkpoint {}: the plan is not a training plan (nothing to resume)",
         dir);
  const Manifest manifest = read_manifest(file);
  // The plan's identity.
  auto other = [&](const std::string& what, const std::string& theirs, const std::string& ours) {
    fail(ErrorKind::kPlan, "checkpoint {} was written for another plan: {} {}, this plan has {}",
         dir, what, theirs, ours);
  };
  if (manifest.model_hash != plan.model_hash)
    other("model hash", manifest.model_hash, plan.model_hash);
  if (manifest.optimizer != to_string(plan.optimizer))
    other("optimizer", manifest.optimizer, std::string(to_string(plan.optimizer)));
  const std::vector<SavedStage>& stages = manifest.stages;
  if (stages.size() != plan.stages.size())
    other("stage count", std::to_string(stages.size()), std::to_string(plan.stages.size()));
  for (size_t k = 0; k < stages.size(); ++k) {
    if (stages[k].file_hash != plan.stages[k].file_hash)
      other(fmt::format("stage {} file hash", k), stages[k].file_hash, plan.stages[k].file_hash);
  }
  const int64_t step = manifest.step;

  // Read everything first: a damaged checkpoint changes nothing.
  std::vector<std::vector<std::pair<Tensor, Tensor>>> weights(stages.size());  // (target, value)
  std::vector<std::map<std::string, optim::OptimizerState>> states(stages.size());
  // A `file` entry stays inside the checkpoint: no absolute path, no '..', no symlink, no FIFO
  // or device (which would block or never end), with the rule of external data.
  auto read = [&](const std::string& saved, const std::string& at) {
    return with_context(file + ": field '" + at + ".file' ('" + saved + "')", ErrorKind::kFormat,
                        [&] { return read_npy(resolve_inside_folder(dir, saved)); });
  };
  for (size_t k = 0; k < stages.size(); ++k) {
    if (!pipeline.holds_stage(static_cast<int>(k))) continue;  // another process restores it
    const auto& have = pipeline.stage_weights(static_cast<int>(k));
    std::string where = fmt::format("stages[{}]", k);
    for (size_t i = 0; i < stages[k].weights.size(); ++i) {
      const SavedWeight& w = stages[k].weights[i];
      std::string at = fmt::format("{}.weights[{}]", where, i);
      auto it = have.find(w.name);
      if (it == have.end())
        other(fmt::format("stage {} weight", k), "'" + w.name + "'", "no such weight");
      Tensor value = read(w.file, at);
      if (value.dtype != it->second.dtype || value.shape != it->second.shape)
        fail(ErrorKind::kShape, "{}: field '{}' ('{}') is {} but the plan's weight is {}", file, at,
             w.name, value.describe(), it->second.describe());
      weights[k].emplace_back(it->second, value);
    }
    for (size_t i = 0; i < stages[k].optimizer.size(); ++i) {
      const SavedState& o = stages[k].optimizer[i];
      std::string at = fmt::format("{}.optimizer[{}]", where, i);
      auto it = have.find(o.weight);
      if (it == have.end())
        other(fmt::format("stage {} weight", k), "'" + o.weight + "'", "no such weight");
      Tensor value = read(o.file, at);
      if (value.dtype != DType::kFloat32 || value.shape != it->second.shape)
        fail(ErrorKind::kShape, "{}: field '{}' ('{}' of '{}') is {} but the weight is {}", file,
             at, o.state, o.weight, value.describe(), it->second.describe());
      states[k][o.weight].tensors[o.state] = value;
    }
  }
  check_complete(pipeline, manifest, file);
  // Shared weights: every holder gets the lowest holder's weight and optimizer state (a
  // version-1 checkpoint's other copies are replaced by it).
  // (read from the owner's entries, which may be another process's stage).
  for (size_t k = 0; k < stages.size(); ++k) {
    const plan::Stage& stage = plan.stages[k];
    if (!pipeline.holds_stage(stage.index)) continue;
    for (const plan::SharedWeight& w : stage.shared_weights) {
      const int owner = w.stages.front();
      if (owner == stage.index) continue;
      const SavedStage& saved = stages[static_cast<size_t>(owner)];
      auto entry = std::find_if(saved.weights.begin(), saved.weights.end(),
                                [&](const SavedWeight& s) { return s.name == w.name; });
      if (entry == saved.weights.end())
        fail(ErrorKind::kFormat,
             "{}: field 'stages[{}].weights' lacks shared weight '{}' (held by stages {})", file,
             owner, w.name, fmt::join(w.stages, ", "));
      const std::string at =
          fmt::format("stages[{}].weights[{}]", owner, entry - saved.weights.begin());
      Tensor target = pipeline.stage_weights(stage.index).at(w.name);
      Tensor value = read(entry->file, at);
      if (value.dtype != target.dtype || value.shape != target.shape)
        fail(ErrorKind::kShape, "{}: field '{}' ('{}') is {} but the plan's weight is {}", file, at,
             w.name, value.describe(), target.describe());
      std::erase_if(weights[k], [&](const auto& e) { return e.first.data == target.data; });
      weights[k].emplace_back(target, value);
      states[k].erase(w.name);
      for (size_t i = 0; i < saved.optimizer.size(); ++i) {
        const SavedState& o = saved.optimizer[i];
        if (o.weight != w.name) continue;
        Tensor t = read(o.file, fmt::format("stages[{}].optimizer[{}]", owner, i));
        if (t.dtype != DType::kFloat32 || t.shape != target.shape)
          fail(ErrorKind::kShape, "{}: field 'stages[{}].optimizer[{}]' ('{}' of '{}') is {} but "
               "the weight is {}", file, owner, i, o.state, o.weight, t.describe(),
               target.describe());
        states[k][w.name].tensors[o.state] = t;
      }
    }
  }
  for (size_t k = 0; k < stages.size(); ++k) {
    if (!pipeline.holds_stage(static_cast<int>(k))) continue;
    for (auto& [target, value] : weights[k])
      std::memcpy(target.data, value.data, static_cast<size_t>(value.bytes()));
    pipeline.optimizer_state(static_cast<int>(k)) = std::move(states[k]);
  }
  // Data parallelism: every replica starts from what the first one restored (the checkpoint
  // holds one copy whatever the replica count, so a run may resume with another).
  pipeline.copy_first_replica();
  pipeline.set_steps_done(step);
  // Dynamic loss scaling goes on from the saved scale (a checkpoint without one, of an older
  // stagerun, leaves the scale the run was given).
  if (manifest.loss_scale && pipeline.scales_loss()) {
    pipeline.loss_scale().scale = manifest.loss_scale->first;
    pipeline.loss_scale().clean_steps = manifest.loss_scale->second;
  }
  if (data) *data = manifest.data;
  return step;
}

namespace {

/// A tensor's bytes as a protobuf `raw_data` string (a copy).
std::string raw_bytes(const Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data), static_cast<size_t>(t.bytes()));
}

/// An external-data entry's value ("" when absent).
std::string external_entry(const onnx::TensorProto& t, const std::string& key) {
  for (const auto& kv : t.external_data())
    if (kv.key() == key) return kv.value();
  return "";
}

/// Appends to an export's data file, 64-byte aligned, one tensor at a time.
class ExportData {
 public:
  explicit ExportData(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(ErrorKind::kIo, "--export: cannot create {}: {}", path_, std::strerror(errno));
  }
  ~ExportData() {
    if (fd_ >= 0) ::close(fd_);
  }
  ExportData(const ExportData&) = delete;
  ExportData& operator=(const ExportData&) = delete;

  /// Pads to the next tensor's offset and returns it.
  int64_t align() {
    static constexpr char kZeros[64] = {};
    write(kZeros, (64 - at_ % 64) % 64);
    return at_;
  }

  void write(const void* data, int64_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t done = ::write(fd_, p, static_cast<size_t>(std::min<int64_t>(n, 1 << 24)));
      if (done < 0 && errno == EINTR) continue;
      if (done <= 0)
        fail(ErrorKind::kIo, "--export: cannot write {} ({})", path_,
             done < 0 ? std::strerror(errno) : "disk full?");
      p += done;
      n -= done;
      at_ += done;
    }
  }

  /// Copies `length` bytes at `offset` of `from` (the model's own data file), 16 MiB at a time.
  void copy_from(const std::string& from, int64_t offset, int64_t length, const std::string& what) {
    const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) fail(ErrorKind::kIo, "{}: cannot open {} ({})", what, from, std::strerror(errno));
    std::vector<char> buffer(static_cast<size_t>(std::min<int64_t>(length, 1 << 24)));
    for (int64_t done = 0; done < length;) {
      const ssize_t got = ::pread(in, buffer.data(),
                                  static_cast<size_t>(std::min<int64_t>(length - done, 1 << 24)),
                                  offset + done);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ::close(in);
        fail(ErrorKind::kIo, "{}: {} is shorter than offset {} + length {}", what, from, offset,
             length);
      }
      write(buffer.data(), got);
      done += got;
    }
    ::close(in);
  }

  void finish() {
    if (::fsync(fd_) != 0) fail(ErrorKind::kIo, "--export: {}: fsync failed", path_);
    ::close(fd_);
    fd_ = -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t at_ = 0;
};

/// A model that keeps its weights in external data is exported the same way: every initializer
/// of over 1 KiB goes to `data_tmp` (named `location` in the model), its trained value where
/// the plan trained it, else the model's own bytes streamed from its data file; nothing holds
/// more than one tensor. Returns how many trained values it wrote.
int write_external_initializers(onnx::GraphProto* graph, const std::map<std::string, Tensor>& trained,
                                const std::string& model, const std::string& data_tmp,
                                const std::string& location) {
  ExportData data(data_tmp);
  int replaced = 0;
  const std::string base = fs::path(model).parent_path().string();
  for (onnx::TensorProto& t : *graph->mutable_initializer()) {
    const std::string what = fmt::format("--export: {}: initializer '{}'", model, t.name());
    auto it = trained.find(t.name());
    const bool use_trained = it != trained.end() && t.data_type() == onnx::TensorProto::FLOAT &&
                             Shape(t.dims().begin(), t.dims().end()) == it->second.shape;
    const bool external = t.data_location() == onnx::TensorProto::EXTERNAL;
    const int64_t bytes = use_trained ? it->second.bytes()
                          : external  ? -1
                                      : static_cast<int64_t>(t.raw_data().size());
    if (!external && bytes <= 1024) {  // small: stays in the model file
      if (use_trained) {
        t.clear_float_data();
        t.set_raw_data(raw_bytes(it->second));
        ++replaced;
      }
      continue;
    }
    const int64_t offset = data.align();
    int64_t length = bytes;
    if (use_trained) {
      data.write(it->second.data, bytes);
      ++replaced;
    } else if (external) {
      const std::string from =
          with_context(what, ErrorKind::kFormat,
                       [&] { return resolve_inside_folder(base, external_entry(t, "location")); });
      const std::string off = external_entry(t, "offset"), len = external_entry(t, "length");
      const int64_t at = off.empty() ? 0 : std::stoll(off);
      length = len.empty() ? static_cast<int64_t>(fs::file_size(from)) - at : std::stoll(len);
      data.copy_from(from, at, length, what);
    } else {
      data.write(t.raw_data().data(), bytes);
    }
    t.clear_raw_data();
    t.clear_float_data();
    t.clear_external_data();
    t.set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto& [key, value] : {std::pair<std::string, std::string>{"location", location},
                                     {"offset", std::to_string(offset)},
                                     {"length", std::to_string(length)}}) {
      auto* e = t.add_external_data();
      e->set_key(key);
      e->set_value(value);
    }
  }
  data.finish();
  return replaced;
}

/// Writes `proto` to `out_path` with its weights in `out_path`.data (write_external_initializers),
/// each through a temporary file renamed into place.
int write_external_export(onnx::ModelProto& proto, const std::map<std::string, Tensor>& trained,
                          const std::string& model, const std::string& out_path) {
  const std::string location = fs::path(out_path).filename().string() + ".data";
  const std::string data_path = out_path + ".data";
  const std::string data_tmp = fmt::format("{}.tmp-{}", data_path, ::getpid());
  const std::string tmp = fmt::format("{}.tmp-{}", out_path, ::getpid());
  int replaced = 0;
  try {
    replaced = write_external_initializers(proto.mutable_graph(), trained, model, data_tmp, location);
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !proto.SerializeToOstream(&out) || !out.flush())
      fail(ErrorKind::kIo, "--export {}: write failed (disk full?)", out_path);
  } catch (...) {
    std::error_code ec;
    fs::remove(data_tmp, ec);
    fs::remove(tmp, ec);
    throw;
  }
  fsync_path(tmp, false);
  rename_or_fail(data_tmp, data_path);
  rename_or_fail(tmp, out_path);
  fsync_path(parent_of(out_path), true);
  return replaced;
}

}  // namespace

int export_model(const Pipeline& pipeline, const std::string& out_path) {
  const plan::Plan& plan = pipeline.plan();
  const std::string& model = plan.model_path;
  if (model.empty() || !fs::exists(model))
    fail(ErrorKind::kIo, "--export: the plan's model_path {} is missing",
         model.empty() ? "''" : model);
  std::string hash = plan::file_hash(model);
  if (hash != plan.model_hash)
    fail(ErrorKind::kPlan,
         "--export: {} hashes to {} but plan.json's model_hash is {} (the model changed)", model,
         hash, plan.model_hash);
  onnx::ModelProto proto;
  {
    std::ifstream in(model, std::ios::binary);
    if (!in || !proto.ParseFromIstream(&in))
      fail(ErrorKind::kFormat, "--export: {} is not an ONNX model", model);
  }
  // The trained values by name (a shared weight: the lowest holder's; its copies are equal).
  std::map<std::string, Tensor> trained;
  for (const plan::Stage& stage : plan.stages)
    for (const auto& [name, t] : pipeline.stage_weights(stage.index))
      if (t.dtype == DType::kFloat32) trained.emplace(name, t);

  onnx::GraphProto* graph = proto.mutable_graph();
  // Weights the exporter had merged into equal ones (an Identity copying an initializer under
  // the duplicate's name), which the plan trained apart: each becomes an initializer of its own
  // with its trained values, and its Identity goes, so every PyTorch parameter name is there.
  int untied = 0;
  {
    std::set<std::string> initializers;
    for (const onnx::TensorProto& t : graph->initializer()) initializers.insert(t.name());
    auto* nodes = graph->mutable_node();
    for (int i = nodes->size() - 1; i >= 0; --i) {
      const onnx::NodeProto& n = nodes->Get(i);
      if (n.op_type() != "Identity" || n.input_size() != 1 || n.output_size() != 1 ||
          initializers.count(n.input(0)) == 0 || initializers.count(n.output(0)) != 0)
        continue;
      auto it = trained.find(n.output(0));
      if (it == trained.end()) continue;
      onnx::TensorProto* t = graph->add_initializer();
      t->set_name(n.output(0));
      t->set_data_type(onnx::TensorProto::FLOAT);
      for (int64_t d : it->second.shape) t->add_dims(d);
      t->set_raw_data(raw_bytes(it->second));
      nodes->DeleteSubrange(i, 1);
      ++untied;
    }
  }

  // A model with external data is exported with external data (OUT.data beside OUT), streamed.
  if (std::any_of(graph->initializer().begin(), graph->initializer().end(),
                  [](const onnx::TensorProto& t) {
                    return t.data_location() == onnx::TensorProto::EXTERNAL;
                  }))
    return write_external_export(proto, trained, model, out_path) + untied;

  // Inline weights: embedded as the model had them, unless that passes protobuf's 2 GiB.
  if (proto.ByteSizeLong() > kProtobufLimit)
    return write_external_export(proto, trained, model, out_path) + untied;
  int replaced = 0;
  for (onnx::TensorProto& t : *graph->mutable_initializer()) {
    auto it = trained.find(t.name());
    if (it == trained.end() || t.data_type() != onnx::TensorProto::FLOAT ||
        Shape(t.dims().begin(), t.dims().end()) != it->second.shape)
      continue;
    t.clear_float_data();
    t.set_raw_data(raw_bytes(it->second));
    ++replaced;
  }

  std::string tmp = fmt::format("{}.tmp-{}", out_path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(ErrorKind::kIo, "--export {}: cannot write {}", out_path, tmp);
    if (!proto.SerializeToOstream(&out) || !out.flush()) {
      out.close();
      std::error_code ec;
      fs::remove(tmp, ec);
      fail(ErrorKind::kIo, "--export {}: write failed (disk full?)", out_path);
    }
  }
  fsync_path(tmp, false);
  rename_or_fail(tmp, out_path);
  fsync_path(parent_of(out_path), true);
  return replaced + untied;
}

}  // namespace stagecraft::rt
