// The CUDA resize family's device kernel (resize_kernels.h): a grid-stride loop with int64
// indices around resize_element.h's separable sum, the function the CPU backend runs.
#include "runtime/cuda/resize_kernels.h"
#include "runtime/cuda/update_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void separable_sum_kernel(float* destination, const float* source, int64_t n,
                                     ops::SeparableTable table) {
  const int64_t stride = int64_t{blockDim.x} * gridDim.x;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += stride)
    destination[e] = ops::separable_sum(table, source, e);
}

}  // namespace

void launch_separable_sum(float* destination, const float* source, int64_t n,
                          const ops::SeparableTable& table, cudaStream_t stream) {
  if (n <= 0) return;
  separable_sum_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(destination, source, n,
                                                                       table);
}

}  // namespace stagecraft::rt::cuda
