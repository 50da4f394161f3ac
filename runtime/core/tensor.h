#pragma once
/// \file
/// The runtime's tensor: a dtype, a static shape and a pointer to row-major bytes. The bytes
/// belong to a device's arena, a stage's weights or, for tensors made with `Tensor::owned`, to
/// the tensor itself (shared: copies of a Tensor alias the same bytes).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/format/dtype.h"

namespace stagecraft::rt {

using Shape = std::vector<int64_t>;

/// Product of the dims (1 for a scalar). Throws `Error(kShape)` on a negative dim or overflow.
int64_t shape_numel(const Shape& shape);

/// "[2, 3, 4]".
std::string shape_string(const Shape& shape);

struct Tensor {
  DType dtype = DType::kUndefined;
  Shape shape;
  std::byte* data = nullptr;
  std::shared_ptr<std::byte[]> storage;  ///< Set when the tensor owns its bytes.
  /// For a small integer tensor copied from the host to a device of its own memory (a shape,
  /// axes or split operand: `to_device`), the same bytes on the host, so that a kernel that
  /// needs them on the host reads them here instead of waiting for the device. Set only on
  /// tensors nothing writes after the copy (integer weights and constants).
  std::shared_ptr<const std::byte[]> host_mirror;

  /// A zero-filled tensor that owns its host bytes (64-byte aligned from 64 KiB on). Throws
  /// `Error(kShape)` for a dtype without a fixed size. A device's own tensors, pooled, come from
  /// `DeviceContext::new_tensor` (runtime/core/device.h).
  static Tensor owned(DType dtype, Shape shape);

  /// As `owned`, but the bytes are left as they are (for a kernel's output, which the kernel
  /// overwrites: no pass to zero them first).
  static Tensor uninitialized(DType dtype, Shape shape);

  /// A view of `bytes` (not owned) with this dtype and shape.
  static Tensor view(DType dtype, Shape shape, std::byte* bytes);

  /// A bare tensor: a dtype and a shape, no bytes. The runtime hands a kernel an operand it
  /// reads for its shape alone this way (Program::inputs_read, runtime/format/grad_reads.h).
  static Tensor bare(DType dtype, Shape shape) { return view(dtype, std::move(shape), nullptr); }

  /// Whether this is a bare tensor of some bytes (an empty tensor has none to lack).
  bool is_bare() const { return data == nullptr && bytes() > 0; }

  int64_t numel() const { return shape_numel(shape); }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t bytes() const { return numel() * dtype_size(dtype); }

  template <class T>
  T* as() {
    return reinterpret_cast<T*>(data);
  }
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(data);
  }

  /// "float32[2, 3]".
  std::string describe() const;

 private:
  static Tensor allocate(DType dtype, Shape shape, bool zeroed);
};

/// A deep copy that owns its bytes.
Tensor clone(const Tensor& tensor);

/// Rows [begin, end) of the first axis of `tensor`, as a view of its bytes (no copy).
Tensor slice_rows(const Tensor& tensor, int64_t begin, int64_t end);

/// Concatenates tensors of equal dtype and trailing dims along the first axis into an owned
/// tensor; rank-0 tensors are stacked into a vector.
Tensor concat_rows(const std::vector<Tensor>& parts);

}  // namespace stagecraft::rt
