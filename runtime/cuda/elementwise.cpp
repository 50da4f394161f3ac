// The CUDA backend's elementwise family (families.h): the ops of the CPU backend's
// elementwise.cpp, on every dtype the CPU accepts (so each check is `same_as_cpu`; the
// arithmetic and unary maths also natively on bfloat16 and float16, `same_as_cpu_16bit`): Relu,
// Sigmoid, Tanh, Sqrt, Erf, HardSigmoid, HardSwish, Clip, Dropout, Cast, the binary ops with
// numpy broadcasting (Add, Sub, Mul, Div, Pow, Equal) and Where. This file reads attributes, checks shapes and plans the
// broadcast; elementwise_kernels.cu computes each element as the CPU does.
#include <fmt/format.h>

#include <array>
#include <cstdint>

#include "runtime/cuda/elementwise_common.h"
#include "runtime/cuda/families.h"
#include "runtime/ops/dropout_mask.h"
#include "runtime/ops/layout.h"

namespace stagecraft::rt::cuda {
namespace {

void run_hard_sigmoid(const KernelArgs& a) {
  unary(a, UnaryOp::kHardSigmoid,
        {.alpha = a.attrs.f("alpha", 0.2f), .beta = a.attrs.f("beta", 0.5f)});
}

// The device element of Clip's optional bound input k, or null when it is omitted.
const void* clip_bound(const KernelArgs& a, size_t k) {
  if (!a.has_input(k)) return nullptr;
  const Tensor& t = a.input(k);
  if (t.numel() != 1)
    fail(ErrorKind::kShape, "Clip's {} must be a scalar, not {}", k == 1 ? "min" : "max",
         shape_string(t.shape));
  return t.data;
}

// Clip: min and max are attributes up to opset 6 and optional inputs from opset 11.
void run_clip(const KernelArgs& a) {
  UnaryParams p;
  p.lo_attr = a.attrs.has("min");
  p.hi_attr = a.attrs.has("max");
  p.lo = a.attrs.f("min", 0);
  p.hi = a.attrs.f("max", 0);
  if (!p.lo_attr) p.lo_ptr = clip_bound(a, 1);
  if (!p.hi_attr) p.hi_ptr = clip_bound(a, 2);
  unary(a, UnaryOp::kClip, p);
}

// Dropout. Training mode (opset 12+ input 2 true) with a nonzero ratio (input 1, default 0.5):
// the CPU's mask (runtime/ops/dropout_mask.h), element for element. Otherwise (inference, or a
// ratio of 0) the output is the input and the optional mask keeps everything.
void run_dropout(const KernelArgs& a) {
  CudaContext& ctx = context(a);
  const Tensor& x = unary_input(a);
  if (a.has_input(2) && ops::scalar_is_nonzero(host_copy(ctx, a.input(2)), "training_mode")) {
    const float ratio = a.has_input(1) ? ops::dropout_ratio(host_copy(ctx, a.input(1))) : 0.5f;
    if (ratio != 0) {
      Tensor* mask = a.out.size() > 1 ? a.out[1] : nullptr;
      if (mask != nullptr) expect_shape(a, 1, x.shape);
      ops::check_dropout_training(x, mask);
      launch_dropout_training(x.as<float>(), a.out[0]->as<float>(),
                              mask != nullptr ? mask->as<uint8_t>() : nullptr, x.numel(),
                              ops::dropout_node_key(a.random_key, a.attrs.i("seed", 0)), ratio,
                              ctx.stream());
      return check_launch(a);
    }
  }
  device_copy(ctx, a.out[0]->data, x.data, x.bytes());
  if (a.out.size() < 2 || a.out[1] == nullptr) return;
  Tensor& mask = *a.out[1];
  expect_shape(a, 1, x.shape);
  uint64_t one = 0;
  switch (mask.dtype) {
    case DType::kBool:
      one = 1;
      break;
    case DType::kFloat32:
      one = 0x3f800000u;  // 1.0f
      break;
    case DType::kFloat64:
      one = 0x3ff0000000000000u;  // 1.0
      break;
    default:
      fail(ErrorKind::kInternal, "Dropout mask of type {} reached the kernel",
           dtype_name(mask.dtype));
  }
  if (!launch_fill(mask.data, dtype_size(mask.dtype), one, mask.numel(), ctx.stream()))
    refuse_dtype(a, mask.dtype);
  check_launch(a);
}

void run_cast(const KernelArgs& a) {
  const Tensor& x = unary_input(a);
  Tensor& y = *a.out[0];
  CudaContext& ctx = context(a);
  if (x.dtype == y.dtype) return device_copy(ctx, y.data, x.data, x.bytes());
  if (!launch_cast(x.dtype, y.dtype, x.data, y.data, x.numel(), ctx.stream()))
    fail(ErrorKind::kInternal, "Cast from {} to {} reached the cuda kernel", dtype_name(x.dtype),
         dtype_name(y.dtype));
  check_launch(a);
}

void run_where(const KernelArgs& a) {
  const BroadcastMap map = broadcast_output<3>(a);
  const Tensor &c = a.input(0), &x = a.input(1), &y = a.input(2);
  Tensor& z = *a.out[0];
  if (!launch_where(dtype_size(x.dtype), c.as<uint8_t>(), x.data, y.data, z.data, z.numel(), map,
                    context(a).stream()))
    refuse_dtype(a, x.dtype);
  check_launch(a);
}

// Every op takes what the CPU's kernel takes (elementwise_kernels.cu instantiates each dtype
// the CPU's check accepts), so the checks are the CPU's.
constexpr KernelEntry kKernels[] = {
    {"Relu", run_unary<UnaryOp::kRelu>, same_as_cpu_16bit},
    {"Sigmoid", run_unary<UnaryOp::kSigmoid>, same_as_cpu_16bit},
    {"Tanh", run_unary<UnaryOp::kTanh>, same_as_cpu_16bit},
    {"Sqrt", run_unary<UnaryOp::kSqrt>, same_as_cpu_16bit},
    {"Erf", run_unary<UnaryOp::kErf>, same_as_cpu_16bit},
    {"HardSigmoid", run_hard_sigmoid, same_as_cpu_16bit},
    {"HardSwish", run_unary<UnaryOp::kHardSwish>, same_as_cpu_16bit},
    {"Clip", run_clip, same_as_cpu},
    {"Dropout", run_dropout, same_as_cpu},
    {"Cast", run_cast, same_as_cpu},
    {"Add", run_binary<BinaryOp::kAdd>, same_as_cpu_16bit},
    {"Sub", run_binary<BinaryOp::kSub>, same_as_cpu_16bit},
    {"Mul", run_binary<BinaryOp::kMul>, same_as_cpu_16bit},
    {"Div", run_binary<BinaryOp::kDiv>, same_as_cpu_16bit},
    {"Pow", run_binary<BinaryOp::kPow>, same_as_cpu},
    {"Equal", run_binary<BinaryOp::kEqual>, same_as_cpu},
    {"Where", run_where, same_as_cpu},
};

}  // namespace

std::span<const KernelEntry> elementwise_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
