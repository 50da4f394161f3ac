// The CUDA random family's device kernel (random_kernels.h): a grid-stride loop, each element
// drawn in double by runtime/ops/random_element.h and rounded once to the output's type.
#include "runtime/cuda/random_kernels.h"

#include "runtime/cuda/elementwise_device.cuh"
#include "runtime/cuda/update_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

using eltwise::first_index;
using eltwise::grid_stride;

template <class T>
__global__ void random_kernel(ops::RandomParams p, uint64_t key, T* out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = static_cast<T>(ops::random_value(p, key, i));
}

}  // namespace

void launch_random(const ops::RandomParams& params, uint64_t node_key, void* out, bool f64,
                   int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned grid = grid_for(n);
  if (f64)
    random_kernel<<<grid, 256, 0, stream>>>(params, node_key, static_cast<double*>(out), n);
  else
    random_kernel<<<grid, 256, 0, stream>>>(params, node_key, static_cast<float*>(out), n);
}

}  // namespace stagecraft::rt::cuda
