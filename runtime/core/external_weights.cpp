#include "runtime/core/external_weights.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include "runtime/format/checked.h"
#include "runtime/format/dtype.h"
#include "runtime/format/error.h"
#include "runtime/format/inside_folder.h"

namespace stagecraft::rt {
namespace fs = std::filesystem;

ExternalWeights external_weights_of(const plan::Plan& plan, const plan::Stage& stage,
                                    const std::string& plan_dir) {
  ExternalWeights out;
  out.folder = plan_dir;
  for (const plan::WeightFile& w : plan.weight_files) out.declared.emplace(w.location, w.path);
  out.bytes = stage.weights_bytes;
  out.hash = stage.weights_hash;
  out.field = fmt::format("{}'s stages[{}]", plan::plan_file(plan_dir, "plan.json"),
                          stage.index);
  return out;
}

ExternalWeightReader::ExternalWeightReader(const ExternalWeights* weights, std::string source)
    : weights_(weights), source_(std::move(source)) {}

ExternalWeightReader::~ExternalWeightReader() {
  for (const auto& [path, fd] : fds_) ::close(fd);
}

int ExternalWeightReader::open(const std::string& path) {
  auto it = fds_.find(path);
  if (it != fds_.end()) return it->second;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "{}: cannot open: {}", path, std::strerror(errno));
  fds_.emplace(path, fd);
  return fd;
}

Tensor ExternalWeightReader::read(const onnx::TensorProto& proto) {
  const std::string what = fmt::format("{}: initializer '{}'", source_, proto.name());
  if (weights_ == nullptr)
    fail(ErrorKind::kUnsupported,
         "{} keeps its data in an external file, which only a plan's stage files may do", what);
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& entry : proto.external_data()) {
    int64_t* number = entry.key() == "offset" ? &offset : entry.key() == "length" ? &length : nullptr;
    if (entry.key() == "location") location = entry.value();
    if (number == nullptr) continue;
    const std::string& text = entry.value();
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *number);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || *number < 0)
      fail(ErrorKind::kFormat, "{}: external data '{}' is '{}', not a byte count", what,
           entry.key(), text);
  }
  if (location.empty()) fail(ErrorKind::kFormat, "{}: external data has no 'location'", what);
  std::string path;
  if (auto it = weights_->declared.find(location); it != weights_->declared.end()) {
    path = it->second;
  } else {
    try {
      path = resolve_inside_folder(weights_->folder, location);
    } catch (const Error& e) {
      fail(ErrorKind::kPlan, "{}: external data '{}' is neither in the plan directory nor one of "
           "plan.json's weight_files: {}", what, location, e.message());
    }
  }
  auto dtype = dtype_from_onnx(proto.data_type());
  if (!dtype || dtype_size(*dtype) <= 0)
    fail(ErrorKind::kUnsupported, "{} has element type {}, which the runtime does not handle",
         what, proto.data_type());
  Shape shape(proto.dims().begin(), proto.dims().end());
  const int64_t count = with_context(what, ErrorKind::kFormat, [&] { return shape_numel(shape); });
  const std::optional<int64_t> need = try_mul(count, dtype_size(*dtype));
  if (!need || (length >= 0 && length != *need))
    fail(ErrorKind::kFormat, "{}: external data '{}' has length {} but {}{} needs {} bytes", what,
         location, length, dtype_name(*dtype), shape_string(shape), need ? *need : -1);
  const int fd = open(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(ErrorKind::kIo, "{}: cannot stat: {}", path, std::strerror(errno));
  if (!range_within(offset, *need, static_cast<int64_t>(st.st_size)))
    fail(ErrorKind::kPlan,
         "{}: its window of {} bytes at offset {} of {} lies past the end of the file ({} "
         "bytes): the file was truncated or replaced since the plan was written",
         what, *need, offset, path, static_cast<int64_t>(st.st_size));
  Tensor t = Tensor::uninitialized(*dtype, std::move(shape));
  for (int64_t done = 0; done < *need;) {
    const ssize_t got = ::pread(fd, t.data + done, static_cast<size_t>(*need - done), offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail(ErrorKind::kIo, "{}: cannot read bytes [{}, {}) of {}: {}", what, offset + done,
           offset + *need, path, got < 0 ? std::strerror(errno) : "the file is shorter");
    done += got;
  }
  hasher_.update(t.data, static_cast<size_t>(*need));
  return t;
}

void ExternalWeightReader::finish() {
  if (weights_ == nullptr) return;
  if (hasher_.bytes() == 0 && weights_->bytes == 0 && weights_->hash.empty()) return;
  const std::string actual = hasher_.digest();
  if (hasher_.bytes() == weights_->bytes && actual == weights_->hash) return;
  std::string files;
  for (const auto& [path, fd] : fds_) files += (files.empty() ? "" : ", ") + path;
  fail(ErrorKind::kPlan,
       "{}: its external weights ({} bytes in {}) hash to {} but {} recorded {} bytes hashing to "
       "{}: a weight file changed since the plan was written; re-run stagec",
       source_, hasher_.bytes(), files.empty() ? "no file" : files, actual, weights_->field,
       weights_->bytes, weights_->hash.empty() ? "nothing" : weights_->hash);
}

}  // namespace stagecraft::rt
