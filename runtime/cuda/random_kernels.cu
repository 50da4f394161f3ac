// The CUDA random family's device kernel (random_kernels.h): a grid-stride loop, each element
// drawn in double by runtime/ops/random_element.h and rounded once to the output's type.
#include "runtime/cuda/random_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

template <class T>
__global__ void random_kernel(ops::RandomParams p, uint64_t key, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = static_cast<T>(ops::random_value(p, key, i));
}

}  // namespace

void launch_random(const ops::RandomParams& params, uint64_t node_key, void* out, bool f64,
                   int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  if (f64)
    random_kernel<<<grid, 256, 0, stream>>>(params, node_key, static_cast<double*>(out), n);
  else
    random_kernel<<<grid, 256, 0, stream>>>(params, node_key, static_cast<float*>(out), n);
}

}  // namespace stagecraft::rt::cuda
