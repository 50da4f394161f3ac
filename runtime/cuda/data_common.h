#pragma once
/// \file
/// Host-side helpers the CUDA data family and its gradients share (data.cpp, grad_data.cpp):
/// index maps built from shapes and strides with the layout arithmetic both backends share
/// (runtime/ops/layout.h, so both backends read attributes and clamp bounds alike), small
/// integer operands brought to the host, and small host arrays sent to the device.

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/data_kernels.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/layout.h"

namespace stagecraft::rt::cuda {

/// The index map of a strided walk over `shape` (ops::merge_strided_dims: unit dims dropped,
/// contiguous neighbours merged). Throws `Error(kUnsupported)` naming the op past rank 8.
inline IndexMap index_map(const KernelArgs& a, const Shape& shape,
                          const std::vector<int64_t>& strides) {
  const ops::StridedWalk walk = ops::merge_strided_dims(shape, strides);
  if (walk.dims.size() > static_cast<size_t>(kMaxIndexRank))
    fail(ErrorKind::kUnsupported,
         "{} '{}' moves {} through {} non-contiguous dims; the cuda backend handles at most {}",
         a.op_type, a.name, shape_string(shape), walk.dims.size(), kMaxIndexRank);
  IndexMap map;
  map.rank = static_cast<int32_t>(walk.dims.size());
  for (size_t d = 0; d < walk.dims.size(); ++d) {
    map.dims[d] = walk.dims[d];
    map.strides[d] = walk.steps[d];
  }
  return map;
}

/// The map of a reduction of a dense `shape` over the dims flagged in `reduced`: kept dims in
/// row-major output order, reduced dims in row-major (ascending offset) order.
inline ReduceMap reduce_map(const KernelArgs& a, const Shape& shape,
                            const std::vector<bool>& reduced) {
  const std::vector<int64_t> strides = ops::dense_strides(shape);
  Shape kept_dims, red_dims;
  std::vector<int64_t> kept_strides, red_strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    (reduced[d] ? red_dims : kept_dims).push_back(shape[d]);
    (reduced[d] ? red_strides : kept_strides).push_back(strides[d]);
  }
  ReduceMap map;
  map.kept = index_map(a, kept_dims, kept_strides);
  map.reduced = index_map(a, red_dims, red_strides);
  map.count = shape_numel(red_dims);
  return map;
}

/// out = the float32 sum reduction of `in` by `map` on the context's stream: a column sum across
/// the device where the map is one (column_reduction), else launch_reduce_sum_f32.
inline void reduce_sum_f32(CudaContext& ctx, float* out, const float* in, int64_t n_out,
                           const ReduceMap& map) {
  if (column_reduction(map, n_out)) {
    const int64_t slices = column_slices(map.count, n_out);
    Tensor partial = ctx.new_tensor(DType::kFloat64, {slices * n_out}, false);
    launch_column_sum_f32(out, in, map.count, n_out, map.reduced.strides[0], partial.as<double>(),
                          slices, ctx.stream());
    return;
  }
  launch_reduce_sum_f32(out, in, n_out, map, ctx.stream());
}

/// Whether elements of `bytes` bytes can be moved (1, 2, 4, 8 or 16), else throws naming the op.
inline int64_t movable_size(const KernelArgs& a, DType dtype) {
  const int64_t size = dtype_size(dtype);
  if (size != 1 && size != 2 && size != 4 && size != 8 && size != 16)
    fail(ErrorKind::kUnsupported, "{}: elements of {} bytes ({}) cannot be moved", a.op_type, size,
         dtype_name(dtype));
  return size;
}

/// A device-to-device copy of `bytes` on the context's stream (nothing when empty or aliased).
inline void device_copy(CudaContext& ctx, void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0 || dst == src) return;
  check(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, ctx.stream()),
      "cudaMemcpyAsync (device to device)");
}

/// Copies `rows` rows of `width` bytes from `src` (rows `src_pitch` apart) to `dst` (rows
/// `dst_pitch` apart) on the context's stream.
inline void copy_rows(CudaContext& ctx, void* dst, int64_t dst_pitch, const void* src,
                      int64_t src_pitch, int64_t width, int64_t rows) {
  if (rows <= 0 || width <= 0) return;
  if (rows == 1) return device_copy(ctx, dst, src, width);  // no pitch limits for one row
  check(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                          static_cast<size_t>(width), static_cast<size_t>(rows),
                          cudaMemcpyDeviceToDevice, ctx.stream()),
        "cudaMemcpy2DAsync (device to device)");
}

/// Zeroes every requested output on the device (a gradient whose dy is omitted), and checks
/// the output gradient's shape: the shared rule (runtime/ops/grad_io.h).
using ops::expect_dy_shape;
using ops::zero_outputs;

/// An int64 device tensor holding `values`.
inline Tensor upload_ints(CudaContext& ctx, const std::vector<int64_t>& values) {
  Tensor t = ctx.new_tensor(DType::kInt64, {static_cast<int64_t>(values.size())}, false);
  ctx.write(t, values.data(), t.bytes());
  return t;
}

/// A host int64 copy of a small device operand (null stays null), for ops::slice_view.
inline Tensor host_ints(CudaContext& ctx, const Tensor* t) {
  if (t == nullptr) return {};
  const std::vector<int64_t> values = read_ints(ctx, *t);
  Tensor host = Tensor::owned(DType::kInt64, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), host.as<int64_t>());
  return host;
}

/// The Slice view of X (ops::slice_view) with operand k of the op given by `operand(k)` (a
/// device tensor, or null when omitted): its integer operands are read to the host first.
inline ops::SliceView slice_view(const KernelArgs& a, CudaContext& ctx, const Shape& x_shape,
                                 size_t forward_inputs,
                                 const std::function<const Tensor*(size_t)>& operand) {
  std::vector<Tensor> host(5);
  std::vector<bool> present(5, false);
  for (size_t k = 1; k < std::min<size_t>(forward_inputs, 5); ++k) {
    present[k] = operand(k) != nullptr;
    host[k] = host_ints(ctx, operand(k));
  }
  return ops::slice_view(a, x_shape, forward_inputs, [&](size_t k) -> const Tensor* {
    return k < host.size() && present[k] ? &host[k] : nullptr;
  });
}

/// Gather's indices along an axis of size `dim`, read to the host, checked and made
/// non-negative.
inline std::vector<int64_t> gather_indices(CudaContext& ctx, const Tensor& indices, int64_t axis,
                                           int64_t dim) {
  return ops::gather_indices_in_range(read_ints(ctx, indices), axis, dim);
}

}  // namespace stagecraft::rt::cuda
