#include "runtime/mpi/wire.h"

#include <cstring>

#include "runtime/format/error.h"

namespace stagecraft::rt::mpi {

namespace {

// Bounds on what a header may claim, so a corrupt one fails here and not in an allocation.
constexpr int64_t kMaxRank = 16;
constexpr int64_t kMaxString = 1 << 20;

}  // namespace

void WireWriter::raw(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  bytes_.insert(bytes_.end(), p, p + size);
}

void WireWriter::i64(int64_t value) { raw(&value, sizeof value); }

void WireWriter::f64(double value) { raw(&value, sizeof value); }

void WireWriter::str(const std::string& text) {
  i64(static_cast<int64_t>(text.size()));
  raw(text.data(), text.size());
}

void WireWriter::tensor_header(const std::string& name, const Tensor& tensor) {
  str(name);
  i64(static_cast<int64_t>(tensor.dtype));
  i64(static_cast<int64_t>(tensor.shape.size()));
  for (int64_t d : tensor.shape) i64(d);
}

void WireWriter::tensor(const std::string& name, const Tensor& tensor) {
  tensor_header(name, tensor);
  raw(tensor.data, static_cast<size_t>(tensor.bytes()));
}

WireReader::WireReader(const std::vector<char>& bytes, std::string what)
    : bytes_(bytes), what_(std::move(what)) {}

void WireReader::raw(void* data, size_t size) {
  if (size > bytes_.size() - at_)
    fail(ErrorKind::kFormat, "{}: {} bytes wanted at offset {} of {}", what_, size, at_,
         bytes_.size());
  if (size > 0) std::memcpy(data, bytes_.data() + at_, size);
  at_ += size;
}

int64_t WireReader::i64() {
  int64_t value = 0;
  raw(&value, sizeof value);
  return value;
}

double WireReader::f64() {
  double value = 0;
  raw(&value, sizeof value);
  return value;
}

std::string WireReader::str() {
  int64_t size = i64();
  if (size < 0 || size > kMaxString)
    fail(ErrorKind::kFormat, "{}: a string of {} bytes at offset {}", what_, size, at_);
  std::string text(static_cast<size_t>(size), '\0');
  raw(text.data(), text.size());
  return text;
}

NamedTensor WireReader::tensor_header() {
  NamedTensor t;
  t.name = str();
  int64_t dtype = i64(), rank = i64();
  if (dtype_size(static_cast<DType>(dtype)) <= 0 || rank < 0 || rank > kMaxRank)
    fail(ErrorKind::kFormat, "{}: tensor '{}' has dtype {} and rank {}", what_, t.name, dtype,
         rank);
  Shape shape;
  for (int64_t k = 0; k < rank; ++k) {
    shape.push_back(i64());
    if (shape.back() < 0)
      fail(ErrorKind::kFormat, "{}: tensor '{}' has dimension {}", what_, t.name, shape.back());
  }
  t.tensor = Tensor::uninitialized(static_cast<DType>(dtype), shape);
  return t;
}

NamedTensor WireReader::tensor() {
  NamedTensor t = tensor_header();
  raw(t.tensor.data, static_cast<size_t>(t.tensor.bytes()));
  return t;
}

std::vector<char> message_header(const Message& message) {
  WireWriter w;
  w.i64(message.microbatch);
  w.i64(static_cast<int64_t>(message.tensors.size()));
  for (const NamedTensor& t : message.tensors) w.tensor_header(t.name, t.tensor);
  return w.take();
}

Message message_from_header(const std::vector<char>& header, const std::string& what) {
  WireReader r(header, what);
  Message m;
  m.microbatch = static_cast<int>(r.i64());
  int64_t count = r.i64();
  if (count < 0 || count > static_cast<int64_t>(header.size()))
    fail(ErrorKind::kFormat, "{}: a message of {} tensors", what, count);
  for (int64_t k = 0; k < count; ++k) m.tensors.push_back(r.tensor_header());
  if (!r.done()) fail(ErrorKind::kFormat, "{}: bytes left after {} tensors", what, count);
  return m;
}

}  // namespace stagecraft::rt::mpi
