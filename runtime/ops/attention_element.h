#pragma once
/// \file
/// The geometry of a fused Attention node (runtime/ops/attention_shape.h reads it from the node)
/// as plain data, and the two rules every kernel of it applies per element: where its additive
/// mask lies for a (batch, query, key) triple and which keys a query sees under `causal`. The
/// host compiler builds these for the CPU backend (runtime/cpu/attention.cpp) and nvcc for the
/// CUDA one (runtime/cuda/attention_kernels.cu); nothing here includes a CUDA header.

#include <cstdint>

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::ops {

/// The most leading dims ([..., T, d]) an Attention node's operands may have (rank 8 in all).
inline constexpr int kMaxAttentionLeadDims = 6;

/// An Attention node resolved: Q [batch, tq, d], K [batch, tk, d], V [batch, tk, dv],
/// O [batch, tq, dv] and lse [batch, tq], all dense row-major, `batch` the product of the leading
/// dims. The optional mask is read through strides that broadcast it to [lead..., tq, tk]
/// (a stride of 0 along a dim it broadcasts over).
struct AttentionDims {
  int64_t batch = 0, tq = 0, tk = 0, d = 0, dv = 0;
  float scale = 1.0f;
  bool causal = false;
  bool has_mask = false;
  int32_t lead_rank = 0;
  int64_t lead_dims[kMaxAttentionLeadDims] = {};
  int64_t mask_lead_strides[kMaxAttentionLeadDims] = {};
  int64_t mask_row_stride = 0, mask_col_stride = 0;
};

/// The offset in the mask of batch entry `b`'s [tq, tk] plane (0 without a mask).
STAGECRAFT_HOST_DEVICE inline int64_t attention_mask_plane(const AttentionDims& s, int64_t b) {
  int64_t offset = 0;
  for (int k = s.lead_rank - 1; k >= 0; --k) {
    offset += (b % s.lead_dims[k]) * s.mask_lead_strides[k];
    b /= s.lead_dims[k];
  }
  return offset;
}

/// The mask's value for query `i` and key `j` of the plane at `plane` (attention_mask_plane);
/// 0 without a mask.
STAGECRAFT_HOST_DEVICE inline float attention_mask_at(const AttentionDims& s, const float* mask,
                                                      int64_t plane, int64_t i, int64_t j) {
  return s.has_mask ? mask[plane + i * s.mask_row_stride + j * s.mask_col_stride] : 0.0f;
}

/// How many keys query `i` sees: all of them, or under `causal` keys 0..i (top-left aligned,
/// as torch's scaled_dot_product_attention(is_causal=True)), so a query past the last key sees
/// every key and, with tq > tk, none is left without one.
STAGECRAFT_HOST_DEVICE inline int64_t attention_keys_seen(const AttentionDims& s, int64_t i) {
  return s.causal && i + 1 < s.tk ? i + 1 : s.tk;
}

/// Whether every score of the tile of queries [q0, q0 + rows) and keys [k0, k0 + cols) is the
/// plain scaled product: no mask tensor, every query and key within range, and (under `causal`)
/// the tile's first query, so every query of it, sees every key of it. A kernel may then skip
/// the per-element rules on that tile (the CUDA tensor-core kernels do: the tiles below the
/// diagonal of a causal attention, all of an unmasked one's but the ragged edges).
STAGECRAFT_HOST_DEVICE inline bool attention_tile_unmasked(const AttentionDims& s, int64_t q0,
                                                           int64_t rows, int64_t k0, int64_t cols) {
  return !s.has_mask && q0 + rows <= s.tq && k0 + cols <= s.tk &&
         attention_keys_seen(s, q0) >= k0 + cols;
}

/// The first query that sees key `j`: 0, or j under `causal`.
STAGECRAFT_HOST_DEVICE inline int64_t attention_first_query(const AttentionDims& s, int64_t j) {
  return s.causal ? j : 0;
}

}  // namespace stagecraft::rt::ops
