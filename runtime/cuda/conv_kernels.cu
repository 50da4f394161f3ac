// The CUDA conv family's device kernels (conv_kernels.h): pooling and its gradients with
// ONNX's window rules as the CPU's runtime/cpu/window.h computes them, the explicit padding
// of Conv's input for asymmetric pads, and Conv's bias. Grid-stride loops with int64 indices;
// the gradients gather in a fixed order (no atomics).
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
__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Output position o's window along dim d, exactly cpu::window: the input position of kernel
// index 0, the kernel indices [first, last) inside the input, and how many lie inside the
// explicitly padded input.
struct Span {
  int64_t start, first, last, padded;
};

__device__ Span window_along(const PoolShape& s, int d, int64_t o) {
  const int64_t start = o * s.stride[d] - s.pad_l[d], step = s.dilation[d], k = s.kernel[d];
  // The kernel indices j (at start + j * step) below `bound`, clamped to [0, k].
  const int64_t below_in = min64(max64((s.in[d] - start + step - 1) / step, 0), k);
  const int64_t below_padded = min64(max64((s.in[d] + s.pad_r[d] - start + step - 1) / step, 0), k);
  const int64_t first = start >= 0 ? 0 : min64(k, (-start + step - 1) / step);
  return {start, first, max64(first, below_in), below_padded};
}

// A flat index over [planes, d, h, w] split into its plane and position.
struct Position {
  int64_t plane, d, h, w;
};

__device__ Position split(int64_t e, const int64_t (&dims)[3]) {
  Position p;
  p.w = e % dims[2];
  e /= dims[2];
  p.h = e % dims[1];
  e /= dims[1];
  p.d = e % dims[0];
  p.plane = e / dims[0];
  return p;
}

// The first maximum of output position `o`'s window in plane `xp`: its value and its
// row-major offset in the plane. Every window holds an input element (pool_geometry refuses
// one over padding alone).
template <class T>
__device__ void window_max(const PoolShape& s, const T* xp, const Position& o, T& best,
                           int64_t& best_d, int64_t& best_h, int64_t& best_w) {
  const Span wd = window_along(s, 0, o.d), wh = window_along(s, 1, o.h),
             ww = window_along(s, 2, o.w);
  const int64_t H = s.in[1], W = s.in[2];
  bool found = false;
  best = T();
  best_d = best_h = best_w = 0;
  for (int64_t jd = wd.first; jd < wd.last; ++jd) {
    const int64_t id = wd.start + jd * s.dilation[0];
    for (int64_t jh = wh.first; jh < wh.last; ++jh) {
      const int64_t ih = wh.start + jh * s.dilation[1];
      for (int64_t jw = ww.first; jw < ww.last; ++jw) {
        const int64_t iw = ww.start + jw * s.dilation[2];
        const T v = xp[(id * H + ih) * W + iw];
        if (!found || v > best) {  // the CPU's comparison: the first maximum wins ties
          best = v;
          best_d = id;
          best_h = ih;
          best_w = iw;
          found = true;
        }
      }
    }
  }
}

template <class T>
__global__ void max_pool_kernel(const T* x, T* y, int64_t* indices, bool column_major,
                                PoolShape s) {
  const int64_t in_plane = s.in[0] * s.in[1] * s.in[2];
  const int64_t n = s.planes * s.out[0] * s.out[1] * s.out[2];
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const Position o = split(e, s.out);
    T best;
    int64_t bd, bh, bw;
    window_max(s, x + o.plane * in_plane, o, best, bd, bh, bw);
    y[e] = best;
    if (indices != nullptr)
      indices[e] = o.plane * in_plane + (column_major ? bd + bh * s.in[0] + bw * s.in[0] * s.in[1]
                                                      : (bd * s.in[1] + bh) * s.in[2] + bw);
  }
}

// The divisor of output position o's window: its positions inside the input, or with
// include_pad inside the explicitly padded input (never the ceil_mode extension).
__device__ float average_divisor(const Span& wd, const Span& wh, const Span& ww, bool include_pad) {
  const int64_t count = include_pad
                            ? wd.padded * wh.padded * ww.padded
                            : (wd.last - wd.first) * (wh.last - wh.first) * (ww.last - ww.first);
  return static_cast<float>(count);
}

__global__ void average_pool_kernel(const float* x, float* y, bool include_pad, PoolShape s) {
  const int64_t in_plane = s.in[0] * s.in[1] * s.in[2];
  const int64_t n = s.planes * s.out[0] * s.out[1] * s.out[2];
  const int64_t H = s.in[1], W = s.in[2];
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const Position o = split(e, s.out);
    const float* xp = x + o.plane * in_plane;
    const Span wd = window_along(s, 0, o.d), wh = window_along(s, 1, o.h),
               ww = window_along(s, 2, o.w);
    float sum = 0.0f;
    for (int64_t jd = wd.first; jd < wd.last; ++jd) {
      const int64_t id = wd.start + jd * s.dilation[0];
      for (int64_t jh = wh.first; jh < wh.last; ++jh) {
        const int64_t ih = wh.start + jh * s.dilation[1];
        for (int64_t jw = ww.first; jw < ww.last; ++jw)
          sum += xp[(id * H + ih) * W + ww.start + jw * s.dilation[2]];
      }
    }
    y[e] = sum / average_divisor(wd, wh, ww, include_pad);
  }
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

// Each output's first maximum as a row-major offset in its plane.
__global__ void argmax_kernel(const float* x, int64_t* argmax, PoolShape s) {
  const int64_t in_plane = s.in[0] * s.in[1] * s.in[2];
  const int64_t n = s.planes * s.out[0] * s.out[1] * s.out[2];
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const Position o = split(e, s.out);
    float best;
    int64_t bd, bh, bw;
    window_max(s, x + o.plane * in_plane, o, best, bd, bh, bw);
    argmax[e] = (bd * s.in[1] + bh) * s.in[2] + bw;
  }
}

// The outputs [lo, hi] along dim d whose windows span input position i: o * stride - pad_l
// <= i <= o * stride - pad_l + (kernel - 1) * dilation. (With dilation, a window spanning i
// may step over it; the callers check.)
__device__ void covering(const PoolShape& s, int d, int64_t i, int64_t& lo, int64_t& hi) {
  const int64_t top = i + s.pad_l[d];  // o * stride <= top
  const int64_t bottom = top - (s.kernel[d] - 1) * s.dilation[d];
  lo = bottom <= 0 ? 0 : (bottom + s.stride[d] - 1) / s.stride[d];
  hi = min64(s.out[d] - 1, top / s.stride[d]);
}

__global__ void max_pool_grad_kernel(const float* dy, const int64_t* argmax, float* dx,
                                     PoolShape s) {
  const int64_t out_plane = s.out[0] * s.out[1] * s.out[2];
  const int64_t n = s.planes * s.in[0] * s.in[1] * s.in[2];
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const Position i = split(e, s.in);
    const int64_t here = (i.d * s.in[1] + i.h) * s.in[2] + i.w;
    int64_t d0, d1, h0, h1, w0, w1;
    covering(s, 0, i.d, d0, d1);
    covering(s, 1, i.h, h0, h1);
    covering(s, 2, i.w, w0, w1);
    float sum = 0.0f;
    for (int64_t od = d0; od <= d1; ++od)
      for (int64_t oh = h0; oh <= h1; ++oh)
        for (int64_t ow = w0; ow <= w1; ++ow) {
          const int64_t o = i.plane * out_plane + (od * s.out[1] + oh) * s.out[2] + ow;
          if (argmax[o] == here) sum += dy[o];
        }
    dx[e] = sum;
  }
}

// Whether output o's window along dim d reads input position i (not only spans it).
__device__ bool reads(const PoolShape& s, int d, int64_t o, int64_t i) {
  return (i + s.pad_l[d] - o * s.stride[d]) % s.dilation[d] == 0;
}

__global__ void average_pool_grad_kernel(const float* dy, float* dx, bool include_pad,
                                         PoolShape s) {
  const int64_t out_plane = s.out[0] * s.out[1] * s.out[2];
  const int64_t n = s.planes * s.in[0] * s.in[1] * s.in[2];
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const Position i = split(e, s.in);
    int64_t d0, d1, h0, h1, w0, w1;
    covering(s, 0, i.d, d0, d1);
    covering(s, 1, i.h, h0, h1);
    covering(s, 2, i.w, w0, w1);
    float sum = 0.0f;
    for (int64_t od = d0; od <= d1; ++od) {
      if (!reads(s, 0, od, i.d)) continue;
      const Span wd = window_along(s, 0, od);
      for (int64_t oh = h0; oh <= h1; ++oh) {
        if (!reads(s, 1, oh, i.h)) continue;
        const Span wh = window_along(s, 1, oh);
        for (int64_t ow = w0; ow <= w1; ++ow) {
          if (!reads(s, 2, ow, i.w)) continue;
          const Span ww = window_along(s, 2, ow);
          const int64_t o = i.plane * out_plane + (od * s.out[1] + oh) * s.out[2] + ow;
          sum += dy[o] / average_divisor(wd, wh, ww, include_pad);
        }
      }
    }
    dx[e] = sum;
  }
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

int64_t outputs(const PoolShape& s) { return s.planes * s.out[0] * s.out[1] * s.out[2]; }
int64_t inputs(const PoolShape& s) { return s.planes * s.in[0] * s.in[1] * s.in[2]; }

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
