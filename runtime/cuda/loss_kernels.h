#pragma once
/// \file
/// Device kernels of the CUDA loss family (loss_kernels.cu): SoftmaxCrossEntropyLoss and its
/// gradient over scores read as [N, C, D], following the CPU backend's runtime/cpu/loss.cpp:
/// one block per position (n, d) computes the log-softmax over C with the maximum subtracted
/// (the exponentials summed in double), and sums are fixed trees, never atomics, so a run is
/// reproducible. The host (loss.cpp) validates the labels and resolves the per-position weights.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/format/dtype.h"
#include "runtime/ops/reductions.h"

namespace stagecraft::rt::cuda {

/// One SoftmaxCrossEntropyLoss node resolved: sizes, the device scores, labels and per-position
/// weights (0 where a position is ignored), and the mean's divisor (the weights' sum). The
/// scores are float32, or 16-bit (a mixed plan's loss): each widened exactly as it is read, the
/// loss and log-probabilities float32, and the gradient rounded once to the scores' type.
struct SceArgs {
  int64_t n = 0, c = 0, d = 0;
  ops::LossReduction reduction = ops::LossReduction::kMean;
  const void* scores = nullptr;  // [N, C, D] of `scores_dtype`
  DType scores_dtype = DType::kFloat32;
  const int64_t* labels = nullptr;  // [N * D]
  const float* weights = nullptr;   // [N * D]
  double weight_sum = 0;
};

/// The loss: [N * D] values for kNone, else one value (a mean over no weight is 0). `log_prob`
/// ([N, C, D]) may be null; `scratch` holds N * D floats (sum and mean only).
void launch_sce(const SceArgs& args, float* loss, float* log_prob, float* scratch,
                cudaStream_t stream);

/// The scores' gradient, every element written: with p = softmax(scores),
///   dx[n, c, d] = g * (p - [c == t]) + dlp - p * sum_c dlp
/// where g is w[n, d] times dloss[0] (sum), dloss[0] / weight_sum (mean) or dloss[n * D + d]
/// (none). `dloss` and `dlog_prob` ([N, C, D]) may be null; `dx` is of the scores' type.
void launch_sce_grad(const SceArgs& args, const float* dloss, const float* dlog_prob, void* dx,
                     cudaStream_t stream);

/// NegativeLogLikelihoodLoss over float32 log-probabilities `args.scores` ([N, C, D]): the loss
/// as launch_sce's, each position's term -w * input[n, t, d].
void launch_nll(const SceArgs& args, float* loss, float* scratch, cudaStream_t stream);

/// Its gradient into `dx` ([N, C, D], zeroed by the caller): -g * w at each position's label (g
/// as launch_sce_grad's); nothing with a null `dloss`.
void launch_nll_grad(const SceArgs& args, const float* dloss, float* dx, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
