// The CUDA reduction family's device kernels (reduce_kernels.h): grid-stride loops with int64
// indices around reduce_element.h's functions. A forward output is one thread's sequential fold
// (the CPU's order) or, for long reductions over few outputs, one block's: each thread folds a
// strided share, then a fixed tree of warp shuffles folds the shares.
#include "runtime/cuda/reduce_kernels.h"
#include "runtime/cuda/update_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t first_index() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return int64_t{blockDim.x} * gridDim.x; }

// `value` folded over the block with reduce_fold (warps first, then one warp over the warps'
// results), returned to every thread. Every thread of the block must call it, with blockDim.x a
// multiple of 32 and at most 1024; `identity` stands in for missing warps.
template <class Acc>
__device__ Acc block_fold(Reduction kind, Acc value, Acc identity) {
  __shared__ Acc partial[32];
  __shared__ Acc total;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2)
    value = reduce_fold(kind, value, __shfl_down_sync(0xffffffffu, value, offset));
  __syncthreads();  // `partial` and `total` may still be read from an earlier call
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    const unsigned warps = (blockDim.x + 31) / 32;
    value = lane < warps ? partial[lane] : identity;
    for (int offset = 16; offset > 0; offset /= 2)
      value = reduce_fold(kind, value, __shfl_down_sync(0xffffffffu, value, offset));
    if (lane == 0) total = value;
  }
  __syncthreads();
  return total;
}

template <class T>
__global__ void reduce_thread_kernel(T* y, const T* x, Reduction kind, ReduceGroups s) {
  for (int64_t o = first_index(); o < s.outputs; o += grid_stride())
    y[o] = reduce_output(kind, s, x, o);
}

template <class T>
__global__ void reduce_block_kernel(T* y, const T* x, Reduction kind, ReduceGroups s) {
  using Acc = ReduceAcc<T>;
  const Acc identity = reduce_identity<T>(kind);
  const double lowest = -static_cast<double>(INFINITY);
  for (int64_t o = blockIdx.x; o < s.outputs; o += gridDim.x) {
    const T* base = x + reduce_base(s, o);
    double shift = 0.0;
    if (kind == Reduction::kLogSumExp) {  // the same for the whole block
      double top = lowest;
      for (int64_t r = threadIdx.x; r < s.length; r += blockDim.x)
        top = reduce_top(top, static_cast<double>(base[reduce_offset(s, r)]));
      // No top is NaN (reduce_top skips NaNs), so Max's fold is reduce_top's.
      shift = reduce_shift(block_fold<double>(Reduction::kMax, top, lowest));
    }
    Acc acc = identity;
    for (int64_t r = threadIdx.x; r < s.length; r += blockDim.x)
      acc = reduce_fold(kind, acc, reduce_term(kind, base[reduce_offset(s, r)], shift));
    acc = block_fold<Acc>(kind, acc, identity);
    if (threadIdx.x == 0) y[o] = reduce_finish<T>(kind, acc, shift);
  }
}

// Whether outputs of `s` go one block each: long reductions over few outputs.
bool block_per_output(const ReduceGroups& s) {
  return s.length >= 64 && s.outputs < int64_t{1} << 20;
}

unsigned output_blocks(const ReduceGroups& s) {
  return static_cast<unsigned>(s.outputs < 65535 * 16 ? s.outputs : 65535 * 16);
}

template <class T>
void launch_reduce_as(T* y, const T* x, Reduction kind, const ReduceGroups& s,
                      cudaStream_t stream) {
  if (s.outputs <= 0) return;
  if (block_per_output(s))
    reduce_block_kernel<T><<<output_blocks(s), kThreads, 0, stream>>>(y, x, kind, s);
  else
    reduce_thread_kernel<T><<<grid_for(s.outputs, kThreads), kThreads, 0, stream>>>(y, x, kind, s);
}

__global__ void tie_share_thread_kernel(float* share, const float* x, const float* y,
                                        const float* dy, ReduceGroups s) {
  for (int64_t o = first_index(); o < s.outputs; o += grid_stride())
    share[o] = reduce_tie_share(s, x, y[o], dy[o], o);
}

// reduce_tie_share with the ties of an output counted by a block (an exact integer count).
__global__ void tie_share_block_kernel(float* share, const float* x, const float* y,
                                       const float* dy, ReduceGroups s) {
  for (int64_t o = blockIdx.x; o < s.outputs; o += gridDim.x) {
    const float* base = x + reduce_base(s, o);
    long long ties = 0;
    for (int64_t r = threadIdx.x; r < s.length; r += blockDim.x)
      ties += reduce_hit(base[reduce_offset(s, r)], y[o]) ? 1 : 0;
    ties = block_fold<long long>(Reduction::kSum, ties, 0);
    if (threadIdx.x == 0) share[o] = ties == 0 ? 0.0f : dy[o] / static_cast<float>(ties);
  }
}

__global__ void grad_element_kernel(Reduction kind, float* dx, const float* x, const float* y,
                                    const float* dy, const float* share, int64_t n,
                                    ReduceGroups s) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t o = reduce_output_of(s, i);
    dx[i] = reduce_grad_element(kind, x[i], y == nullptr ? 0.0f : y[o], dy[o],
                                share == nullptr ? 0.0f : share[o]);
  }
}

__global__ void prod_grad_kernel(float* dx, const float* x, const float* dy, ReduceGroups s) {
  for (int64_t o = first_index(); o < s.outputs; o += grid_stride())
    reduce_prod_grad_output(s, x, dy[o], dx, o);
}

}  // namespace

void launch_reduce(float* y, const float* x, Reduction kind, const ReduceGroups& s,
                   cudaStream_t stream) {
  launch_reduce_as(y, x, kind, s, stream);
}
void launch_reduce(double* y, const double* x, Reduction kind, const ReduceGroups& s,
                   cudaStream_t stream) {
  launch_reduce_as(y, x, kind, s, stream);
}
void launch_reduce(int32_t* y, const int32_t* x, Reduction kind, const ReduceGroups& s,
                   cudaStream_t stream) {
  launch_reduce_as(y, x, kind, s, stream);
}
void launch_reduce(int64_t* y, const int64_t* x, Reduction kind, const ReduceGroups& s,
                   cudaStream_t stream) {
  launch_reduce_as(y, x, kind, s, stream);
}

void launch_reduce_grad(Reduction kind, float* dx, const float* x, const float* y, const float* dy,
                        float* share, int64_t n, const ReduceGroups& s, cudaStream_t stream) {
  if (n <= 0 || s.outputs <= 0) return;
  if (kind == Reduction::kProd) {
    prod_grad_kernel<<<grid_for(s.outputs, kThreads), kThreads, 0, stream>>>(dx, x, dy, s);
    return;
  }
  const bool ties = kind == Reduction::kMax || kind == Reduction::kMin;
  if (ties && block_per_output(s))
    tie_share_block_kernel<<<output_blocks(s), kThreads, 0, stream>>>(share, x, y, dy, s);
  else if (ties)
    tie_share_thread_kernel<<<grid_for(s.outputs, kThreads), kThreads, 0, stream>>>(share, x, y, dy,
                                                                                    s);
  grad_element_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(kind, dx, x, y, dy,
                                                                      ties ? share : nullptr, n, s);
}

}  // namespace stagecraft::rt::cuda
