#pragma once
/// \file
/// What the CUDA gradients of the elementwise families share (grad_eltwise.cpp,
/// activations.cpp, compare_logic.cpp, unary_math.cpp, leaky_relu.cpp): a unary op's gradient
/// launch and a binary op's gradient per operand with its broadcasting summed back, following
/// the contract of runtime/format/grad_ops.h.

#include "runtime/core/kernel.h"
#include "runtime/cuda/elementwise_common.h"
#include "runtime/cuda/grad_eltwise_kernels.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::cuda {

// Zeroes dx_k where it is wanted.
inline void zero_output(const ops::GradIo& io, size_t k) {
  if (Tensor* t = io.dx(k)) io.a.device.fill_zero(*t);
}

// dx = g(x, y, dy) elementwise; y is the forward output, recomputed from x when omitted.
inline void unary_grad(const KernelArgs& a, UnaryGradOp op, const UnaryGradParams& params) {
  ops::GradIo io(a);
  for (size_t k = 1; k < io.n; ++k) zero_output(io, k);  // Clip's bounds get none
  Tensor* dx = io.dx(0);
  const Tensor* dy = io.dy(0);
  if (dx == nullptr) return;
  if (dy == nullptr) return a.device.fill_zero(*dx);
  const Tensor& x = io.need_x(0);
  expect_shape(a, 0, x.shape);
  ops::expect_dy_shape(a, *dy, x.shape);
  const Tensor* y = io.y(0);
  // A bare Y (grad_reads.h: the gradient is a function of X) is recomputed from X.
  const bool has_y = y != nullptr && !y->is_bare() && y->shape == x.shape;
  // 16-bit operands (the kernel tables' same_as_cpu_16bit: one 16-bit type throughout).
  if (is_16bit_float(dx->dtype)) {
    if (!launch_unary_grad(op, dx->dtype, x.data, has_y ? y->data : nullptr, dy->data, dx->data,
                           x.numel(), params, context(a).stream()))
      fail(ErrorKind::kUnsupported, "{} '{}': no {} kernel", a.op_type, a.name,
           dtype_name(dx->dtype));
    return check_launch(a);
  }
  launch_unary_grad(op, x.as<float>(), has_y ? y->as<float>() : nullptr, dy->as<float>(),
                    dx->as<float>(), x.numel(), params, context(a).stream());
  check_launch(a);
}

template <UnaryGradOp op>
void run_unary_grad(const KernelArgs& a) {
  unary_grad(a, op, {});
}

// dx_k = the sum over broadcast dims of op at every output element.
inline void binary_part(const KernelArgs& a, size_t k, BinaryGradOp op, const Tensor& lhs,
                 const Tensor& rhs, const Tensor* y, const Tensor& dy) {
  CudaContext& ctx = context(a);
  Tensor& dx = *a.out[k];
  const Shape& out_shape = dy.shape;
  const Shape& shape = (k == 0 ? lhs : rhs).shape;
  expect_shape(a, k, shape);
  const BroadcastMap map = broadcast_map<2>(a, {lhs.shape, rhs.shape}, out_shape);
  const bool direct = shape == out_shape;
  Tensor full;
  if (!direct) full = ctx.new_tensor(DType::kFloat32, out_shape, false);
  float* dst = direct ? dx.as<float>() : full.as<float>();
  launch_binary_grad(op, lhs.as<float>(), rhs.as<float>(), y != nullptr ? y->as<float>() : nullptr,
                     dy.as<float>(), dst, shape_numel(out_shape), map, ctx.stream());
  check_launch(a);
  if (!direct) sum_to_shape(a, full.as<float>(), out_shape, dx.as<float>(), shape);
}

using Binary = ops::BinaryGradOperands;  // read by ops::binary_operands
using ops::binary_operands;

}  // namespace stagecraft::rt::cuda
