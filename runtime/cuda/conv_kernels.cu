// The CUDA conv family's device kernels (conv_kernels.h): pooling and its gradients, each
// thread computing one element by conv_window.h (ONNX's window rules as the CPU's
// runtime/ops/window.h computes them), the explicit padding of Conv's input for asymmetric
// pads, and Conv's bias. Grid-stride loops with int64 indices; the gradients gather in a fixed
// order (no atomics).

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "runtime/cuda/conv_kernels.h"
#include "runtime/cuda/elementwise_device.cuh"
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

template <class T>
__global__ void pad_kernel(const T* x, T* padded, PadShape s) {
  const int64_t n = s.planes * s.padded[0] * s.padded[1] * s.padded[2];
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const Position p = split(e, s.padded);
    const int64_t d = p.d - s.before[0], h = p.h - s.before[1], w = p.w - s.before[2];
    const bool inside = d >= 0 && d < s.in[0] && h >= 0 && h < s.in[1] && w >= 0 && w < s.in[2];
    padded[e] = inside ? x[((p.plane * s.in[0] + d) * s.in[1] + h) * s.in[2] + w] : T{};
  }
}

template <class T>
__global__ void crop_kernel(const T* padded, T* x, PadShape s) {
  const int64_t n = s.planes * s.in[0] * s.in[1] * s.in[2];
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const Position p = split(e, s.in);
    x[e] = padded[((p.plane * s.padded[0] + p.d + s.before[0]) * s.padded[1] + p.h + s.before[1]) *
                      s.padded[2] +
                  p.w + s.before[2]];
  }
}

// V elements of T read or written as one (V * sizeof(T) bytes, at most 16, so aligned).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// One thread per V elements (V dividing size: one channel's) over y as [n, channels, size],
// index arithmetic in I (uint32_t where the vectors' count fits, else int64_t): ResNet-50's
// planes are 56x56 .. 7x7, so a thread per plane row or a block per plane leaves most threads
// idle (measured slower on an H200: 4.62 against 3.79 ms a step), and a 64-bit division per
// element was most of the kernel's time (2026-11-30's lease: 3.66 ms a ResNet-50 mixed step
// for about 1 ms of reads and writes).
template <class T, int V, class I>
__global__ void add_channel_bias_kernel(T* y, const T* bias, I vectors, I plane_vectors,
                                        I channels) {
  const I stride = static_cast<I>(blockDim.x) * gridDim.x;
  for (I e = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; e < vectors; e += stride) {
    const float b = eltwise::convert<float>(bias[(e / plane_vectors) % channels]);
    Pack<T, V> pack = reinterpret_cast<const Pack<T, V>*>(y)[e];
#pragma unroll
    for (int k = 0; k < V; ++k)
      pack.v[k] = eltwise::convert<T>(eltwise::convert<float>(pack.v[k]) + b);
    reinterpret_cast<Pack<T, V>*>(y)[e] = pack;
  }
}

// Channel c's sum over images [per_slice y, per_slice (y + 1)) of its planes, for c =
// blockIdx.x and slice y = blockIdx.y: each thread walks the slice's V-element vectors a block
// apart, carrying (image, vector) and dividing only when it passes a plane's end, each vector's
// elements added in order, in double; then a fixed tree over the block. To partial[y * channels
// + c], or straight to db[c] (rounded once) where there is one slice (partial null).
template <class T, int V>
__global__ void channel_partials_kernel(const T* dy, T* db, double* partial, int64_t batch,
                                        int64_t channels, int64_t size, int64_t per_slice) {
  const int64_t c = blockIdx.x;
  const int64_t b1 = min(batch, (blockIdx.y + 1) * per_slice);
  const int64_t plane_vectors = size / V;
  double sum = 0;
  if (plane_vectors > 0) {
    int64_t b = blockIdx.y * per_slice + threadIdx.x / plane_vectors,
            i = threadIdx.x % plane_vectors;
    while (b < b1) {
      const Pack<T, V> pack =
          reinterpret_cast<const Pack<T, V>*>(dy + (b * channels + c) * size)[i];
#pragma unroll
      for (int k = 0; k < V; ++k) sum += eltwise::convert<float>(pack.v[k]);
      i += blockDim.x;
      if (i >= plane_vectors) {
        b += i / plane_vectors;
        i %= plane_vectors;
      }
    }
  }
  sum = block_sum(sum);
  if (threadIdx.x != 0) return;
  if (partial != nullptr)
    partial[blockIdx.y * channels + c] = sum;
  else
    // float32: rounded to nearest; 16-bit: through float32 rounded to odd, so the result is
    // the direct rounding of the sum (eltwise::convert).
    db[c] = eltwise::convert<T>(sum);
}

// db[c] = the sum of channel c's slices' partials in slice order, rounded once.
template <class T>
__global__ void channel_finish_kernel(const double* partial, T* db, int64_t channels,
                                      int64_t slices) {
  for (int64_t c = first_index(); c < channels; c += grid_stride()) {
    double sum = 0;
    for (int64_t y = 0; y < slices; ++y) sum += partial[y * channels + c];
    db[c] = eltwise::convert<T>(sum);
  }
}

// The widest vector of T (at most 16 bytes) that divides `size` and whose alignment every
// pointer in `pointers` has: 1 where none does.
template <class T>
int vector_width(int64_t size, std::initializer_list<const void*> pointers) {
  for (int v = static_cast<int>(16 / sizeof(T)); v > 1; v /= 2) {
    bool fits = size % v == 0;
    for (const void* p : pointers)
      fits = fits && reinterpret_cast<uintptr_t>(p) % (sizeof(T) * v) == 0;
    if (fits) return v;
  }
  return 1;
}

// `launch(std::integral_constant<int, V>)` for V = v (1, 2, 4 or 8).
template <class F>
void with_width(int v, F launch) {
  switch (v) {
    case 8:
      return launch(std::integral_constant<int, 8>{});
    case 4:
      return launch(std::integral_constant<int, 4>{});
    case 2:
      return launch(std::integral_constant<int, 2>{});
    default:
      return launch(std::integral_constant<int, 1>{});
  }
}

// `launch(tag)` with the element type of `dtype` (float32, bfloat16 or float16) as tag's type.
template <class F>
void with_float_type(DType dtype, F launch) {
  switch (dtype) {
    case DType::kBFloat16:
      return launch(eltwise::Tag<eltwise::BFloat16>{});
    case DType::kFloat16:
      return launch(eltwise::Tag<eltwise::Half>{});
    default:
      return launch(eltwise::Tag<float>{});
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

void launch_pad(DType dtype, const void* x, void* padded, const PadShape& shape,
                cudaStream_t stream) {
  const int64_t n = shape.planes * shape.padded[0] * shape.padded[1] * shape.padded[2];
  with_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    pad_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                               static_cast<T*>(padded), shape);
  });
}

void launch_crop(DType dtype, const void* padded, void* x, const PadShape& shape,
                 cudaStream_t stream) {
  const int64_t n = shape.planes * shape.in[0] * shape.in[1] * shape.in[2];
  with_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    crop_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<const T*>(padded),
                                                                static_cast<T*>(x), shape);
  });
}

void launch_add_channel_bias(DType dtype, void* y, const void* bias, int64_t n, int64_t channels,
                             int64_t size, cudaStream_t stream) {
  const int64_t total = n * channels * size;
  if (total == 0) return;
  with_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_width(vector_width<T>(size, {y}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      const int64_t vectors = total / V;
      const unsigned blocks = grid_for(vectors, kThreads);
      if (vectors < (int64_t{1} << 32) - 2 * int64_t{kThreads} * blocks)
        add_channel_bias_kernel<T, V, uint32_t><<<blocks, kThreads, 0, stream>>>(
            static_cast<T*>(y), static_cast<const T*>(bias), static_cast<uint32_t>(vectors),
            static_cast<uint32_t>(size / V), static_cast<uint32_t>(channels));
      else
        add_channel_bias_kernel<T, V, int64_t><<<blocks, kThreads, 0, stream>>>(
            static_cast<T*>(y), static_cast<const T*>(bias), vectors, size / V, channels);
    });
  });
}

int64_t channel_sum_slices(int64_t n, int64_t channels) {
  if (channels <= 0 || n <= 1) return 1;
  int64_t slices = 1024 / channels;
  if (slices > n) slices = n;
  if (slices > 65535) slices = 65535;
  return slices < 1 ? 1 : slices;
}

void launch_channel_sum(DType dtype, const void* dy, void* db, int64_t n, int64_t channels,
                        int64_t size, double* partial, int64_t slices, cudaStream_t stream) {
  if (channels == 0) return;
  if (partial == nullptr || slices < 1) slices = 1;
  if (slices > n) slices = n < 1 ? 1 : n;
  const int64_t per_slice = n > 0 ? (n + slices - 1) / slices : 1;
  // Slices of whole images; the last may be short (or, rounding up, empty: a zero partial).
  with_float_type(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_width(vector_width<T>(size, {dy}), [&](auto width) {
      constexpr int V = decltype(width)::value;
      const dim3 grid(static_cast<unsigned>(channels), static_cast<unsigned>(slices));
      channel_partials_kernel<T, V><<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(dy), static_cast<T*>(db), slices > 1 ? partial : nullptr, n,
          channels, size, per_slice);
    });
    if (slices > 1)
      channel_finish_kernel<T><<<grid_for(channels, kThreads), kThreads, 0, stream>>>(
          partial, static_cast<T*>(db), channels, slices);
  });
}

}  // namespace stagecraft::rt::cuda
