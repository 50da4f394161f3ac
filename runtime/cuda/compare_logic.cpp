// The CUDA backend's comparison and logic family (families.h), the ops of the CPU backend's
// compare_logic.cpp: Greater, Less, GreaterOrEqual, LessOrEqual, Not, IsNaN, IsInf, And, Or, the
// variadic Min and Max, Mod (integer or fmod), with numpy broadcasting, and the gradients of Min,
// Max and Mod.
#include <cstdint>

#include "runtime/cuda/elementwise_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/grad_eltwise_common.h"
#include "runtime/ops/broadcast.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;
using ops::GradArity;
using ops::expect_dy_shape;

void run_mod(const KernelArgs& a) {
  if (a.attrs.i("fmod", 0) != 0) return run_binary<BinaryOp::kFmod>(a);
  run_binary<BinaryOp::kMod>(a);
}

void run_not(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  launch_not(x.as<uint8_t>(), a.out[0]->as<uint8_t>(), x.numel(), context(a).stream());
  check_launch(a);
}

// IsNaN, and IsInf with detect_positive and detect_negative (default 1 each).
template <bool kNan>
void run_is_special(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  const bool ok = launch_is_special(x.dtype, x.data, a.out[0]->as<uint8_t>(), x.numel(), kNan,
                                    a.attrs.i("detect_positive", 1) != 0,
                                    a.attrs.i("detect_negative", 1) != 0, context(a).stream());
  if (!ok) fail(ErrorKind::kUnsupported, "{} on {} has no CUDA kernel", a.op_type, x.describe());
  check_launch(a);
}

// Min and Max over one or more inputs, all broadcast to the output: the first two (or the one,
// with itself), then each further input folded into the output in place.
template <BinaryOp op>
void run_min_max(const KernelArgs& a) {
  Shape out = a.input(0).shape;
  for (size_t k = 1; k < a.num_inputs(); ++k) out = ops::broadcast_shape(out, a.input(k).shape);
  expect_shape(a, 0, out);
  const Tensor& first = a.input(0);
  const Tensor& second = a.num_inputs() > 1 ? a.input(1) : first;
  Tensor& z = *a.out[0];
  cudaStream_t stream = context(a).stream();
  if (!launch_binary(op, first.dtype, first.dtype, first.data, second.data, z.data, z.numel(),
                     broadcast_map<2>(a, {first.shape, second.shape}, out), stream))
    refuse_dtype(a, first.dtype);
  for (size_t k = 2; k < a.num_inputs(); ++k) {
    const Tensor& next = a.input(k);
    launch_binary(op, first.dtype, first.dtype, z.data, next.data, z.data, z.numel(),
                  broadcast_map<2>(a, {out, next.shape}, out), stream);
  }
  check_launch(a);
}

// Mod on floats (fmod=1): dy to the dividend, -dy * trunc(a / b) to the divisor.
void mod_grad(const KernelArgs& a) {
  GradIo io(a);
  Binary b;
  if (!binary_operands(a, io, b)) return;
  if (io.dx(0) != nullptr) binary_part(a, 0, BinaryGradOp::kPass, *b.lhs, *b.rhs, nullptr, *b.dy);
  if (io.dx(1) != nullptr)
    binary_part(a, 1, BinaryGradOp::kFmodRhs, *b.lhs, *b.rhs, nullptr, *b.dy);
}

// Min and Max: dy to the inputs equal to the output, split evenly between ties, summed back to
// each input's shape. The output is recomputed by the forward kernels when not given.
template <BinaryOp op>
void min_max_grad(const KernelArgs& a) {
  GradIo io(a, {.n_min = 1, .n_max = GradArity::kAny, .m_min = 1, .m_max = 1});
  const Tensor* dy = io.dy(0);
  if (dy == nullptr) return zero_outputs(a);
  CudaContext& ctx = context(a);
  Shape out = io.need_x(0).shape;
  for (size_t k = 1; k < io.n; ++k) out = ops::broadcast_shape(out, io.need_x(k).shape);
  expect_dy_shape(a, *dy, out);
  const int64_t n = shape_numel(out);
  Tensor recomputed;
  const float* y = nullptr;
  if (const Tensor* given = io.y(0); given != nullptr && given->shape == out) {
    y = given->as<float>();
  } else {
    recomputed = ctx.new_tensor(DType::kFloat32, out, false);
    const Tensor& first = io.need_x(0);
    const Tensor& second = io.n > 1 ? io.need_x(1) : first;
    launch_binary(op, DType::kFloat32, DType::kFloat32, first.data, second.data, recomputed.data, n,
                  broadcast_map<2>(a, {first.shape, second.shape}, out), ctx.stream());
    for (size_t k = 2; k < io.n; ++k)
      launch_binary(op, DType::kFloat32, DType::kFloat32, recomputed.data, io.need_x(k).data,
                    recomputed.data, n, broadcast_map<2>(a, {out, io.need_x(k).shape}, out),
                    ctx.stream());
    check_launch(a);
    y = recomputed.as<float>();
  }
  Tensor ties = ctx.new_tensor(DType::kFloat32, out, false);
  for (size_t k = 0; k < io.n; ++k)
    launch_tie_count(io.need_x(k).as<float>(), y, ties.as<float>(), n,
                     broadcast_map<1>(a, {io.need_x(k).shape}, out), k > 0, ctx.stream());
  check_launch(a);
  for (size_t k = 0; k < io.n; ++k) {
    Tensor* dx = io.dx(k);
    if (dx == nullptr) continue;
    const Tensor& x = io.need_x(k);
    expect_shape(a, k, x.shape);
    const bool direct = x.shape == out;
    Tensor full;
    if (!direct) full = ctx.new_tensor(DType::kFloat32, out, false);
    float* dst = direct ? dx->as<float>() : full.as<float>();
    launch_min_max_grad(x.as<float>(), y, dy->as<float>(), ties.as<float>(), dst, n,
                        broadcast_map<1>(a, {x.shape}, out), ctx.stream());
    check_launch(a);
    if (!direct) sum_to_shape(a, full.as<float>(), out, dx->as<float>(), x.shape);
  }
}

// The checks are the CPU's: every signature it accepts has a kernel here; each gradient writes
// every element of its outputs.
constexpr KernelEntry kKernels[] = {
    {"Greater", run_binary<BinaryOp::kGreater>, same_as_cpu},
    {"Less", run_binary<BinaryOp::kLess>, same_as_cpu},
    {"GreaterOrEqual", run_binary<BinaryOp::kGreaterOrEqual>, same_as_cpu},
    {"LessOrEqual", run_binary<BinaryOp::kLessOrEqual>, same_as_cpu},
    {"Not", run_not, same_as_cpu},
    {"IsNaN", run_is_special<true>, same_as_cpu},
    {"IsInf", run_is_special<false>, same_as_cpu},
    {"And", run_binary<BinaryOp::kAnd>, same_as_cpu},
    {"Or", run_binary<BinaryOp::kOr>, same_as_cpu},
    {"Min", run_min_max<BinaryOp::kMin>, same_as_cpu},
    {"Max", run_min_max<BinaryOp::kMax>, same_as_cpu},
    {"Mod", run_mod, same_as_cpu},
    {"MinGrad", min_max_grad<BinaryOp::kMin>, same_as_cpu, true},
    {"MaxGrad", min_max_grad<BinaryOp::kMax>, same_as_cpu, true},
    {"ModGrad", mod_grad, same_as_cpu, true},
};

}  // namespace

std::span<const KernelEntry> compare_logic_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
