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

  /// A zero-filled tensor that owns its bytes. Throws `Error(kShape)` for a dtype without a
  /// fixed size.
  static Tensor owned(DType dtype, Shape shape);

  /// As `owned`, but the bytes are left as they are (for a kernel's output, which the kernel
  /// overwrites: no pass to zero them first).
  static Tensor uninitialized(DType dtype, Shape shape);

  /// A view of `bytes` (not owned) with this dtype and shape.
  static Tensor view(DType dtype, Shape shape, std::byte* bytes);

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

/// Owned tensors of at least `kPooledBytes` come from a process-wide pool of freed buffers kept
/// by exact size: a training step allocates the same activations and gradients every step, and
/// reusing their pages instead of returning them to the system saves the page faults of fresh
/// memory (measured: more than half of a ResNet-50 training step on CPU). The pool holds only
/// buffers no tensor uses; `release_pooled_buffers` returns them to the system.
inline constexpr size_t kPooledBytes = size_t{1} << 16;

/// Bytes the pool holds for reuse now (no tensor uses them).
size_t pooled_bytes();

/// Frees every buffer the pool holds.
void release_pooled_buffers();

/// A deep copy that owns its bytes.
Tensor clone(const Tensor& tensor);

/// Rows [begin, end) of the first axis of `tensor`, as a view of its bytes (no copy).
Tensor slice_rows(const Tensor& tensor, int64_t begin, int64_t end);

/// Concatenates tensors of equal dtype and trailing dims along the first axis into an owned
/// tensor; rank-0 tensors are stacked into a vector.
Tensor concat_rows(const std::vector<Tensor>& parts);

}  // namespace stagecraft::rt
