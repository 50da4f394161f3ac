// The CUDA conv family's device kernels (conv_kernels.h): pooling and its gradients, each
// thread computing one element by conv_window.h (ONNX's window rules as the CPU's
// runtime/cpu/window.h computes them), the explicit padding of Conv's input for asymmetric
// pads, and Conv's bias. Grid-stride loops with int64 indices; the gradients gather in a fixed
// order (no atomics).
#include "runtime/cuda/conv_kernels.h"
#include "runtime/cuda/norm_block.cuh"
#include "runtime/cuda/update_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t first_index() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return int64_t{blockDim.x} * gridDim.x; }

template <class T>
__global__ void max_pool_kernel(const T* x, T* y, int64_t* indices, bool column_major,
                                PoolShape s) {
  const int64_t n = s.planes * s.out_plane();
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    int64_t index;
    y[e] = max_pool_element(s, x, e, column_major, index);
    if (indices != nullptr) indices[e] = index;
  }
}

__global__ void average_pool_kernel(const float* x, float* y, bool include_pad, PoolShape s) {
  const int64_t n = s.planes * s.out_plane();
  for (int64_t e = first_index(); e < n; e += grid_stride())
    y[e] = average_pool_element(s, x, e, include_pad);
}

// One block per plane (grid-stride over planes), the sum in double by a fixed tree.
__global__ void global_average_pool_kernel(const float* x, float* y, int64_t planes, int64_t size) {
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    double sum = 0;
    for (int64_t i = threadIdx.x; i < size; i += blockDim.x) sum += x[p * size + i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) y[p] = static_cast<float>(sum / static_cast<double>(size));
  }
}

__global__ void argmax_kernel(const float* x, int64_t* argmax, PoolShape s) {
  const int64_t n = s.planes * s.out_plane();
  for (int64_t e = first_index(); e < n; e += grid_stride()) argmax[e] = argmax_element(s, x, e);
}

__global__ void max_pool_grad_kernel(const float* dy, const int64_t* argmax, float* dx,
                                     PoolShape s) {
  const int64_t n = s.planes * s.in_plane();
  for (int64_t e = first_index(); e < n; e += grid_stride())
    dx[e] = max_pool_grad_element(s, dy, argmax, e);
}

__global__ void average_pool_grad_kernel(const float* dy, float* dx, bool include_pad,
                                         PoolShape s) {
  const int64_t n = s.planes * s.in_plane();
  for (int64_t e = first_index(); e < n; e += grid_stride())
    dx[e] = average_pool_grad_element(s, dy, e, include_pad);
}

__global__ void global_average_pool_grad_kernel(const float* dy, float* dx, int64_t planes,
                                                int64_t size) {
  const int64_t n = planes * size;
  for (int64_t e = first_index(); e < n; e += grid_stride())
    dx[e] = dy[e / size] / static_cast<float>(size);
}

__global__ void pad_kernel(const float* x, float* padded, PadShape s) {
  const int64_t n = s.planes * s.padded[0] * s.padded[1] * s.padded[2];
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const Position p = split(e, s.padded);
    const int64_t d = p.d - s.before[0], h = p.h - s.before[1], w = p.w - s.before[2];
    const bool inside = d >= 0 && d < s.in[0] && h >= 0 && h < s.in[1] && w >= 0 && w < s.in[2];
    padded[e] = inside ? x[((p.plane * s.in[0] + d) * s.in[1] + h) * s.in[2] + w] : 0.0f;
  }
}

__global__ void crop_kernel(const float* padded, float* x, PadShape s) {
  const int64_t n = s.planes * s.in[0] * s.in[1] * s.in[2];
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const Position p = split(e, s.in);
    x[e] = padded[((p.plane * s.padded[0] + p.d + s.before[0]) * s.padded[1] + p.h + s.before[1]) *
                      s.padded[2] +
                  p.w + s.before[2]];
  }
}

__global__ void add_channel_bias_kernel(float* y, const float* bias, int64_t n, int64_t channels,
                                        int64_t size) {
  for (int64_t e = first_index(); e < n; e += grid_stride()) y[e] += bias[(e / size) % channels];
}

// One block per channel (grid-stride over channels).
__global__ void channel_sum_kernel(const float* dy, float* db, int64_t batch, int64_t channels,
                                   int64_t size) {
  const int64_t count = batch * size;
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    double sum = 0;
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x)
      sum += dy[((j / size) * channels + c) * size + j % size];
    sum = block_sum(sum);
    if (threadIdx.x == 0) db[c] = static_cast<float>(sum);
  }
}

// Blocks for one block per row over `rows` rows.
unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(rows < 65535 * 16 ? (rows < 1 ? 1 : rows) : 65535 * 16);
}

int64_t outputs(const PoolShape& s) { return s.planes * s.out_plane(); }
int64_t inputs(const PoolShape& s) { return s.planes * s.in_plane(); }

}  // namespace

void launch_max_pool(PoolElement element, const void* x, void* y, int64_t* indices,
                     bool column_major, const PoolShape& shape, cudaStream_t stream) {
  const unsigned blocks = grid_for(outputs(shape), kThreads);
  switch (element) {
    case PoolElement::kFloat32:
      max_pool_kernel<float><<<blocks, kThreads, 0, stream>>>(
          static_cast<const float*>(x), static_cast<float*>(y), indices, column_major, shape);
      break;
    case PoolElement::kInt8:
      max_pool_kernel<int8_t><<<blocks, kThreads, 0, stream>>>(
          static_cast<const int8_t*>(x), static_cast<int8_t*>(y), indices, column_major, shape);
      break;
    case PoolElement::kUInt8:
      max_pool_kernel<uint8_t><<<blocks, kThreads, 0, stream>>>(
          static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y), indices, column_major, shape);
      break;
  }
}

void launch_average_pool(const float* x, float* y, bool include_pad, const PoolShape& shape,
                         cudaStream_t stream) {
  average_pool_kernel<<<grid_for(outputs(shape), kThreads), kThreads, 0, stream>>>(
      x, y, include_pad, shape);
}

void launch_global_average_pool(const float* x, float* y, int64_t planes, int64_t size,
                                cudaStream_t stream) {
  global_average_pool_kernel<<<row_blocks(planes), kThreads, 0, stream>>>(x, y, planes, size);
}

void launch_max_pool_grad(const float* x, const float* dy, float* dx, int64_t* argmax,
                          const PoolShape& shape, cudaStream_t stream) {
  argmax_kernel<<<grid_for(outputs(shape), kThreads), kThreads, 0, stream>>>(x, argmax, shape);
  max_pool_grad_kernel<<<grid_for(inputs(shape), kThreads), kThreads, 0, stream>>>(dy, argmax, dx,
                                                                                   shape);
}

void launch_average_pool_grad(const float* dy, float* dx, bool include_pad, const PoolShape& shape,
                              cudaStream_t stream) {
  average_pool_grad_kernel<<<grid_for(inputs(shape), kThreads), kThreads, 0, stream>>>(
      dy, dx, include_pad, shape);
}

void launch_global_average_pool_grad(const float* dy, float* dx, int64_t planes, int64_t size,
                                     cudaStream_t stream) {
  global_average_pool_grad_kernel<<<grid_for(planes * size, kThreads), kThreads, 0, stream>>>(
      dy, dx, planes, size);
}

void launch_pad(const float* x, float* padded, const PadShape& shape, cudaStream_t stream) {
  const int64_t n = shape.planes * shape.padded[0] * shape.padded[1] * shape.padded[2];
  pad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, padded, shape);
}

void launch_crop(const float* padded, float* x, const PadShape& shape, cudaStream_t stream) {
  const int64_t n = shape.planes * shape.in[0] * shape.in[1] * shape.in[2];
  crop_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(padded, x, shape);
}

void launch_add_channel_bias(float* y, const float* bias, int64_t n, int64_t channels, int64_t size,
                             cudaStream_t stream) {
  const int64_t total = n * channels * size;
  add_channel_bias_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(y, bias, total,
                                                                              channels, size);
}

void launch_channel_sum(const float* dy, float* db, int64_t n, int64_t channels, int64_t size,
                        cudaStream_t stream) {
  channel_sum_kernel<<<row_blocks(channels), kThreads, 0, stream>>>(dy, db, n, channels, size);
}

}  // namespace stagecraft::rt::cuda
