#pragma once
/// \file
/// Device kernels of the CUDA norm family (norm_kernels.cu), float32 (LayerNormalization and
/// BatchNormalization also 16-bit): Softmax, LayerNormalization
/// and BatchNormalization, forward and gradient. Row-wise ops run one block per row with
/// block-wide reductions in a fixed order, so a run is reproducible. A "row" of an axis op is
/// seen as [outer, len, inner]: row (o, i) holds the `len` elements o * len * inner + k * inner
/// + i. Every launch is queued on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/format/dtype.h"

namespace stagecraft::rt::cuda {

/// y = softmax(x) along the middle dim of [outer, len, inner] (max subtracted, sums in float).
void launch_softmax(const float* x, float* y, int64_t outer, int64_t len, int64_t inner,
                    cudaStream_t stream);

/// dx = y * (dy - sum(dy * y)) along the middle dim (the sum in double, as the CPU's).
void launch_softmax_grad(const float* y, const float* dy, float* dx, int64_t outer, int64_t len,
                         int64_t inner, cudaStream_t stream);

/// y = log(softmax(x)) = x - max - log(sum(exp(x - max))) along the middle dim (the sum in
/// double, as the CPU's).
void launch_log_softmax(const float* x, float* y, int64_t outer, int64_t len, int64_t inner,
                        cudaStream_t stream);

/// dx = dy - exp(y) * sum(dy) along the middle dim (the sum in double, as the CPU's).
void launch_log_softmax_grad(const float* y, const float* dy, float* dx, int64_t outer, int64_t len,
                             int64_t inner, cudaStream_t stream);

/// LayerNormalization of `outer` rows of `inner`: y = (x - mean) * inv_std * scale + bias
/// (bias may be null), mean and variance in float; `mean` and `inv_std` (one per row, float32)
/// may be null. x, scale, bias and y are of `dtype`: float32, or bfloat16 or float16 read widened
/// exactly and y rounded to nearest even (the widened fallback's bits, without its casts); false
/// (nothing launched) for another dtype.
bool launch_layer_norm(DType dtype, const void* x, const void* scale, const void* bias, void* y,
                       float* mean, float* inv_std, int64_t outer, int64_t inner, float epsilon,
                       cudaStream_t stream);

/// LayerNormalizationGrad's rows, in double: the statistics of each row into `mean` and
/// `inv_std` (device, `outer` each) and, when `dx` is not null, dX from dY, dMean and
/// dInvStdDev (each may be null; dMean and dInvStdDev float32). x, scale, dy and dx are of
/// `dtype`, as launch_layer_norm's.
bool launch_layer_norm_grad_rows(DType dtype, const void* x, const void* scale, const void* dy,
                                 const float* dmean, const float* dinv, void* dx, double* mean,
                                 double* inv_std, int64_t outer, int64_t inner, double epsilon,
                                 cudaStream_t stream);

/// LayerNormalizationGrad's column sums over the rows (double, across the device in a fixed
/// order: column_reduce.cuh): dScale and dB (either may be null) from dY and the statistics of
/// launch_layer_norm_grad_rows. `partial` holds 2 * slices * inner doubles, slices from
/// column_slices(outer, inner). x, dy, dscale and dbias are of `dtype`.
bool launch_layer_norm_grad_columns(DType dtype, const void* x, const void* dy, const double* mean,
                                    const double* inv_std, void* dscale, void* dbias,
                                    int64_t outer, int64_t inner, double* partial,
                                    int64_t slices, cudaStream_t stream);

/// The operands of BatchNormalization over X [N, C, S] (S: the spatial dims' product). X, Y,
/// dY and dX are of `dtype`: float32, or a 16-bit float read widened exactly and written rounded
/// to nearest even (the widened fallback's bits, without its casts); the rest float32.
struct BatchNormArgs {
  DType dtype = DType::kFloat32;
  const void* x = nullptr;
  const float* scale = nullptr;
  const float* bias = nullptr;
  const float* mean = nullptr;  ///< the input mean (inference) or running mean
  const float* var = nullptr;   ///< the input variance (inference) or running variance
  int64_t n = 0, c = 0, s = 0;
  float epsilon = 1e-5f, momentum = 0.9f;
};

/// Inference: y = scale * (x - mean) / sqrt(var + eps) + bias.
/// False (nothing launched) for a dtype without a kernel, as the other launchers below.
bool launch_batch_norm_inference(const BatchNormArgs& args, void* y, cudaStream_t stream);

/// training_mode=1: one block per channel normalises with the batch's mean and biased variance
/// (in double) and writes the running statistics mean * momentum + batch * (1 - momentum) to
/// `running_mean` and `running_var` (either may be null).
bool launch_batch_norm_training(const BatchNormArgs& args, void* y, float* running_mean,
                                float* running_var, cudaStream_t stream);

/// The gradients of BatchNormalization (the CPU's formulas, in double, one block per channel):
/// dy, drm, drv (the gradients of Y, running mean, running var) may be null, and so may each
/// output (dx, dscale, dbias, dmean, dvar).
struct BatchNormGradArgs {
  BatchNormArgs forward;
  bool training = false;
  const void* dy = nullptr;
  const float* drm = nullptr;
  const float* drv = nullptr;
  void* dx = nullptr;
  float* dscale = nullptr;
  float* dbias = nullptr;
  float* dmean = nullptr;
  float* dvar = nullptr;
};
bool launch_batch_norm_grad(const BatchNormGradArgs& args, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
