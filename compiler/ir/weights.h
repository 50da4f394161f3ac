#pragma once
/// \file
/// Weight bytes. A weight is held once: either the bytes moved out of the parsed ONNX protobuf,
/// or a window into an external data file that is mapped only when someone asks for the bytes
/// (so `--dry-run` planning of a model with hundreds of GiB of weights reads none of them).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

namespace stagecraft::ir {

/// A read-only memory mapping of a file (or of a window of it), unmapped when the last user
/// lets go.
class MappedFile {
 public:
  /// Maps `path` read-only. Throws `Error(kIo)` naming the path when it cannot.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  /// Maps `length` bytes at `offset` of `path` (so one tensor of a 600 GiB weight file costs
  /// only its own pages of address space). Throws `Error(kIo)` when the window is not in the file.
  static std::shared_ptr<const MappedFile> open_window(const std::string& path, int64_t offset, int64_t length);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const std::byte* data_ = nullptr;   ///< The first byte asked for.
  std::size_t size_ = 0;              ///< Bytes asked for.
  void* map_base_ = nullptr;          ///< What mmap returned (page-aligned).
  std::size_t map_length_ = 0;
};

/// Immutable bytes of one initializer.
class WeightData {
 public:
  /// Takes ownership of bytes (moved out of a protobuf `raw_data`, or computed by folding).
  static std::shared_ptr<const WeightData> owned(std::string bytes);

  /// A window of `length` bytes at `offset` in the external file `path`. The caller has
  /// already checked that the window lies inside the file; the file is mapped on first use.
  static std::shared_ptr<const WeightData> external(std::string path, std::string location,
                                                    int64_t offset, int64_t length);

  /// The bytes; maps the external file on first call (thread-safe).
  std::span<const std::byte> bytes() const;

  int64_t size() const { return size_; }
  /// Whether the bytes are a hole of a sparse external file, never written (they read as zeros
  /// without being read: the file system says so): the weight files of dry-run models
  /// (stagecraft-make-samples --no-weight-bytes). False for owned bytes and on any doubt.
  bool unwritten() const;
  bool is_external() const { return !external_path_.empty(); }
  /// Resolved path of the external file ("" when owned).
  const std::string& external_path() const { return external_path_; }
  /// The `location` string as the model wrote it.
  const std::string& external_location() const { return external_location_; }
  int64_t external_offset() const { return offset_; }

 private:
  WeightData() = default;
  std::string owned_;
  std::string external_path_;
  std::string external_location_;
  int64_t offset_ = 0;
  int64_t size_ = 0;
  mutable std::once_flag map_once_;
  mutable std::shared_ptr<const MappedFile> mapping_;
};

}  // namespace stagecraft::ir
