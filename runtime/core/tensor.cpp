#include "runtime/core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>

#include "runtime/format/checked.h"
#include "runtime/format/error.h"

namespace stagecraft::rt {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(ErrorKind::kShape, "shape {} has a negative dim", shape_string(shape));
    if (d != 0 && n > INT64_MAX / d)
      fail(ErrorKind::kShape, "shape {} overflows int64", shape_string(shape));
    n *= d;
  }
  return n;
}

std::string shape_string(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

namespace {
constexpr size_t kAlign = 64;              // bytes of a big tensor's alignment (cache lines, SIMD)
constexpr size_t kAlignedBytes = 1 << 16;  // tensors from this size on are aligned
}  // namespace

Tensor Tensor::owned(DType dtype, Shape shape) { return allocate(dtype, std::move(shape), true); }

Tensor Tensor::uninitialized(DType dtype, Shape shape) {
  return allocate(dtype, std::move(shape), false);
}

Tensor Tensor::allocate(DType dtype, Shape shape, bool zeroed) {
  int64_t size = dtype_size(dtype);
  if (size <= 0) fail(ErrorKind::kShape, "cannot allocate a tensor of dtype {}", dtype_name(dtype));
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  // A hostile header can claim any dims: numel x size is checked, and so is the rounding up.
  const std::optional<int64_t> checked = try_mul(t.numel(), size);
  if (!checked || *checked > INT64_MAX - static_cast<int64_t>(kAlign))
    fail(ErrorKind::kShape, "a tensor of {}{} would hold more than 2^63 bytes", dtype_name(dtype),
         shape_string(t.shape));
  const int64_t bytes = *checked;
  if (static_cast<size_t>(bytes) >= kAlignedBytes) {
    size_t size = (static_cast<size_t>(bytes) + kAlign - 1) / kAlign * kAlign;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlign, size));
    if (!p) {
      fail(ErrorKind::kMemory, "out of memory: a tensor of {}{} needs {} bytes ({:.2f} GiB)",
           dtype_name(dtype), shape_string(t.shape), size, static_cast<double>(size) / (1 << 30));
    }
    if (zeroed) std::memset(p, 0, size);
    t.storage = std::shared_ptr<std::byte[]>(p, [](std::byte* q) { std::free(q); });
  } else {
    // make_shared<T[]> value-initialises: the bytes start at zero.
    const auto n = static_cast<size_t>(bytes > 0 ? bytes : 1);
    t.storage =
        zeroed ? std::make_shared<std::byte[]>(n) : std::make_shared_for_overwrite<std::byte[]>(n);
  }
  t.data = t.storage.get();
  return t;
}

Tensor Tensor::view(DType dtype, Shape shape, std::byte* bytes) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = bytes;
  return t;
}

std::string Tensor::describe() const {
  return fmt::format("{}{}", dtype_name(dtype), shape_string(shape));
}

Tensor clone(const Tensor& tensor) {
  Tensor copy = Tensor::owned(tensor.dtype, tensor.shape);
  if (tensor.bytes() > 0) std::memcpy(copy.data, tensor.data, static_cast<size_t>(tensor.bytes()));
  return copy;
}

Tensor slice_rows(const Tensor& tensor, int64_t begin, int64_t end) {
  if (tensor.shape.empty()) fail(ErrorKind::kShape, "cannot cut rows of a scalar");
  if (begin < 0 || end < begin || end > tensor.shape[0])
    fail(ErrorKind::kShape, "rows [{}, {}) are outside a tensor of shape {}", begin, end,
         shape_string(tensor.shape));
  Shape shape = tensor.shape;
  shape[0] = end - begin;
  int64_t row_bytes = tensor.shape[0] == 0 ? 0 : tensor.bytes() / tensor.shape[0];
  Tensor out = Tensor::view(tensor.dtype, std::move(shape), tensor.data + begin * row_bytes);
  out.storage = tensor.storage;  // keeps the parent's bytes alive
  return out;
}

Tensor concat_rows(const std::vector<Tensor>& parts) {
  if (parts.empty()) fail(ErrorKind::kInternal, "concat_rows of nothing");
  const Tensor& first = parts.front();
  Shape shape = first.shape;
  if (shape.empty()) {
    shape = {static_cast<int64_t>(parts.size())};
  } else {
    shape[0] = 0;
    for (const Tensor& p : parts) {
      if (p.dtype != first.dtype || p.rank() != first.rank() ||
          !std::equal(p.shape.begin() + 1, p.shape.end(), first.shape.begin() + 1))
        fail(ErrorKind::kShape, "cannot join {} and {} along the first axis", first.describe(),
             p.describe());
      shape[0] += p.shape[0];
    }
  }
  Tensor out = Tensor::owned(first.dtype, shape);
  std::byte* cursor = out.data;
  for (const Tensor& p : parts) {
    if (p.bytes() > 0) std::memcpy(cursor, p.data, static_cast<size_t>(p.bytes()));
    cursor += p.bytes();
  }
  return out;
}

}  // namespace stagecraft::rt
