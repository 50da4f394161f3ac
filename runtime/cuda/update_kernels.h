#pragma once
/// \file
/// The device's own update kernels (update_kernels.cu): gradient sums and the optimizer rules
/// of runtime/core/device.h, one fused elementwise kernel each over n contiguous float32
/// elements, queued on `stream`. Elementwise, so every device gets the same bytes for the same
/// inputs whatever the launch shape.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "runtime/core/device.h"

namespace stagecraft::rt::cuda {

void launch_accumulate(float* sum, const float* add, int64_t n, cudaStream_t stream);
/// sum += add on bfloat16 (or, `float16`, float16) elements, each sum in float32 rounded to
/// nearest even.
void launch_accumulate_16bit(void* sum, const void* add, int64_t n, bool float16,
                             cudaStream_t stream);
/// g *= factor; sets *nonfinite (a device int) to 1 when some result is not finite.
void launch_unscale(float* g, int64_t n, float factor, int* nonfinite, cudaStream_t stream);
void launch_sgd(float* w, const float* g, int64_t n, const SgdUpdate& u, cudaStream_t stream);
void launch_momentum(float* w, const float* g, float* v, int64_t n, const MomentumUpdate& u,
                     cudaStream_t stream);
void launch_adam(float* w, const float* g, float* m, float* v, int64_t n, const AdamUpdate& u,
                 cudaStream_t stream);
/// One weight of launch_adam_many: n float32 elements of each.
struct AdamArrays {
  float* w = nullptr;
  float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t n = 0;
};
/// launch_adam on every item with one `u`, and with `zero_grads` each g zeroed after it is
/// read: up to 64 weights a launch (each weight's elements in 4096-element blocks) rather than
/// a launch per weight and a memset per gradient. The same bytes as the launches one by one.
void launch_adam_many(const AdamArrays* items, size_t count, const AdamUpdate& u, bool zero_grads,
                      cudaStream_t stream);
void launch_adagrad(float* w, const float* g, float* h, int64_t n, const AdagradUpdate& u,
                    cudaStream_t stream);

/// Blocks for a grid-stride loop over n elements (at most 65535 x 8 blocks of 256 threads).
inline unsigned grid_for(int64_t n, int threads = 256) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

}  // namespace stagecraft::rt::cuda
