#include "compiler/plan/stage_weights.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "runtime/format/error.h"

namespace stagecraft::plan {
namespace fs = std::filesystem;
namespace {

/// Bytes read from a model's external data per call: what planning holds at most at once.
constexpr int64_t kChunk = int64_t{4} << 20;

/// An open file descriptor, closed when it goes.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

void write_all(int fd, const std::byte* data, int64_t n, const fs::path& path) {
  while (n > 0) {
    const ssize_t done = ::write(fd, data, static_cast<size_t>(std::min<int64_t>(n, kChunk)));
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0)
      fail(ErrorKind::kIo, "{}: cannot write {} bytes: {}", path.string(), n,
           done < 0 ? std::strerror(errno) : "no progress (disk full?)");
    data += done;
    n -= done;
  }
}

/// Streams the model's external bytes and the stage's own weights file.
class Placer {
 public:
  /// `progress` is told the bytes this stage has placed, each GiB.
  Placer(const fs::path& weights_file, std::function<void(int64_t)> progress)
      : weights_file_(weights_file), progress_(std::move(progress)) {}

  /// Feeds the `length` bytes at `offset` of `path` to the hash (and, with `copy`, to the
  /// stage's weights file), `kChunk` at a time.
  void stream(const std::string& path, int64_t offset, int64_t length, bool copy,
              const std::string& tensor) {
    int fd = source(path);
    buffer_.resize(static_cast<size_t>(std::min(length, kChunk)));
    for (int64_t done = 0; done < length;) {
      const int64_t want = std::min(length - done, kChunk);
      const ssize_t got = ::pread(fd, buffer_.data(), static_cast<size_t>(want), offset + done);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        fail(ErrorKind::kIo, "{}: initializer '{}': cannot read bytes [{}, {}): {}", path, tensor,
             offset + done, offset + length, got < 0 ? std::strerror(errno) : "the file is shorter");
      take(buffer_.data(), got, copy);
      done += got;
    }
  }

  void take(const std::byte* data, int64_t n, bool copy) {
    hasher_.update(data, static_cast<size_t>(n));
    if (copy) {
      write_all(out(), data, n, weights_file_);
      written_ += n;
    }
    placed_ += n;
    if (progress_ && placed_ - reported_ >= (int64_t{1} << 30)) {
      reported_ = placed_;
      progress_(placed_);
    }
  }

  /// Pads the weights file to the next multiple of kWeightAlignment; returns that offset.
  int64_t align() {
    static constexpr std::byte kZeros[kWeightAlignment] = {};
    const int64_t pad = (kWeightAlignment - written_ % kWeightAlignment) % kWeightAlignment;
    if (pad > 0) {
      write_all(out(), kZeros, pad, weights_file_);
      written_ += pad;
    }
    return written_;
  }

  std::string digest() const { return hasher_.digest(); }
  int64_t hashed() const { return hasher_.bytes(); }

  void close() {
    if (out_.get() >= 0 && ::fsync(out_.get()) != 0)
      fail(ErrorKind::kIo, "{}: cannot flush: {}", weights_file_.string(), std::strerror(errno));
    out_ = Fd();
  }

 private:
  int out() {
    if (out_.get() < 0) {
      out_ = Fd(::open(weights_file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (out_.get() < 0)
        fail(ErrorKind::kIo, "{}: cannot create: {}", weights_file_.string(), std::strerror(errno));
    }
    return out_.get();
  }

  int source(const std::string& path) {
    auto it = sources_.find(path);
    if (it != sources_.end()) return it->second.get();
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) fail(ErrorKind::kIo, "{}: cannot open: {}", path, std::strerror(errno));
    return sources_.emplace(path, std::move(fd)).first->second.get();
  }

  fs::path weights_file_;
  std::function<void(int64_t)> progress_;
  WeightsHasher hasher_;
  Fd out_;
  std::map<std::string, Fd> sources_;
  std::vector<std::byte> buffer_;
  int64_t written_ = 0, placed_ = 0, reported_ = 0;
};

void set_external(onnx::TensorProto& t, const std::string& location, int64_t offset,
                  int64_t length) {
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* key, const std::string& value) {
    auto* e = t.add_external_data();
    e->set_key(key);
    e->set_value(value);
  };
  add("location", location);
  add("offset", std::to_string(offset));
  add("length", std::to_string(length));
}

/// The entry of `weight_files` for the model's external file `w` (added on first use).
const WeightFile& weight_file_of(const ir::WeightData& w, std::vector<WeightFile>& weight_files) {
  const std::string path = fs::absolute(w.external_path()).lexically_normal().string();
  for (const WeightFile& f : weight_files)
    if (f.path == path) return f;
  std::string location =
      "model_weights/" + fs::path(w.external_location()).lexically_normal().generic_string();
  // Two model locations that normalise alike but name different files stay apart.
  for (int k = 2; std::any_of(weight_files.begin(), weight_files.end(),
                              [&](const WeightFile& f) { return f.location == location; });
       ++k)
    location = fmt::format("model_weights/{}-{}", k, fs::path(w.external_location()).filename().string());
  std::error_code ec;
  const auto bytes = static_cast<int64_t>(fs::file_size(path, ec));
  if (ec) fail(ErrorKind::kIo, "{}: cannot read its size: {}", path, ec.message());
  weight_files.push_back(WeightFile{location, path, bytes});
  return weight_files.back();
}

}  // namespace

void place_stage_weights(onnx::ModelProto& model, const ir::Graph& graph, const fs::path& folder,
                         Stage& stage, std::vector<WeightFile>& weight_files,
                         const WeightWriting& writing, int64_t placed_before, int stages) {
  const std::string own = fs::path(stage.file).stem().string() + ".weights";
  std::function<void(int64_t)> progress;
  if (writing.progress)
    progress = [&](int64_t placed) { writing.progress(placed_before + placed, stage.index, stages); };
  Placer placer(folder / own, progress);
  for (onnx::TensorProto& t : *model.mutable_graph()->mutable_initializer()) {
    const std::optional<ir::ValueId> id = graph.find_value(t.name());
    if (!id || !graph.value(*id).is_initializer())
      fail(ErrorKind::kInternal, "stage {}: initializer '{}' is not one of the model's", stage.index,
           t.name());
    const ir::WeightData& w = *graph.value(*id).initializer;
    if (w.is_external() && !writing.copy) {
      const WeightFile& file = weight_file_of(w, weight_files);
      set_external(t, file.location, w.external_offset(), w.size());
      placer.stream(w.external_path(), w.external_offset(), w.size(), false, t.name());
    } else if (w.size() <= kEmbeddedWeightBytes) {
      const auto bytes = w.bytes();
      t.set_raw_data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    } else {
      const int64_t offset = placer.align();
      set_external(t, own, offset, w.size());
      if (w.is_external()) {
        placer.stream(w.external_path(), w.external_offset(), w.size(), true, t.name());
      } else {
        const auto bytes = w.bytes();
        placer.take(bytes.data(), static_cast<int64_t>(bytes.size()), true);
      }
    }
  }
  placer.close();
  stage.weights_bytes = placer.hashed();
  stage.weights_hash = placer.hashed() > 0 ? placer.digest() : std::string();
}

}  // namespace stagecraft::plan
