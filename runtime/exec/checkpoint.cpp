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

namespace stagecraft::rt {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kProtobufLimit = (uint64_t{1} << 31) - 1;

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
  manifest["format"] = kCheckpointFormat;
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
