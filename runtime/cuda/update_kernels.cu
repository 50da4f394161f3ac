// The CUDA backend's update kernels (update_kernels.h): grid-stride loops, one thread per
// element, the same formulas as the CPU backend's loops (runtime/cpu/update_kernels.cpp).
#include "runtime/cuda/update_kernels.h"

#include "runtime/cuda/elementwise_device.cuh"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void accumulate_kernel(float* sum, const float* add, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x)
    sum[i] += add[i];
}

// 16-bit gradients (mixed precision: a tensor read by several later stages): each sum in
// float32, rounded to nearest even once.
template <class T>
__global__ void accumulate_16bit_kernel(T* sum, const T* add, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float s = eltwise::to_float(sum[i]) + eltwise::to_float(add[i]);
    if constexpr (std::is_same_v<T, eltwise::Half>)
      sum[i] = eltwise::to_half(s);
    else
      sum[i] = eltwise::to_bfloat16(s);
  }
}

// g *= factor; any element not finite afterwards sets *nonfinite (every writer writes 1).
__global__ void unscale_kernel(float* g, int64_t n, float factor, int* nonfinite) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float x = g[i] * factor;
    g[i] = x;
    if (!isfinite(x)) *nonfinite = 1;
  }
}

__global__ void sgd_kernel(float* w, const float* g, int64_t n, float lr, float l2) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x)
    w[i] -= lr * (g[i] + l2 * w[i]);
}

__global__ void momentum_kernel(float* w, const float* g, float* v, int64_t n, MomentumUpdate p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float gr = g[i] + p.l2 * w[i];
    const float vi = p.alpha * v[i] + p.beta * gr;
    v[i] = vi;
    w[i] -= p.lr * (p.nesterov ? gr + p.alpha * vi : vi);
  }
}

// Element i of one Adam update (both kernels below: the same bytes).
__device__ __forceinline__ void adam_element(float* w, const float* g, float* m, float* v,
                                             int64_t i, const AdamUpdate& p) {
  const float gr = g[i] + p.l2 * w[i];
  const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * gr;
  const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * (gr * gr);
  m[i] = mi;
  v[i] = vi;
  w[i] = p.post_scale *
         (p.pre_scale * w[i] - p.step_size * (mi / (sqrtf(vi) * p.denom_scale + p.eps)));
}

__global__ void adam_kernel(float* w, const float* g, float* m, float* v, int64_t n, AdamUpdate p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x)
    adam_element(w, g, m, v, i, p);
}

// Up to kAdamSlots weights in one launch: weight k takes chunks [first_block[k],
// first_block[k + 1]), each kAdamChunk elements of it, the blocks striding over the chunks; a
// block finds a chunk's weight by binary search over the launch's parameters. With `zero`, each
// gradient element is zeroed once read.
constexpr int kAdamSlots = 64;
constexpr int64_t kAdamChunk = 4096;
struct AdamSlots {
  float* w[kAdamSlots];
  float* g[kAdamSlots];
  float* m[kAdamSlots];
  float* v[kAdamSlots];
  int64_t n[kAdamSlots];
  int64_t first_block[kAdamSlots + 1];
  int count;
};
static_assert(sizeof(AdamSlots) + sizeof(AdamUpdate) + 8 <= 4096,
              "kernel parameters are limited to 4 KiB");

__global__ void adam_many_kernel(AdamSlots s, AdamUpdate p, bool zero) {
  for (int64_t chunk = blockIdx.x; chunk < s.first_block[s.count]; chunk += gridDim.x) {
    int lo = 0, hi = s.count - 1;  // the last k with first_block[k] <= chunk
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (s.first_block[mid] <= chunk)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int k = lo;
    const int64_t start = (chunk - s.first_block[k]) * kAdamChunk;
    const int64_t end = start + kAdamChunk < s.n[k] ? start + kAdamChunk : s.n[k];
    for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
      adam_element(s.w[k], s.g[k], s.m[k], s.v[k], i, p);
      if (zero) s.g[k][i] = 0.0f;
    }
  }
}

__global__ void adagrad_kernel(float* w, const float* g, float* h, int64_t n, AdagradUpdate p) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float gr = g[i] + p.l2 * w[i];
    const float hi = h[i] + gr * gr;
    h[i] = hi;
    w[i] -= p.lr * gr / (sqrtf(hi) + p.eps);
  }
}

}  // namespace

void launch_accumulate(float* sum, const float* add, int64_t n, cudaStream_t stream) {
  if (n > 0) accumulate_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(sum, add, n);
}

void launch_accumulate_16bit(void* sum, const void* add, int64_t n, bool float16,
                             cudaStream_t stream) {
  if (n <= 0) return;
  if (float16)
    accumulate_16bit_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<eltwise::Half*>(sum), static_cast<const eltwise::Half*>(add), n);
  else
    accumulate_16bit_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<eltwise::BFloat16*>(sum), static_cast<const eltwise::BFloat16*>(add), n);
}

void launch_unscale(float* g, int64_t n, float factor, int* nonfinite, cudaStream_t stream) {
  if (n > 0)
    unscale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(g, n, factor, nonfinite);
}

void launch_sgd(float* w, const float* g, int64_t n, const SgdUpdate& u, cudaStream_t stream) {
  if (n > 0) sgd_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(w, g, n, u.lr, u.l2);
}

void launch_momentum(float* w, const float* g, float* v, int64_t n, const MomentumUpdate& u,
                     cudaStream_t stream) {
  if (n > 0) momentum_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(w, g, v, n, u);
}

void launch_adam(float* w, const float* g, float* m, float* v, int64_t n, const AdamUpdate& u,
                 cudaStream_t stream) {
  if (n > 0) adam_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(w, g, m, v, n, u);
}

void launch_adam_many(const AdamArrays* items, size_t count, const AdamUpdate& u, bool zero_grads,
                      cudaStream_t stream) {
  size_t next = 0;
  while (next < count) {
    AdamSlots s{};
    int64_t blocks = 0;
    while (next < count && s.count < kAdamSlots) {
      const AdamArrays& a = items[next++];
      if (a.n <= 0) continue;
      s.w[s.count] = a.w;
      s.g[s.count] = a.g;
      s.m[s.count] = a.m;
      s.v[s.count] = a.v;
      s.n[s.count] = a.n;
      s.first_block[s.count] = blocks;
      blocks += (a.n + kAdamChunk - 1) / kAdamChunk;
      ++s.count;
    }
    s.first_block[s.count] = blocks;
    if (s.count == 0) continue;
    // The chunks grid-stride over at most 2^31 - 1 blocks (a grid's limit).
    const int64_t grid = blocks < (int64_t{1} << 31) - 1 ? blocks : (int64_t{1} << 31) - 1;
    adam_many_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(s, u, zero_grads);
  }
}

void launch_adagrad(float* w, const float* g, float* h, int64_t n, const AdagradUpdate& u,
                    cudaStream_t stream) {
  if (n > 0) adagrad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(w, g, h, n, u);
}

}  // namespace stagecraft::rt::cuda
