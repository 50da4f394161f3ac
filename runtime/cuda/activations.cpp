// The CUDA backend's activations family (families.h), the ops of the CPU backend's
// activations.cpp: Elu, Selu and Softplus (natively on bfloat16 and float16 too) and PRelu, whose
// slope broadcasts to X, the fused Gelu (natively on 16-bit floats too; passes/fuse_gelu.cpp),
// and their gradients (runtime/format/grad_ops.h; GeluGrad, EluGrad and SeluGrad natively on
// 16-bit floats too). This file
// reads attributes and checks shapes; elementwise_kernels.cu and grad_eltwise_kernels.cu compute
// each element as the CPU does.
#include <cstdint>
#include <string>

#include "runtime/cuda/elementwise_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/grad_eltwise_common.h"
#include "runtime/ops/broadcast.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;

void run_elu(const KernelArgs& a) { unary(a, UnaryOp::kElu, {.alpha = a.attrs.f("alpha", 1.0f)}); }

void run_celu(const KernelArgs& a) {
  unary(a, UnaryOp::kCelu, {.alpha = a.attrs.f("alpha", 1.0f)});
}

void celu_grad(const KernelArgs& a) {
  unary_grad(a, UnaryGradOp::kCelu, {.alpha = a.attrs.f("alpha", 1.0f)});
}

// Selu's defaults are ONNX's (float32 roundings of the constants of Klambauer et al. 2017).
void run_selu(const KernelArgs& a) {
  unary(a, UnaryOp::kSelu,
        {.alpha = a.attrs.f("alpha", 1.67326319217681884765625f),
         .gamma = a.attrs.f("gamma", 1.05070102214813232421875f)});
}

// PRelu: the slope broadcasts to X (unidirectionally).
void run_prelu(const KernelArgs& a) {
  const Tensor &x = a.input(0), &slope = a.input(1);
  if (ops::broadcast_shape(x.shape, slope.shape) != x.shape)
    fail(ErrorKind::kShape, "PRelu '{}': the slope {} does not broadcast to X {}", a.name,
         shape_string(slope.shape), shape_string(x.shape));
  run_binary<BinaryOp::kPRelu>(a);
}

// Gelu: approximate "none" or "tanh" (the CPU's check refuses any other before a run).
bool gelu_tanh(const KernelArgs& a) {
  const std::string approximate = a.attrs.s("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    fail(ErrorKind::kUnsupported, "{} '{}': approximate='{}' (\"none\" or \"tanh\")", a.op_type,
         a.name, approximate);
  return approximate == "tanh";
}

void run_gelu(const KernelArgs& a) {
  unary(a, gelu_tanh(a) ? UnaryOp::kGeluTanh : UnaryOp::kGelu, {});
}

// From x alone: the forward output is not read.
void gelu_grad(const KernelArgs& a) {
  unary_grad(a, gelu_tanh(a) ? UnaryGradOp::kGeluTanh : UnaryGradOp::kGelu, {});
}

void elu_grad(const KernelArgs& a) {
  unary_grad(a, UnaryGradOp::kElu, {.alpha = a.attrs.f("alpha", 1.0f)});
}

void selu_grad(const KernelArgs& a) {
  unary_grad(a, UnaryGradOp::kSelu,
             {.alpha = a.attrs.f("alpha", 1.67326319217681884765625f),
              .gamma = a.attrs.f("gamma", 1.05070102214813232421875f)});
}

// PRelu: dx = dy where x > 0, dy * slope elsewhere; d slope = dy * x where x <= 0, summed over
// the axes along which the slope was broadcast.
void prelu_grad(const KernelArgs& a) {
  GradIo io(a);
  Binary b;
  if (!binary_operands(a, io, b)) return;
  if (b.dy->shape != b.lhs->shape)
    fail(ErrorKind::kShape, "PReluGrad '{}': the slope {} does not broadcast to X {}", a.name,
         shape_string(b.rhs->shape), shape_string(b.lhs->shape));
  if (io.dx(0) != nullptr) binary_part(a, 0, BinaryGradOp::kPReluX, *b.lhs, *b.rhs, nullptr, *b.dy);
  if (io.dx(1) != nullptr)
    binary_part(a, 1, BinaryGradOp::kPReluSlope, *b.lhs, *b.rhs, nullptr, *b.dy);
}

// The checks are the CPU's: every signature it accepts has a kernel here; each gradient writes
// every element of its outputs.
constexpr KernelEntry kKernels[] = {
    {"Elu", run_elu, same_as_cpu_16bit},
    {"Celu", run_celu, same_as_cpu},
    {"Selu", run_selu, same_as_cpu_16bit},
    {"Softplus", run_unary<UnaryOp::kSoftplus>, same_as_cpu_16bit},
    {"PRelu", run_prelu, same_as_cpu},
    {"Gelu", run_gelu, same_as_cpu_16bit, /*writes_every_output=*/true},
    {"EluGrad", elu_grad, same_as_cpu_16bit, true},
    {"CeluGrad", celu_grad, same_as_cpu, true},
    {"SeluGrad", selu_grad, same_as_cpu_16bit, true},
    {"SoftplusGrad", run_unary_grad<UnaryGradOp::kSoftplus>, same_as_cpu, true},
    {"PReluGrad", prelu_grad, same_as_cpu, true},
    {"GeluGrad", gelu_grad, same_as_cpu_16bit, true},
};

}  // namespace

std::span<const KernelEntry> activations_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
