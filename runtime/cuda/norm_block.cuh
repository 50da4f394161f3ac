#pragma once
// Block-wide reductions for the CUDA data and norm kernels (device code only): a fixed tree of
// warp shuffles then one warp over the warps' partials, so a result depends only on the launch
// shape, never on timing. Every thread of the block must call them (they synchronise), with
// blockDim.x a multiple of 32 and at most 1024.
#include <cuda_runtime_api.h>

namespace stagecraft::rt::cuda {

/// The sum of `value` over the block, returned to every thread.
template <class T>
__device__ T block_sum(T value) {
  __shared__ T partial[32];
  __shared__ T total;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_down_sync(0xffffffffu, value, offset);
  __syncthreads();  // `partial` and `total` may still be read from an earlier call
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const unsigned warps = (blockDim.x + 31) / 32;
    value = lane < warps ? partial[lane] : T(0);
    for (int offset = 16; offset > 0; offset /= 2)
      value += __shfl_down_sync(0xffffffffu, value, offset);
    if (lane == 0) total = value;
  }
  __syncthreads();
  return total;
}

/// The maximum of `value` over the block, returned to every thread.
__device__ inline float block_max(float value) {
  __shared__ float partial[32];
  __shared__ float total;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_down_sync(0xffffffffu, value, offset));
  __syncthreads();
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const unsigned warps = (blockDim.x + 31) / 32;
    value = lane < warps ? partial[lane] : -INFINITY;
    for (int offset = 16; offset > 0; offset /= 2)
      value = fmaxf(value, __shfl_down_sync(0xffffffffu, value, offset));
    if (lane == 0) total = value;
  }
  __syncthreads();
  return total;
}

}  // namespace stagecraft::rt::cuda
