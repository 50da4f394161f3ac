// The CUDA backend's gradients of the elementwise family's ops (families.h): the ops of the CPU
// backend's grad_eltwise.cpp, float32, following the
// contract of runtime/format/grad_ops.h and the CPU's formulas. A binary op's gradient is
// computed per output element (grad_eltwise_kernels.cu) and, where an input was broadcast,
// summed back to the input's shape by a fixed-order reduction (no atomics), so runs are
// reproducible. Every kernel writes every element of the outputs it is given.
#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <vector>

#include "runtime/cuda/elementwise_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/grad_eltwise_common.h"
#include "runtime/cuda/grad_eltwise_kernels.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/layout.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;
using ops::expect_dy_shape;

// ---------------------------------------------------------------------------------------------
// Unary ops

void hard_sigmoid_grad(const KernelArgs& a) {
  unary_grad(a, UnaryGradOp::kHardSigmoid,
             {.alpha = a.attrs.f("alpha", 0.2f), .beta = a.attrs.f("beta", 0.5f)});
}

// The device element of Clip's optional bound input k, or null when it is omitted.
const float* clip_bound(const GradIo& io, size_t k) {
  const Tensor* t = io.x(k);
  if (t == nullptr) return nullptr;
  if (t->numel() != 1)
    fail(ErrorKind::kShape, "Clip's {} must be a scalar, not {}", k == 1 ? "min" : "max",
         shape_string(t->shape));
  return t->as<float>();
}

// Clip: the gradient passes where min < x < max (bounds as the forward kernel reads them).
void clip_grad(const KernelArgs& a) {
  GradIo io(a);
  UnaryGradParams p;
  p.lo_attr = a.attrs.has("min");
  p.hi_attr = a.attrs.has("max");
  p.lo = a.attrs.f("min", 0);
  p.hi = a.attrs.f("max", 0);
  if (!p.lo_attr) p.lo_ptr = clip_bound(io, 1);
  if (!p.hi_attr) p.hi_ptr = clip_bound(io, 2);
  unary_grad(a, UnaryGradOp::kClip, p);
}

// Dropout as the forward kernel runs it: in training mode with a nonzero ratio r, dx = dy x mask
// / (1 - r) with the forward's own mask (its output 1); otherwise dx = dy. The CPU's rule.
void dropout_grad(const KernelArgs& a) {
  GradIo io(a);
  CudaContext& ctx = context(a);
  const Tensor* training = io.x(2);
  float ratio = 0;
  if (training != nullptr && ops::scalar_is_nonzero(host_copy(ctx, *training), "training_mode"))
    ratio = io.x(1) != nullptr ? ops::dropout_ratio(host_copy(ctx, *io.x(1))) : 0.5f;
  if (a.attrs.i("is_test", 1) == 0)
    fail(ErrorKind::kUnsupported, "DropoutGrad with is_test=0 (training) is not supported");
  for (size_t k = 1; k < io.n; ++k) zero_output(io, k);  // ratio and training_mode get none
  Tensor* dx = io.dx(0);
  const Tensor* dy = io.dy(0);
  if (dx == nullptr) return;
  if (dy == nullptr) return ctx.fill_zero(*dx);
  expect_shape(a, 0, io.need_x(0).shape);
  expect_dy_shape(a, *dy, dx->shape);
  if (ratio == 0) return device_copy(ctx, dx->data, dy->data, dx->bytes());
  const Tensor* mask = io.y(1);
  ops::check_dropout_grad(mask, *dx);
  launch_dropout_grad(dy->as<float>(), mask->as<uint8_t>(), dx->as<float>(), dx->numel(), ratio,
                      ctx.stream());
  check_launch(a);
}

// Cast: the gradient of a float32 input is dy cast back to float32 (from float32, float64,
// float16 or bfloat16).
void cast_grad(const KernelArgs& a) {
  GradIo io(a);
  CudaContext& ctx = context(a);
  Tensor* dx = io.dx(0);
  const Tensor* dy = io.dy(0);
  if (dx == nullptr) return;
  if (dy == nullptr) return ctx.fill_zero(*dx);
  const Tensor& x = io.need_x(0);
  expect_shape(a, 0, x.shape);
  expect_dy_shape(a, *dy, x.shape);
  // dx takes x's type: float32, or a 16-bit float where a 16-bit value was cast up (a mixed
  // plan's logits for the loss, BatchNormalization's input), one rounding of dy straight into it.
  if (dy->dtype == dx->dtype) return device_copy(ctx, dx->data, dy->data, dx->bytes());
  if (!is_floating(dy->dtype) ||
      !launch_cast(dy->dtype, dx->dtype, dy->data, dx->data, x.numel(), ctx.stream()))
    fail(ErrorKind::kUnsupported, "CastGrad with a {} output gradient is not supported",
         dtype_name(dy->dtype));
  check_launch(a);
}

// CastGrad: the CPU's signatures, and a 16-bit x and dx (the CPU runs those widened) from any
// float dy.
std::string check_cast_grad(const OpSignature& s) {
  std::string why = same_as_cpu(s);
  if (why.empty() || s.inputs.size() != 3 || s.outputs.size() != 1) return why;
  if (is_16bit_float(s.inputs[0]) && s.outputs[0] == s.inputs[0] && is_floating(s.inputs[2]))
    return "";
  return why;
}

// ---------------------------------------------------------------------------------------------
// Binary ops with broadcasting undone

// AddGrad on 16-bit floats (same_as_cpu_16bit): dy passes to an operand of its shape as a copy;
// to a broadcast operand (a bias) it is widened once, summed to the operand's shape in float32
// and rounded, as the widened fallback computes, without widening A and B, which it never reads.
void add_grad_16bit(const KernelArgs& a, const GradIo& io, const Binary& b) {
  CudaContext& ctx = context(a);
  const Tensor& dy = *b.dy;
  Tensor wide;
  for (size_t k = 0; k < 2; ++k) {
    Tensor* dx = io.dx(k);
    if (dx == nullptr) continue;
    const Shape& shape = (k == 0 ? b.lhs : b.rhs)->shape;
    expect_shape(a, k, shape);
    if (shape == dy.shape) {
      device_copy(ctx, dx->data, dy.data, dx->bytes());
      continue;
    }
    if (wide.dtype == DType::kUndefined) {
      wide = ctx.new_tensor(DType::kFloat32, dy.shape, false);
      if (!launch_cast(dy.dtype, DType::kFloat32, dy.data, wide.data, dy.numel(), ctx.stream()))
        refuse_dtype(a, dy.dtype);
      check_launch(a);
    }
    Tensor sum = ctx.new_tensor(DType::kFloat32, shape, false);
    sum_to_shape(a, wide.as<float>(), dy.shape, sum.as<float>(), shape);
    if (!launch_cast(DType::kFloat32, dx->dtype, sum.data, dx->data, sum.numel(), ctx.stream()))
      refuse_dtype(a, dx->dtype);
    check_launch(a);
  }
}

template <BinaryGradOp lhs_op, BinaryGradOp rhs_op>
void arith_grad(const KernelArgs& a) {
  GradIo io(a);
  Binary b;
  if (!binary_operands(a, io, b)) return;
  if constexpr (lhs_op == BinaryGradOp::kPass && rhs_op == BinaryGradOp::kPass) {
    if (is_16bit_float(b.dy->dtype))
      return add_grad_16bit(a, io, b);
  }
  if (io.dx(0) != nullptr) binary_part(a, 0, lhs_op, *b.lhs, *b.rhs, nullptr, *b.dy);
  if (io.dx(1) != nullptr) binary_part(a, 1, rhs_op, *b.lhs, *b.rhs, nullptr, *b.dy);
}

// Pow: d/dbase = e * base^(e-1), d/dexp = y * ln(base) where base > 0 (else 0). An int32 or
// int64 exponent is read as float32 for the base's gradient (it gets none itself).
void pow_grad(const KernelArgs& a) {
  GradIo io(a);
  Binary b;
  if (!binary_operands(a, io, b)) return;
  CudaContext& ctx = context(a);
  Tensor exponent = *b.rhs;
  if (b.rhs->dtype != DType::kFloat32) {
    exponent = ctx.new_tensor(DType::kFloat32, b.rhs->shape, false);
    if (!launch_cast(b.rhs->dtype, DType::kFloat32, b.rhs->data, exponent.data, b.rhs->numel(),
                     ctx.stream()))
      refuse_dtype(a, b.rhs->dtype);
    check_launch(a);
  }
  if (io.dx(0) != nullptr)
    binary_part(a, 0, BinaryGradOp::kPowBase, *b.lhs, exponent, nullptr, *b.dy);
  if (io.dx(1) != nullptr) {
    if (b.rhs->dtype != DType::kFloat32)
      fail(ErrorKind::kUnsupported, "PowGrad: an integer exponent has no gradient");
    binary_part(a, 1, BinaryGradOp::kPowExp, *b.lhs, exponent, b.y, *b.dy);
  }
}

// Where: dy goes to x where the condition holds and to y elsewhere; the condition gets none.
void where_grad(const KernelArgs& a) {
  GradIo io(a);
  const Tensor* dy = io.dy(0);
  zero_output(io, 0);  // the condition gets none
  if (dy == nullptr) zero_outputs(a);
  if (dy == nullptr || (io.dx(1) == nullptr && io.dx(2) == nullptr)) return;
  CudaContext& ctx = context(a);
  const Tensor &cond = io.need_x(0), &x = io.need_x(1), &y = io.need_x(2);
  const Shape out = ops::broadcast_shape(ops::broadcast_shape(cond.shape, x.shape), y.shape);
  expect_dy_shape(a, *dy, out);
  const BroadcastMap map = broadcast_map<1>(a, {cond.shape}, out);
  for (size_t k = 1; k <= 2; ++k) {
    Tensor* dx = io.dx(k);
    if (dx == nullptr) continue;
    const Shape& shape = io.x(k)->shape;
    expect_shape(a, k, shape);
    const bool direct = shape == out;
    Tensor full;
    if (!direct) full = ctx.new_tensor(DType::kFloat32, out, false);
    float* dst = direct ? dx->as<float>() : full.as<float>();
    launch_where_grad(cond.as<uint8_t>(), dy->as<float>(), dst, shape_numel(out), map, k == 1,
                      ctx.stream());
    check_launch(a);
    if (!direct) sum_to_shape(a, full.as<float>(), out, dx->as<float>(), shape);
  }
}

// Equal has no gradient: its outputs are never requested (and are zeros if they are).
void equal_grad(const KernelArgs& a) { zero_outputs(a); }

// The checks are the CPU's: every signature it accepts (float32 gradients, a float16, bfloat16
// or float64 dy for CastGrad, an integer exponent for PowGrad) has a kernel here; besides, the
// common activations' gradients and AddGrad run 16-bit floats natively (same_as_cpu_16bit), and
// CastGrad writes a 16-bit dx straight from dy (check_cast_grad).
// dX = dY where X > 0, computed from Y where the runtime hands it over (ops::relu_mask_in_x).
void relu_grad(const KernelArgs& a) {
  std::vector<const Tensor*> in;
  unary_grad(ops::relu_mask_in_x(a, in), UnaryGradOp::kRelu, {});
}

constexpr KernelEntry kKernels[] = {
    {"ReluGrad", relu_grad, same_as_cpu_16bit, true},
    {"SigmoidGrad", run_unary_grad<UnaryGradOp::kSigmoid>, same_as_cpu_16bit, true},
    {"TanhGrad", run_unary_grad<UnaryGradOp::kTanh>, same_as_cpu_16bit, true},
    {"SqrtGrad", run_unary_grad<UnaryGradOp::kSqrt>, same_as_cpu, true},
    {"ErfGrad", run_unary_grad<UnaryGradOp::kErf>, same_as_cpu, true},
    {"HardSigmoidGrad", hard_sigmoid_grad, same_as_cpu_16bit, true},
    {"HardSwishGrad", run_unary_grad<UnaryGradOp::kHardSwish>, same_as_cpu_16bit, true},
    {"ClipGrad", clip_grad, same_as_cpu, true},
    {"DropoutGrad", dropout_grad, same_as_cpu, true},
    {"CastGrad", cast_grad, check_cast_grad, true},
    {"AddGrad", arith_grad<BinaryGradOp::kPass, BinaryGradOp::kPass>, same_as_cpu_16bit, true},
    {"SubGrad", arith_grad<BinaryGradOp::kPass, BinaryGradOp::kNegate>, same_as_cpu, true},
    {"MulGrad", arith_grad<BinaryGradOp::kMulLhs, BinaryGradOp::kMulRhs>, same_as_cpu, true},
    {"DivGrad", arith_grad<BinaryGradOp::kDivLhs, BinaryGradOp::kDivRhs>, same_as_cpu, true},
    {"PowGrad", pow_grad, same_as_cpu, true},
    {"WhereGrad", where_grad, same_as_cpu, true},
    {"EqualGrad", equal_grad, same_as_cpu, true},
};

}  // namespace

std::span<const KernelEntry> grad_eltwise_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
