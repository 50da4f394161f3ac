#pragma once
/// \file
/// Device kernels of the CUDA attention family (attention_kernels.cu), float32: the fused
/// Attention forward and its gradient (the op's contract: runtime/ops/attention_shape.h). A plain
/// version: one warp per query row (the forward, D and dQ) or per key row (dK and dV), walking
/// the keys (or queries) one at a time, each dot product summed by a fixed butterfly of warp
/// shuffles, so a run is reproducible. The forward keeps an online softmax (running max and
/// sum, O rescaled in place); the gradient recomputes each probability from lse. The launchers
/// run the tiled kernels instead (attention_tiled.h: heads of 32, 64 or 128) where they apply,
/// 22x faster on GPT-2's shapes on an H200 (bench/RESULTS.md).
/// Every launch is queued on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/ops/attention_element.h"

namespace stagecraft::rt::cuda {

/// The operands of a node as dense float32 arrays (attention_element.h's layout); `mask` is
/// null without a mask. The gradient's fields are unused by the forward.
struct AttentionPointers {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* mask = nullptr;
  const float* lse = nullptr;    ///< The forward's lse.
  const float* d_o = nullptr;    ///< dO.
  const float* delta = nullptr;  ///< D = rowsum(dO * O) - dlse, one per query.
};

/// Whether $STAGECRAFT_ATTENTION_KERNELS=plain asked for the plain kernels on every node.
bool plain_attention_chosen();

/// Whether 16-bit nodes run the tensor-core kernels (attention_tiled.h's mma_attention_*; the
/// tiled kernels where they do not apply): the default, unless $STAGECRAFT_ATTENTION_KERNELS
/// names another choice (tiled, tensor-core, plain).
bool mma_attention_chosen();

/// How the tensor-core kernels (attention_mma.cu) bring their streamed tiles in and read the
/// products' B fragments.
enum class MmaTiles {
  /// Loaded through registers, with a copy stored transposed for the B fragments (checked on an
  /// H200, 2026-11-30): the default.
  kTransposed,
  /// Loaded through registers, row-major only; B fragments by ldmatrix.trans
  /// ($STAGECRAFT_ATTENTION_KERNELS=mma-ldmatrix, not yet checked on a GPU).
  kLdmatrix,
  /// As kLdmatrix, the next tile copied by cp.async into a second buffer while the warps compute
  /// on the current one ($STAGECRAFT_ATTENTION_KERNELS=mma-async, not yet checked on a GPU).
  kAsync,
};

/// The MmaTiles $STAGECRAFT_ATTENTION_KERNELS asks for (kTransposed unless mma-ldmatrix or
/// mma-async).
MmaTiles mma_tiles_chosen();

/// Whether $STAGECRAFT_ATTENTION_KERNELS=mma-expf asked for the tensor-core kernels with the
/// mask rules and an accurate expf on every score (their first version, kept to compare): by
/// default they skip the rules on tiles where no score is masked
/// (ops::attention_tile_unmasked) and take exp2f of scores scaled by log2(e) (attention_mma.cu).
bool every_element_attention_chosen();

/// O and lse (which may be null) of the node.
void launch_attention_forward(const ops::AttentionDims& dims, const AttentionPointers& p, float* o,
                              float* lse, cudaStream_t stream);

/// delta[r] = sum over c of d_o[r, c] * o[r, c], minus dlse[r] where dlse is not null, for the
/// `rows` rows of `cols` values.
void launch_attention_delta(const float* d_o, const float* o, const float* dlse, float* delta,
                            int64_t rows, int64_t cols, cudaStream_t stream);

/// dQ = scale * dS K over every key, dS = P * (dO V^T - D).
void launch_attention_dq(const ops::AttentionDims& dims, const AttentionPointers& p, float* dq,
                         cudaStream_t stream);

/// dV = P^T dO and dK = scale * dS^T Q over every query; either output may be null.
void launch_attention_dkv(const ops::AttentionDims& dims, const AttentionPointers& p, float* dk,
                          float* dv, cudaStream_t stream);

/// dmask (`numel` floats, the mask's layout): dS = P * (dO V^T - D) summed over the dims the
/// mask broadcasts along. One warp per element of the mask, plain (no tiles): it runs only for a
/// learned mask (a position bias: mask_gradient = 1), whose planes are few.
void launch_attention_dmask(const ops::AttentionDims& dims, const AttentionPointers& p,
                            float* dmask, int64_t numel, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
