#include "compiler/ir/weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/format/error.h"

namespace stagecraft::ir {

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(ErrorKind::kIo, "{}: cannot stat: {}", path, std::strerror(errno));
  return open_window(path, 0, static_cast<int64_t>(st.st_size));
}

std::shared_ptr<const MappedFile> MappedFile::open_window(const std::string& path, int64_t offset, int64_t length) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail(ErrorKind::kIo, "{}: cannot stat: {}", path, std::strerror(err));
  }
  if (offset < 0 || length < 0 || offset > st.st_size || length > st.st_size - offset) {
    ::close(fd);
    fail(ErrorKind::kIo, "{}: window [{}, {}) lies outside the file ({} bytes)", path, offset, offset + length,
         static_cast<int64_t>(st.st_size));
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<std::size_t>(length);
  if (length > 0) {
    const auto page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
    int64_t aligned = offset / page * page;
    file->map_length_ = static_cast<std::size_t>(length + (offset - aligned));
    void* p = ::mmap(nullptr, file->map_length_, PROT_READ, MAP_PRIVATE, fd, aligned);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail(ErrorKind::kIo, "{}: cannot map {} bytes at offset {}: {}", path, length, offset, std::strerror(err));
    }
    file->map_base_ = p;
    file->data_ = static_cast<const std::byte*>(p) + (offset - aligned);
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (map_base_ != nullptr) ::munmap(map_base_, map_length_);
}

std::shared_ptr<const WeightData> WeightData::owned(std::string bytes) {
  std::shared_ptr<WeightData> w(new WeightData());
  w->size_ = static_cast<int64_t>(bytes.size());
  w->owned_ = std::move(bytes);
  return w;
}

std::shared_ptr<const WeightData> WeightData::external(std::string path, std::string location,
                                                       int64_t offset, int64_t length) {
  std::shared_ptr<WeightData> w(new WeightData());
  w->external_path_ = std::move(path);
  w->external_location_ = std::move(location);
  w->offset_ = offset;
  w->size_ = length;
  return w;
}

std::span<const std::byte> WeightData::bytes() const {
  if (!is_external()) {
    return {reinterpret_cast<const std::byte*>(owned_.data()), owned_.size()};
  }
  std::call_once(map_once_, [this] { mapping_ = MappedFile::open_window(external_path_, offset_, size_); });
  return {mapping_->data(), mapping_->size()};
}

bool WeightData::unwritten() const {
  if (!is_external() || size_ == 0) return false;
  const int fd = ::open(external_path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // bytes() will say why
  // The first byte of data at or after the window's start; ENXIO: none to the end of the file.
  const off_t data = ::lseek(fd, static_cast<off_t>(offset_), SEEK_DATA);
  const int error = errno;
  ::close(fd);
  if (data < 0) return error == ENXIO;
  return data >= static_cast<off_t>(offset_ + size_);
}

}  // namespace stagecraft::ir
