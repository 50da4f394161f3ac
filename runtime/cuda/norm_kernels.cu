// The CUDA norm family's device kernels (norm_kernels.h): one block per row (or channel), each
// thread over a strided share of it, block-wide reductions in a fixed tree (norm_block.cuh);
// LayerNormalization's rows of up to kWarpRowMax elements a warp each.
#include <type_traits>

#include "runtime/cuda/column_reduce.cuh"
#include "runtime/cuda/elementwise_device.cuh"
#include "runtime/cuda/norm_block.cuh"
#include "runtime/cuda/norm_kernels.h"
#include "runtime/cuda/update_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

// Threads for a block over `len` elements: a multiple of 32, at most kThreads.
int threads_for(int64_t len) {
  const int64_t warps = (len + 31) / 32;
  return static_cast<int>(warps >= kThreads / 32 ? kThreads : (warps < 1 ? 32 : warps * 32));
}

unsigned blocks_for(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
}

// Blocks of kThreads for `rows` rows a warp each.
unsigned warp_row_blocks(int64_t rows) { return blocks_for((rows + kThreads / 32 - 1) / (kThreads / 32)); }

__global__ void softmax_kernel(const float* x, float* y, int64_t outer, int64_t len,
                               int64_t inner) {
  for (int64_t r = blockIdx.x; r < outer * inner; r += gridDim.x) {
    const int64_t base = (r / inner) * len * inner + r % inner;
    float top = -INFINITY;
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) top = fmaxf(top, x[base + k * inner]);
    top = block_max(top);
    float sum = 0.0f;
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) sum += expf(x[base + k * inner] - top);
    sum = block_sum<float>(sum);
    const float inv = 1.0f / sum;
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x)
      y[base + k * inner] = expf(x[base + k * inner] - top) * inv;
  }
}

// LogSoftmax: y = x - max - log(sum(exp(x - max))), as softmax_kernel's sums.
__global__ void log_softmax_kernel(const float* x, float* y, int64_t outer, int64_t len,
                                   int64_t inner) {
  for (int64_t r = blockIdx.x; r < outer * inner; r += gridDim.x) {
    const int64_t base = (r / inner) * len * inner + r % inner;
    float top = -INFINITY;
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) top = fmaxf(top, x[base + k * inner]);
    top = block_max(top);
    double sum = 0.0;
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x)
      sum += exp(static_cast<double>(x[base + k * inner]) - top);
    const float shift = top + static_cast<float>(log(block_sum<double>(sum)));
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x)
      y[base + k * inner] = x[base + k * inner] - shift;
  }
}

// LogSoftmaxGrad: dx = dy - exp(y) sum(dy).
__global__ void log_softmax_grad_kernel(const float* y, const float* dy, float* dx, int64_t outer,
                                        int64_t len, int64_t inner) {
  for (int64_t r = blockIdx.x; r < outer * inner; r += gridDim.x) {
    const int64_t base = (r / inner) * len * inner + r % inner;
    double s = 0.0;
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) s += dy[base + k * inner];
    const float sf = static_cast<float>(block_sum<double>(s));
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) {
      const int64_t e = base + k * inner;
      dx[e] = dy[e] - expf(y[e]) * sf;
    }
  }
}

__global__ void softmax_grad_kernel(const float* y, const float* dy, float* dx, int64_t outer,
                                    int64_t len, int64_t inner) {
  for (int64_t r = blockIdx.x; r < outer * inner; r += gridDim.x) {
    const int64_t base = (r / inner) * len * inner + r % inner;
    double s = 0.0;
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) {
      const int64_t e = base + k * inner;
      s += static_cast<double>(dy[e]) * y[e];
    }
    const float sf = static_cast<float>(block_sum<double>(s));
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) {
      const int64_t e = base + k * inner;
      dx[e] = y[e] * (dy[e] - sf);
    }
  }
}

// LayerNormalization's storage: float, or a 16-bit float read widened exactly and written
// rounded to nearest even, as the widened fallback (run_widened) does around the float32 kernel.
template <class T>
__device__ __forceinline__ float load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>)
    return p[i];
  else
    return eltwise::to_float(p[i]);
}
template <class T>
__device__ __forceinline__ void store(T* p, int64_t i, float v) {
  if constexpr (std::is_same_v<T, float>)
    p[i] = v;
  else
    p[i] = eltwise::convert<T>(v);
}

// Who reduces a LayerNormalization row: a whole block (one row a block: rows of more than
// kWarpRowMax elements), or one warp (a row a warp, kThreads / 32 rows a block: GPT-2's rows of
// 768 left most of a block's threads idle between its four barriers, 65 us a 8192-row gradient
// on an H200 for 38 MB moved). Either way a fixed tree of shuffles (and, for a block, one warp
// over the warps' partials): the result depends only on the launch shape.
struct BlockRows {
  __device__ static int64_t first() { return blockIdx.x; }
  __device__ static int64_t stride() { return gridDim.x; }
  __device__ static int lane() { return static_cast<int>(threadIdx.x); }
  __device__ static int width() { return static_cast<int>(blockDim.x); }
  template <class V>
  __device__ static V sum(V v) {
    return block_sum<V>(v);
  }
};
struct WarpRows {
  __device__ static int64_t first() {
    return int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32;
  }
  __device__ static int64_t stride() { return int64_t{gridDim.x} * (blockDim.x / 32); }
  __device__ static int lane() { return static_cast<int>(threadIdx.x % 32); }
  __device__ static int width() { return 32; }
  template <class V>
  __device__ static V sum(V v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
  }
};

// Rows of at most this many elements are reduced by a warp each.
constexpr int64_t kWarpRowMax = 4096;

template <class T, class Rows>
__global__ void layer_norm_kernel(const T* x, const T* scale, const T* bias, T* y,
                                  float* mean_out, float* inv_std_out, int64_t outer, int64_t inner,
                                  float epsilon) {
  const int lane = Rows::lane(), width = Rows::width();
  for (int64_t r = Rows::first(); r < outer; r += Rows::stride()) {
    const T* row = x + r * inner;
    float sum = 0.0f;
    for (int64_t j = lane; j < inner; j += width) sum += load(row, j);
    const float mean = Rows::sum(sum) / static_cast<float>(inner);
    float sq = 0.0f;
    for (int64_t j = lane; j < inner; j += width) {
      const float d = load(row, j) - mean;
      sq += d * d;
    }
    const float var = Rows::sum(sq) / static_cast<float>(inner);
    const float inv = 1.0f / sqrtf(var + epsilon);
    T* out = y + r * inner;
    for (int64_t j = lane; j < inner; j += width) {
      const float v = (load(row, j) - mean) * inv * load(scale, j);
      store(out, j, bias != nullptr ? v + load(bias, j) : v);
    }
    if (lane == 0) {
      if (mean_out != nullptr) mean_out[r] = mean;
      if (inv_std_out != nullptr) inv_std_out[r] = inv;
    }
  }
}

template <class T, class Rows>
__global__ void layer_norm_grad_rows_kernel(const T* x, const T* scale, const T* g,
                                            const float* dmean, const float* dinv, T* dx,
                                            double* mean_out, double* istd_out, int64_t outer,
                                            int64_t inner, double eps) {
  const double inv_n = 1.0 / static_cast<double>(inner);
  const int lane = Rows::lane(), width = Rows::width();
  for (int64_t r = Rows::first(); r < outer; r += Rows::stride()) {
    const T* row = x + r * inner;
    double s = 0.0;
    for (int64_t j = lane; j < inner; j += width) s += load(row, j);
    const double mu = Rows::sum(s) * inv_n;
    double sq = 0.0;
    for (int64_t j = lane; j < inner; j += width) sq += (load(row, j) - mu) * (load(row, j) - mu);
    const double is = 1.0 / sqrt(Rows::sum(sq) * inv_n + eps);
    if (lane == 0) {
      mean_out[r] = mu;
      istd_out[r] = is;
    }
    if (dx == nullptr) continue;
    double mg = 0.0, mgx = 0.0;  // mean(dy * scale), mean(dy * scale * xhat)
    if (g != nullptr) {
      for (int64_t j = lane; j < inner; j += width) {
        const double gj = static_cast<double>(load(g, r * inner + j)) * load(scale, j);
        mg += gj;
        mgx += gj * (load(row, j) - mu) * is;
      }
      mg = Rows::sum(mg) * inv_n;
      mgx = Rows::sum(mgx) * inv_n;
    }
    const double dm = dmean != nullptr ? dmean[r] : 0.0, di = dinv != nullptr ? dinv[r] : 0.0;
    T* out = dx + r * inner;
    for (int64_t j = lane; j < inner; j += width) {
      const double xc = load(row, j) - mu;
      double v = dm * inv_n - di * is * is * is * xc * inv_n;
      if (g != nullptr)
        v += is * (static_cast<double>(load(g, r * inner + j)) * load(scale, j) - mg -
                   xc * is * mgx);
      store(out, j, static_cast<float>(v));
    }
  }
}

// LayerNorm's scale and bias gradients as column sums (column_reduce.cuh): term 0 is
// dy * xhat, term 1 dy.
template <class T>
struct LayerNormColumnTerms {
  static constexpr int kTerms = 2;
  const T* x;
  const T* g;
  const double* mean;
  const double* istd;
  int64_t inner;
  __device__ void operator()(int64_t r, int64_t c, double (&t)[2]) const {
    const double gj = load(g, r * inner + c);
    t[0] = gj * (load(x, r * inner + c) - mean[r]) * istd[r];
    t[1] = gj;
  }
};

template <class T>
struct LayerNormColumnStore {
  T* dscale;
  T* dbias;
  __device__ void operator()(int k, int64_t c, double sum) const {
    T* out = k == 0 ? dscale : dbias;
    if (out != nullptr) store(out, c, static_cast<float>(sum));
  }
};

// Calls body(Tag<T>{}) for float32 and the 16-bit floats; false for any other dtype.
template <class Body>
bool visit_norm(DType dtype, Body&& body) {
  if (dtype == DType::kFloat32) return body(eltwise::Tag<float>{}), true;
  return eltwise::visit16(dtype, body);
}

template <class T>
__global__ void batch_norm_inference_kernel(BatchNormArgs p, T* y) {
  const T* x = static_cast<const T*>(p.x);
  const int64_t n = p.n * p.c * p.s;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const int64_t c = (i / p.s) % p.c;
    const float inv = 1.0f / sqrtf(p.var[c] + p.epsilon);
    store(y, i, p.scale[c] * ((load(x, i) - p.mean[c]) * inv) + p.bias[c]);
  }
}

// Element t of channel c's N * S elements.
__device__ __forceinline__ int64_t channel_at(const BatchNormArgs& p, int64_t c, int64_t t) {
  return ((t / p.s) * p.c + c) * p.s + t % p.s;
}

// The batch mean and biased variance of channel c (double).
template <class T>
__device__ void channel_stats(const BatchNormArgs& p, int64_t c, double& mu, double& var) {
  const T* x = static_cast<const T*>(p.x);
  const int64_t count = p.n * p.s;
  double sum = 0.0;
  for (int64_t t = threadIdx.x; t < count; t += blockDim.x) sum += load(x, channel_at(p, c, t));
  mu = block_sum<double>(sum) / static_cast<double>(count);
  double sq = 0.0;
  for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
    const double d = load(x, channel_at(p, c, t)) - mu;
    sq += d * d;
  }
  var = block_sum<double>(sq) / static_cast<double>(count);
}

template <class T>
__global__ void batch_norm_training_kernel(BatchNormArgs p, T* y, float* running_mean,
                                           float* running_var) {
  const T* x = static_cast<const T*>(p.x);
  const int64_t count = p.n * p.s;
  for (int64_t c = blockIdx.x; c < p.c; c += gridDim.x) {
    double mu, var;
    channel_stats<T>(p, c, mu, var);
    const float mean_f = static_cast<float>(mu), var_f = static_cast<float>(var);
    const float inv = 1.0f / sqrtf(var_f + p.epsilon);
    for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
      const int64_t i = channel_at(p, c, t);
      store(y, i, p.scale[c] * ((load(x, i) - mean_f) * inv) + p.bias[c]);
    }
    if (threadIdx.x == 0) {
      if (running_mean != nullptr)
        running_mean[c] = p.mean[c] * p.momentum + mean_f * (1.0f - p.momentum);
      if (running_var != nullptr)
        running_var[c] = p.var[c] * p.momentum + var_f * (1.0f - p.momentum);
    }
  }
}

template <class T>
__global__ void batch_norm_grad_kernel(BatchNormGradArgs q) {
  const BatchNormArgs& p = q.forward;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(q.dy);
  T* dx = static_cast<T*>(q.dx);
  const int64_t count = p.n * p.s;
  for (int64_t c = blockIdx.x; c < p.c; c += gridDim.x) {
    double mu, var;
    if (q.training) {
      channel_stats<T>(p, c, mu, var);
    } else {
      mu = p.mean[c];
      var = p.var[c];
    }
    const double istd = 1.0 / sqrt(var + static_cast<double>(p.epsilon));
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    if (dy != nullptr) {
      for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
        const int64_t i = channel_at(p, c, t);
        sum_dy += load(dy, i);
        sum_dy_xhat += load(dy, i) * (load(x, i) - mu) * istd;
      }
      sum_dy = block_sum<double>(sum_dy);
      sum_dy_xhat = block_sum<double>(sum_dy_xhat);
    }
    const double k = p.scale[c] * istd;
    if (threadIdx.x == 0) {
      if (q.dbias != nullptr) q.dbias[c] = static_cast<float>(sum_dy);
      if (q.dscale != nullptr) q.dscale[c] = static_cast<float>(sum_dy_xhat);
    }
    if (q.training) {
      const double rm = q.drm != nullptr ? q.drm[c] : 0.0, rv = q.drv != nullptr ? q.drv[c] : 0.0;
      if (threadIdx.x == 0) {
        if (q.dmean != nullptr) q.dmean[c] = static_cast<float>(p.momentum * rm);
        if (q.dvar != nullptr) q.dvar[c] = static_cast<float>(p.momentum * rv);
      }
      if (dx != nullptr) {
        const double inv = 1.0 / static_cast<double>(count), keep = 1.0 - p.momentum;
        for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
          const int64_t i = channel_at(p, c, t);
          const double xc = load(x, i) - mu;
          double v = keep * inv * (rm + 2.0 * rv * xc);
          if (dy != nullptr) v += k * (load(dy, i) - sum_dy * inv - xc * istd * sum_dy_xhat * inv);
          store(dx, i, static_cast<float>(v));
        }
      }
    } else {
      if (dx != nullptr)
        for (int64_t t = threadIdx.x; t < count; t += blockDim.x) {
          const int64_t i = channel_at(p, c, t);
          store(dx, i, dy != nullptr ? static_cast<float>(load(dy, i) * k) : 0.0f);
        }
      if (threadIdx.x == 0) {
        if (q.dmean != nullptr) q.dmean[c] = static_cast<float>(-k * sum_dy);
        if (q.dvar != nullptr)
          q.dvar[c] = static_cast<float>(-0.5 * p.scale[c] * istd * istd * sum_dy_xhat);
      }
    }
  }
}

}  // namespace

void launch_softmax(const float* x, float* y, int64_t outer, int64_t len, int64_t inner,
                    cudaStream_t stream) {
  if (outer * len * inner <= 0) return;
  softmax_kernel<<<blocks_for(outer * inner), threads_for(len), 0, stream>>>(x, y, outer, len,
                                                                             inner);
}

void launch_softmax_grad(const float* y, const float* dy, float* dx, int64_t outer, int64_t len,
                         int64_t inner, cudaStream_t stream) {
  if (outer * len * inner <= 0) return;
  softmax_grad_kernel<<<blocks_for(outer * inner), threads_for(len), 0, stream>>>(y, dy, dx, outer,
                                                                                  len, inner);
}

void launch_log_softmax(const float* x, float* y, int64_t outer, int64_t len, int64_t inner,
                        cudaStream_t stream) {
  if (outer * len * inner <= 0) return;
  log_softmax_kernel<<<blocks_for(outer * inner), threads_for(len), 0, stream>>>(x, y, outer, len,
                                                                                 inner);
}

void launch_log_softmax_grad(const float* y, const float* dy, float* dx, int64_t outer, int64_t len,
                             int64_t inner, cudaStream_t stream) {
  if (outer * len * inner <= 0) return;
  log_softmax_grad_kernel<<<blocks_for(outer * inner), threads_for(len), 0, stream>>>(
      y, dy, dx, outer, len, inner);
}

bool launch_layer_norm(DType dtype, const void* x, const void* scale, const void* bias, void* y,
                       float* mean, float* inv_std, int64_t outer, int64_t inner, float epsilon,
                       cudaStream_t stream) {
  if (outer <= 0 || inner <= 0) return visit_norm(dtype, [](auto) {});
  return visit_norm(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto launch = [&](auto kernel, unsigned blocks, int threads) {
      kernel<<<blocks, threads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(bias),
          static_cast<T*>(y), mean, inv_std, outer, inner, epsilon);
    };
    if (inner <= kWarpRowMax)
      launch(layer_norm_kernel<T, WarpRows>, warp_row_blocks(outer), kThreads);
    else
      launch(layer_norm_kernel<T, BlockRows>, blocks_for(outer), threads_for(inner));
  });
}

bool launch_layer_norm_grad_rows(DType dtype, const void* x, const void* scale, const void* dy,
                                 const float* dmean, const float* dinv, void* dx, double* mean,
                                 double* inv_std, int64_t outer, int64_t inner, double epsilon,
                                 cudaStream_t stream) {
  if (outer <= 0 || inner <= 0) return visit_norm(dtype, [](auto) {});
  return visit_norm(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto launch = [&](auto kernel, unsigned blocks, int threads) {
      kernel<<<blocks, threads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(dy), dmean,
          dinv, static_cast<T*>(dx), mean, inv_std, outer, inner, epsilon);
    };
    if (inner <= kWarpRowMax)
      launch(layer_norm_grad_rows_kernel<T, WarpRows>, warp_row_blocks(outer), kThreads);
    else
      launch(layer_norm_grad_rows_kernel<T, BlockRows>, blocks_for(outer), threads_for(inner));
  });
}

bool launch_layer_norm_grad_columns(DType dtype, const void* x, const void* dy, const double* mean,
                                    const double* inv_std, void* dscale, void* dbias,
                                    int64_t outer, int64_t inner, double* partial,
                                    int64_t slices, cudaStream_t stream) {
  return visit_norm(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_column_reduce(
        LayerNormColumnTerms<T>{static_cast<const T*>(x), static_cast<const T*>(dy), mean,
                                inv_std, inner},
        LayerNormColumnStore<T>{static_cast<T*>(dscale), static_cast<T*>(dbias)}, outer, inner,
        partial, slices, stream);
  });
}

bool launch_batch_norm_inference(const BatchNormArgs& args, void* y, cudaStream_t stream) {
  const int64_t n = args.n * args.c * args.s;
  return visit_norm(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n > 0)
      batch_norm_inference_kernel<T>
          <<<grid_for(n, kThreads), kThreads, 0, stream>>>(args, static_cast<T*>(y));
  });
}

bool launch_batch_norm_training(const BatchNormArgs& args, void* y, float* running_mean,
                                float* running_var, cudaStream_t stream) {
  return visit_norm(args.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (args.n * args.c * args.s > 0)
      batch_norm_training_kernel<T><<<blocks_for(args.c), kThreads, 0, stream>>>(
          args, static_cast<T*>(y), running_mean, running_var);
  });
}

bool launch_batch_norm_grad(const BatchNormGradArgs& args, cudaStream_t stream) {
  return visit_norm(args.forward.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (args.forward.c > 0)
      batch_norm_grad_kernel<T><<<blocks_for(args.forward.c), kThreads, 0, stream>>>(args);
  });
}

}  // namespace stagecraft::rt::cuda
