// The random ops (see families.h): RandomNormalLike and RandomUniformLike (the input's shape;
// torch.randn_like, torch.rand_like, a VAE's reparameterisation), RandomNormal and
// RandomUniform (the `shape` attribute), float32 or float64. Each element is
// runtime/ops/random_element.h's draw for (the node's key, its index), as on CUDA. No gradient:
// the numbers depend on no input's values.
#include <string>

#include "runtime/cpu/families.h"
#include "runtime/ops/random_rules.h"

namespace stagecraft::rt::cpu {
namespace {

template <class T>
void draw(const ops::RandomParams& p, uint64_t key, T* out, int64_t n) {
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(ops::random_value(p, key, i));
}

void random(const KernelArgs& a) {
  ops::expect_random_shape(a);
  const ops::RandomParams p = ops::random_params(a);
  const uint64_t key = ops::random_key_of(a);
  Tensor& y = *a.out[0];
  if (y.dtype == DType::kFloat64) return draw(p, key, y.as<double>(), y.numel());
  draw(p, key, y.as<float>(), y.numel());
}

constexpr KernelEntry kKernels[] = {
    {"RandomNormalLike", random, ops::check_random},
    {"RandomUniformLike", random, ops::check_random},
    {"RandomNormal", random, ops::check_random},
    {"RandomUniform", random, ops::check_random},
};

}  // namespace

std::span<const KernelEntry> random_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
