// The CUDA loss family's device kernels (loss_kernels.h): one block per position (n, d) of
// SoftmaxCrossEntropyLoss, the block's threads sharing the C classes (read D apart), with
// block-wide maximum and sums (norm_block.cuh: fixed trees, so a result depends only on the
// launch shape); the loss's sum over positions is one more block, in double. 16-bit scores
// (loss_kernels.h) are widened as they are read and the gradient rounded once as it is written.
#include <cmath>
#include <cstdint>

#include "runtime/cuda/elementwise_device.cuh"
#include "runtime/cuda/loss_kernels.h"
#include "runtime/cuda/norm_block.cuh"
#include "runtime/cuda/update_kernels.h"

namespace stagecraft::rt::cuda {
namespace {

using eltwise::BFloat16;
using eltwise::convert;  // Cast's conversion: 16-bit scores widened exactly, as on the CPU
using eltwise::first_index;
using eltwise::grid_stride;
using eltwise::Half;

// Threads per position's block: a warp for a few classes, more for many (a function of C only,
// so the reduction order is fixed for a given problem).
int threads_for(int64_t c) {
  if (c <= 64) return 32;
  if (c <= 512) return 128;
  return 256;
}

unsigned blocks_for(int64_t positions) {
  const int64_t most = 65535 * 16;
  return static_cast<unsigned>(positions < 1 ? 1 : (positions < most ? positions : most));
}

// log(sum(exp(x))) over the C values x[k * D] of one position, in one read of them (GPT-2's
// 50257 logits a row are 1.65 GB a step: a read for the maximum and another for the sum took
// 2.0 ms of the forward and 3.5 of the gradient on an H200): each thread keeps its running
// maximum m and the sum of exp(x - m) in double, rescaled when m grows; the block then takes the
// maximum M and adds each thread's sum times exp(m - M), in a fixed order. The CPU subtracts its
// maximum first and sums once: the two agree to double rounding before the final float. A row
// with an infinity or only -inf (where x - M is not a number) is summed again the CPU's way,
// for its result to be the CPU's; a NaN makes the sum NaN, as there. Every thread of the block
// calls it and gets the result.
template <class S>
__device__ float log_normalizer(const S* x, int64_t c, int64_t stride) {
  float m = -INFINITY;
  double s = 0;
  for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
    const float v = convert<float>(x[k * stride]);
    if (v > m) {
      s = s * exp(static_cast<double>(m) - static_cast<double>(v)) + 1.0;  // exp(-inf) = 0
      m = v;
    } else if (v > -INFINITY) {
      s += exp(static_cast<double>(v) - static_cast<double>(m));
    } else if (isnan(v)) {
      s = NAN;  // as the CPU's sum, which a NaN term makes NaN
    }
  }
  const float mx = block_max(m);
  if (isfinite(mx)) {
    const double part =
        m > -INFINITY ? s * exp(static_cast<double>(m) - static_cast<double>(mx)) : 0.0;
    return mx + static_cast<float>(log(block_sum<double>(part)));
  }
  double again = 0;
  for (int64_t k = threadIdx.x; k < c; k += blockDim.x)
    again += exp(static_cast<double>(convert<float>(x[k * stride]) - mx));
  again = block_sum<double>(again);
  return mx + static_cast<float>(log(again));
}

// Each position's loss -w * log_prob[n, t, d] (0 where w is 0) into values[i], and log_prob.
template <class S>
__global__ void sce_kernel(SceArgs p, float* values, float* log_prob) {
  const int64_t positions = p.n * p.d, C = p.c, D = p.d;
  for (int64_t i = blockIdx.x; i < positions; i += gridDim.x) {
    const int64_t n = i / D, d = i % D, base = n * C * D + d;
    const S* xi = static_cast<const S*>(p.scores) + base;
    const float norm = log_normalizer(xi, C, D);
    if (log_prob != nullptr)
      for (int64_t k = threadIdx.x; k < C; k += blockDim.x)
        log_prob[base + k * D] = convert<float>(xi[k * D]) - norm;
    if (threadIdx.x == 0) {
      const float w = p.weights[i];
      values[i] = w != 0.0f ? -w * (convert<float>(xi[p.labels[i] * D]) - norm) : 0.0f;
    }
  }
}

// The sum (or mean over `weight_sum`; 0 when that is 0) of `count` values in one block.
__global__ void sce_total_kernel(const float* values, int64_t count, ops::LossReduction reduction,
                                 double weight_sum, float* loss) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += values[i];
  s = block_sum<double>(s);
  if (threadIdx.x == 0) {
    if (reduction == ops::LossReduction::kSum)
      loss[0] = static_cast<float>(s);
    else
      loss[0] = weight_sum != 0 ? static_cast<float>(s / weight_sum) : 0.0f;
  }
}

template <class S>
__global__ void sce_grad_kernel(SceArgs p, const float* dl, const float* dlp, S* dx) {
  const int64_t positions = p.n * p.d, C = p.c, D = p.d;
  float scale = 0.0f;  // g for sum and mean
  if (dl != nullptr && p.reduction == ops::LossReduction::kSum) scale = dl[0];
  if (dl != nullptr && p.reduction == ops::LossReduction::kMean && p.weight_sum != 0)
    scale = static_cast<float>(dl[0] / p.weight_sum);
  for (int64_t i = blockIdx.x; i < positions; i += gridDim.x) {
    const int64_t n = i / D, d = i % D, base = n * C * D + d;
    const S* xi = static_cast<const S*>(p.scores) + base;
    S* dxi = dx + base;
    const float g = (dl != nullptr ? (p.reduction == ops::LossReduction::kNone ? dl[i] : scale) : 0.0f) *
                    p.weights[i];
    if (g == 0.0f && dlp == nullptr) {  // the same for the whole block
      for (int64_t k = threadIdx.x; k < C; k += blockDim.x) dxi[k * D] = convert<S>(0.0f);
      continue;
    }
    const float norm = log_normalizer(xi, C, D);
    double dlp_sum = 0;
    if (dlp != nullptr) {
      for (int64_t k = threadIdx.x; k < C; k += blockDim.x) dlp_sum += dlp[base + k * D];
      dlp_sum = block_sum<double>(dlp_sum);
    }
    const float coef = g - static_cast<float>(dlp_sum);
    const int64_t t = g != 0.0f ? p.labels[i] : -1;
    for (int64_t k = threadIdx.x; k < C; k += blockDim.x) {
      const float prob = expf(convert<float>(xi[k * D]) - norm);
      float v = coef * prob + (dlp != nullptr ? dlp[base + k * D] : 0.0f);
      if (k == t) v -= g;
      dxi[k * D] = convert<S>(v);
    }
  }
}

// NegativeLogLikelihoodLoss: each position's -w * input[n, t, d] (0 where w is 0), a thread each.
__global__ void nll_kernel(SceArgs p, float* values) {
  const int64_t positions = p.n * p.d, C = p.c, D = p.d;
  const auto* x = static_cast<const float*>(p.scores);
  for (int64_t i = first_index(); i < positions; i += grid_stride()) {
    const float w = p.weights[i];
    values[i] = w != 0.0f ? -w * x[(i / D * C + p.labels[i]) * D + i % D] : 0.0f;
  }
}

// Its gradient at each position's label (dx zeroed before): -g * w, g as the cross-entropy's.
__global__ void nll_grad_kernel(SceArgs p, const float* dl, float* dx) {
  const int64_t positions = p.n * p.d, C = p.c, D = p.d;
  float scale = 0.0f;
  if (p.reduction == ops::LossReduction::kSum) scale = dl[0];
  if (p.reduction == ops::LossReduction::kMean && p.weight_sum != 0)
    scale = static_cast<float>(dl[0] / p.weight_sum);
  for (int64_t i = first_index(); i < positions; i += grid_stride()) {
    const float w = p.weights[i];
    if (w == 0.0f) continue;
    const float g = p.reduction == ops::LossReduction::kNone ? dl[i] : scale;
    dx[(i / D * C + p.labels[i]) * D + i % D] = -g * w;
  }
}


// Calls body(S{}) with the scores' element type.
template <class Body>
void with_scores(DType dtype, Body body) {
  if (dtype == DType::kBFloat16) return body(BFloat16{});
  if (dtype == DType::kFloat16) return body(Half{});
  return body(float{});
}

}  // namespace

void launch_sce(const SceArgs& args, float* loss, float* log_prob, float* scratch,
                cudaStream_t stream) {
  const int64_t positions = args.n * args.d;
  float* values = args.reduction == ops::LossReduction::kNone ? loss : scratch;
  if (positions > 0)
    with_scores(args.scores_dtype, [&](auto tag) {
      sce_kernel<decltype(tag)>
          <<<blocks_for(positions), threads_for(args.c), 0, stream>>>(args, values, log_prob);
    });
  if (args.reduction != ops::LossReduction::kNone)
    sce_total_kernel<<<1, 1024, 0, stream>>>(values, positions, args.reduction, args.weight_sum,
                                             loss);
}

void launch_sce_grad(const SceArgs& args, const float* dloss, const float* dlog_prob, void* dx,
                     cudaStream_t stream) {
  const int64_t positions = args.n * args.d;
  if (positions <= 0 || args.c <= 0) return;
  with_scores(args.scores_dtype, [&](auto tag) {
    using S = decltype(tag);
    sce_grad_kernel<S><<<blocks_for(positions), threads_for(args.c), 0, stream>>>(
        args, dloss, dlog_prob, static_cast<S*>(dx));
  });
}

void launch_nll(const SceArgs& args, float* loss, float* scratch, cudaStream_t stream) {
  const int64_t positions = args.n * args.d;
  float* values = args.reduction == ops::LossReduction::kNone ? loss : scratch;
  if (positions > 0) nll_kernel<<<grid_for(positions), 256, 0, stream>>>(args, values);
  if (args.reduction != ops::LossReduction::kNone)
    sce_total_kernel<<<1, 1024, 0, stream>>>(values, positions, args.reduction, args.weight_sum,
                                             loss);
}

void launch_nll_grad(const SceArgs& args, const float* dloss, float* dx, cudaStream_t stream) {
  const int64_t positions = args.n * args.d;
  if (positions > 0 && dloss != nullptr)
    nll_grad_kernel<<<grid_for(positions), 256, 0, stream>>>(args, dloss, dx);
}

}  // namespace stagecraft::rt::cuda
