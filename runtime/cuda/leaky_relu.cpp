// The CUDA backend's LeakyRelu family (families.h), the op of the CPU backend's
// leaky_relu.cpp: y = x for x >= 0, alpha * x below (attribute alpha, default 0.01), natively on
// bfloat16 and float16 too, and its float32 gradient dx = dy where x >= 0, alpha * dy below.
#include <cstdint>

#include "runtime/cuda/elementwise_common.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/grad_eltwise_common.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradIo;
using ops::expect_dy_shape;

void run_leaky_relu(const KernelArgs& a) {
  unary(a, UnaryOp::kLeakyRelu, {.alpha = a.attrs.f("alpha", 0.01f)});
}

// LeakyRelu: dx = dy * (x < 0 ? alpha : 1); the forward output is not needed.
void leaky_relu_grad(const KernelArgs& a) {
  GradIo io(a, {.n_min = 1, .n_max = 1, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *px = nullptr;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  expect_dy_shape(a, *dy, x.shape);
  launch_unary_grad(UnaryGradOp::kLeakyRelu, x.as<float>(), nullptr, dy->as<float>(),
                    dx->as<float>(), x.numel(), {.alpha = a.attrs.f("alpha", 0.01f)},
                    context(a).stream());
  check_launch(a);
}

// The checks are the CPU's: every signature it accepts has a kernel here; each gradient writes
// every element of its outputs.
constexpr KernelEntry kKernels[] = {
    {"LeakyRelu", run_leaky_relu, same_as_cpu_16bit},
    {"LeakyReluGrad", leaky_relu_grad, same_as_cpu, true},
};

}  // namespace

std::span<const KernelEntry> leaky_relu_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
