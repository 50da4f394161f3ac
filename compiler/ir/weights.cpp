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
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail(ErrorKind::kIo, "{}: cannot stat: {}", path, std::strerror(err));
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<std::size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail(ErrorKind::kIo, "{}: cannot map {} bytes: {}", path, file->size_, std::strerror(err));
    }
    file->data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
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
  std::call_once(map_once_, [this] { mapping_ = MappedFile::open(external_path_); });
  if (static_cast<uint64_t>(offset_) + static_cast<uint64_t>(size_) > mapping_->size()) {
    fail(ErrorKind::kFormat, "{}: external data window [{}, {}) lies past the end of the file ({} bytes)",
         external_path_, offset_, offset_ + size_, mapping_->size());
  }
  return {mapping_->data() + offset_, static_cast<std::size_t>(size_)};
}

}  // namespace stagecraft::ir
