#pragma once
/// \file
/// The bytes the ranks of an `mpirun` exchange besides tensor data: a message's header (its
/// microbatch and, per tensor, the name, dtype and shape; the data follows in messages of its
/// own) and the reports gathered to rank 0. Plain C++ (no MPI), so it is tested on its own.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/exec/transport.h"

namespace stagecraft::rt::mpi {

/// Appends fixed-size numbers (native byte order: the ranks of one launch share a machine type)
/// and length-prefixed strings.
class WireWriter {
 public:
  void i64(int64_t value);
  void f64(double value);
  void str(const std::string& text);
  /// A tensor's name, dtype and shape (not its data).
  void tensor_header(const std::string& name, const Tensor& tensor);
  /// A tensor's header and then its bytes.
  void tensor(const std::string& name, const Tensor& tensor);
  const std::vector<char>& bytes() const { return bytes_; }
  std::vector<char> take() { return std::move(bytes_); }

 private:
  void raw(const void* data, size_t size);
  std::vector<char> bytes_;
};

/// Reads what a `WireWriter` wrote. A read past the end or a field out of range is
/// `Error(kFormat)` naming `what` (the message: "link 0 -> 1 (activations)") and the offset.
class WireReader {
 public:
  WireReader(const std::vector<char>& bytes, std::string what);
  int64_t i64();
  double f64();
  std::string str();
  /// A tensor header: the name, and a tensor of that dtype and shape owning uninitialised bytes
  /// (for the data to be received into).
  NamedTensor tensor_header();
  /// A header and its bytes, as `WireWriter::tensor` wrote them.
  NamedTensor tensor();
  bool done() const { return at_ == bytes_.size(); }

 private:
  void raw(void* data, size_t size);
  const std::vector<char>& bytes_;
  std::string what_;
  size_t at_ = 0;
};

/// A message's header: its microbatch and each tensor's name, dtype and shape.
std::vector<char> message_header(const Message& message);
/// The message a header describes, its tensors allocated and not yet filled.
Message message_from_header(const std::vector<char>& header, const std::string& what);

}  // namespace stagecraft::rt::mpi
