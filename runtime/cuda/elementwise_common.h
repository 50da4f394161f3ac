#pragma once
/// \file
/// Host-side helpers the CUDA elementwise families and their gradients share (elementwise.cpp,
/// activations.cpp, compare_logic.cpp, unary_math.cpp, leaky_relu.cpp, grad_eltwise.cpp): the
/// unary and binary launches with their shape checks, broadcast maps planned as the CPU's `Broadcast` plans them (size-1 dims
/// dropped, dims every input reads alike merged), small device operands copied to the host, and
/// the sum of a broadcast gradient back to an input's shape (a fixed-order reduction, no
/// atomics, so a run is reproducible).

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/data_common.h"
#include "runtime/cuda/elementwise_kernels.h"
#include "runtime/format/error.h"
#include "runtime/ops/broadcast.h"

namespace stagecraft::rt::cuda {

/// The map reading `inputs` (at most 3) along the dense output `out`. Throws `Error(kShape)`
/// when an input does not broadcast to `out`, `Error(kUnsupported)` past rank 8 after merging.
template <size_t N>
BroadcastMap broadcast_map(const KernelArgs& a, const std::array<Shape, N>& inputs,
                           const Shape& out) {
  static_assert(N >= 1 && N <= 3);
  const size_t rank = out.size();
  auto refuse = [&](size_t k) {
    fail(ErrorKind::kShape, "{} '{}': input {} of shape {} does not broadcast to {}", a.op_type,
         a.name, k, shape_string(inputs[k]), shape_string(out));
  };
  for (size_t k = 0; k < N; ++k)
    if (inputs[k].size() > rank) refuse(k);
  std::vector<int64_t> dims;
  std::vector<uint32_t> masks;  // bit k: input k repeats along the dim
  for (size_t axis = 0; axis < rank; ++axis) {
    uint32_t mask = 0;
    for (size_t k = 0; k < N; ++k) {
      const size_t lead = rank - inputs[k].size();
      const int64_t dim = axis < lead ? 1 : inputs[k][axis - lead];
      if (dim != out[axis] && dim != 1) refuse(k);
      if (dim != out[axis]) mask |= 1u << k;
    }
    if (out[axis] == 1) continue;
    if (!dims.empty() && masks.back() == mask) {
      dims.back() *= out[axis];
      continue;
    }
    dims.push_back(out[axis]);
    masks.push_back(mask);
  }
  if (dims.empty()) {
    dims.push_back(1);
    masks.push_back(0);
  }
  if (dims.size() > static_cast<size_t>(kMaxBroadcastRank))
    fail(ErrorKind::kUnsupported,
         "{} '{}' broadcasts to {} through {} distinct dims; the cuda backend handles at most {}",
         a.op_type, a.name, shape_string(out), dims.size(), kMaxBroadcastRank);
  BroadcastMap map;
  map.rank = static_cast<int32_t>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) map.dims[d] = dims[d];
  for (size_t k = 0; k < N; ++k) {
    int64_t running = 1;
    for (size_t d = dims.size(); d-- > 0;) {
      if (masks[d] & (1u << k)) continue;
      map.strides[k][d] = running;
      running *= dims[d];
    }
  }
  return map;
}

/// A host copy of a small device tensor (Dropout's scalars, a divisor to check).
inline Tensor host_copy(CudaContext& ctx, const Tensor& t) {
  Tensor host = Tensor::owned(t.dtype, t.shape);
  if (t.bytes() > 0) ctx.read(t, host.data, t.bytes());
  return host;
}

/// Throws for a dtype a launcher had no kernel for (the check should have refused it).
inline void refuse_dtype(const KernelArgs& a, DType dtype) {
  fail(ErrorKind::kInternal, "{} '{}' on {} reached the cuda kernel, which its check refuses",
       a.op_type, a.name, dtype_name(dtype));
}

/// Sums the dense float32 `full` (shape `full_shape`) over the dims along which `shape`
/// broadcasts to it (numpy rules) into the dense `out` of `shape`, which it overwrites: the
/// data family's reduction, summing each output's elements in a fixed order in double (across
/// the device for a bias-style sum over leading dims: reduce_sum_f32).
inline void sum_to_shape(const KernelArgs& a, const float* full, const Shape& full_shape,
                         float* out, const Shape& shape) {
  if (shape.size() > full_shape.size())
    fail(ErrorKind::kShape, "{}: cannot sum {} to the larger-rank {}", a.op_type,
         shape_string(full_shape), shape_string(shape));
  const size_t lead = full_shape.size() - shape.size();
  std::vector<bool> reduced(full_shape.size());
  for (size_t i = 0; i < full_shape.size(); ++i) {
    const int64_t s = i < lead ? 1 : shape[i - lead];
    if (s != full_shape[i] && s != 1)
      fail(ErrorKind::kShape, "{}: {} does not broadcast to {}", a.op_type, shape_string(shape),
           shape_string(full_shape));
    reduced[i] = s != full_shape[i];
  }
  CudaContext& ctx = context(a);
  const int64_t n_out = shape_numel(shape);
  if (n_out == 0) return;
  if (shape_numel(full_shape) == 0) {
    check(cudaMemsetAsync(out, 0, static_cast<size_t>(n_out) * sizeof(float), ctx.stream()),
          "cudaMemsetAsync");
    return;
  }
  reduce_sum_f32(ctx, out, full, n_out, reduce_map(a, full_shape, reduced));
  check_launch(a);
}

// ---------------------------------------------------------------------------------------------
// The forward runners of the elementwise families: attributes read by each op's own file.

/// The unary op's input, with the output checked to have its shape.
inline const Tensor& unary_input(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  expect_shape(a, 0, x.shape);
  return x;
}

inline void unary(const KernelArgs& a, UnaryOp op, const UnaryParams& params) {
  const Tensor& x = unary_input(a);
  if (!launch_unary(op, x.dtype, x.data, a.out[0]->data, x.numel(), params, context(a).stream()))
    refuse_dtype(a, x.dtype);
  check_launch(a);
}

template <UnaryOp op>
void run_unary(const KernelArgs& a) {
  unary(a, op, {});
}

// The map of a broadcasting op over its N inputs, the output checked to have their broadcast
// shape.
template <size_t N>
BroadcastMap broadcast_output(const KernelArgs& a) {
  std::array<Shape, N> shapes;
  Shape out;
  for (size_t k = 0; k < N; ++k) {
    shapes[k] = a.input(k).shape;
    out = k == 0 ? shapes[k] : ops::broadcast_shape(out, shapes[k]);
  }
  expect_shape(a, 0, out);
  return broadcast_map<N>(a, shapes, out);
}

inline bool is_integer(DType d) {
  return d != DType::kFloat32 && d != DType::kFloat64 && d != DType::kFloat16 &&
         d != DType::kBFloat16;
}

// Integer Div and Mod refuse a zero divisor, as the CPU does (the divisor is read to the host).
inline void refuse_zero_divisor(const KernelArgs& a, const Tensor& y) {
  const Tensor host = host_copy(context(a), y);
  const int64_t size = dtype_size(y.dtype), n = y.numel();
  for (int64_t i = 0; i < n; ++i) {
    bool zero = true;
    for (int64_t b = 0; b < size; ++b) zero = zero && host.data[i * size + b] == std::byte{0};
    if (!zero) continue;
    if (a.op_type == "Mod")
      fail(ErrorKind::kModel, "Mod '{}': integer modulo by zero ({} divisor)", a.name,
           dtype_name(y.dtype));
    fail(ErrorKind::kModel, "integer division by zero ({} divisor)", dtype_name(y.dtype));
  }
}

template <BinaryOp op>
inline void run_binary(const KernelArgs& a) {
  const BroadcastMap map = broadcast_output<2>(a);
  const Tensor &x = a.input(0), &y = a.input(1);
  if ((op == BinaryOp::kDiv || op == BinaryOp::kMod || op == BinaryOp::kFmod) &&
      is_integer(x.dtype))
    refuse_zero_divisor(a, y);
  Tensor& z = *a.out[0];
  if (!launch_binary(op, x.dtype, y.dtype, x.data, y.data, z.data, z.numel(), map,
                     context(a).stream()))
    refuse_dtype(a, x.dtype);
  check_launch(a);
}

}  // namespace stagecraft::rt::cuda
