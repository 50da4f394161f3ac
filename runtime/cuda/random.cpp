// The CUDA backend's random family (families.h), the ops of the CPU backend's random.cpp:
// RandomNormalLike, RandomUniformLike, RandomNormal and RandomUniform, float32 or float64, the
// same numbers as the CPU's (random_kernels.cu draws runtime/ops/random_element.h's).
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/random_kernels.h"
#include "runtime/ops/random_rules.h"

namespace stagecraft::rt::cuda {
namespace {

void random(const KernelArgs& a) {
  ops::expect_random_shape(a);
  Tensor& y = *a.out[0];
  launch_random(ops::random_params(a), ops::random_key_of(a), y.data, y.dtype == DType::kFloat64,
                y.numel(), context(a).stream());
  check_launch(a);
}

// The checks are the CPU's.
constexpr KernelEntry kKernels[] = {
    {"RandomNormalLike", random, same_as_cpu},
    {"RandomUniformLike", random, same_as_cpu},
    {"RandomNormal", random, same_as_cpu},
    {"RandomUniform", random, same_as_cpu},
};

}  // namespace

std::span<const KernelEntry> random_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
