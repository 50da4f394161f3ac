// The CUDA attention family's device kernels (attention_kernels.h): one warp per row, each lane
// over a strided share of the row's columns; dot products summed by an xor butterfly, which
// leaves the same bits in every lane, so the lanes agree on every running max and sum.
#include <math_constants.h>

#include <cstdlib>
#include <cstring>

#include "runtime/cuda/attention_kernels.h"
#include "runtime/cuda/attention_tiled.h"

namespace stagecraft::rt::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

unsigned blocks_for(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(blocks < kMaxBlocks ? (blocks < 1 ? 1 : blocks) : kMaxBlocks);
}

// This thread's warp and the number of warps of the grid (the row loop's start and stride).
__device__ int64_t warp_index() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
}
__device__ int64_t warp_count() { return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock; }

// Calls body(b, i, row, plane) for each row (b, i) of `rows_per_entry` rows of the `batch`
// entries that falls to this thread's warp (plane: the entry's mask plane).
template <class Body>
__device__ void for_warp_rows(const ops::AttentionDims& s, int64_t rows_per_entry, Body body) {
  for (int64_t row = warp_index(); row < s.batch * rows_per_entry; row += warp_count()) {
    const int64_t b = row / rows_per_entry;
    body(b, row % rows_per_entry, row, ops::attention_mask_plane(s, b));
  }
}

// sum over c < n of a[c] * b[c], every lane of the warp getting the same bits.
__device__ float warp_dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t c = threadIdx.x % 32; c < n; c += 32) sum += a[c] * b[c];
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  return sum;
}

// The scaled, masked score of query i and key j of batch entry b (mask plane `plane`).
__device__ float score(const ops::AttentionDims& s, const AttentionPointers& p, int64_t b,
                       int64_t plane, int64_t i, int64_t j) {
  return s.scale * warp_dot(p.q + (b * s.tq + i) * s.d, p.k + (b * s.tk + j) * s.d, s.d) +
         ops::attention_mask_at(s, p.mask, plane, i, j);
}

// P of a score from its query's lse (0 for a query that sees no key).
__device__ float probability(float score_ij, float lse) {
  return lse == -CUDART_INF_F ? 0.0f : expf(score_ij - lse);
}

__global__ void forward_kernel(ops::AttentionDims s, AttentionPointers p, float* o, float* lse) {
  const int64_t lane = threadIdx.x % 32;
  for_warp_rows(s, s.tq, [&](int64_t b, int64_t i, int64_t row, int64_t plane) {
    float* out = o + row * s.dv;
    for (int64_t c = lane; c < s.dv; c += 32) out[c] = 0.0f;
    float top = -CUDART_INF_F, sum = 0.0f;
    const int64_t seen = ops::attention_keys_seen(s, i);
    for (int64_t j = 0; j < seen; ++j) {
      const float x = score(s, p, b, plane, i, j);
      const float next = fmaxf(top, x);
      if (next == -CUDART_INF_F) continue;
      const float rescale = expf(top - next), e = expf(x - next);
      sum = sum * rescale + e;
      top = next;
      const float* v = p.v + (b * s.tk + j) * s.dv;
      for (int64_t c = lane; c < s.dv; c += 32) out[c] = out[c] * rescale + e * v[c];
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t c = lane; c < s.dv; c += 32) out[c] *= inv;
    if (lse != nullptr && lane == 0) lse[row] = sum > 0.0f ? top + logf(sum) : -CUDART_INF_F;
  });
}

__global__ void delta_kernel(const float* d_o, const float* o, const float* dlse, float* delta,
                             int64_t rows, int64_t cols) {
  for (int64_t row = warp_index(); row < rows; row += warp_count()) {
    const float sum = warp_dot(d_o + row * cols, o + row * cols, cols);
    if (threadIdx.x % 32 == 0) delta[row] = dlse != nullptr ? sum - dlse[row] : sum;
  }
}

// dS of query i and key j of entry b, scaled: scale * P * (dO V^T - D).
__device__ float scaled_ds(const ops::AttentionDims& s, const AttentionPointers& p, int64_t b,
                           int64_t i, int64_t j, float prob) {
  const int64_t row = b * s.tq + i;
  const float dp = warp_dot(p.d_o + row * s.dv, p.v + (b * s.tk + j) * s.dv, s.dv);
  return s.scale * prob * (dp - p.delta[row]);
}

__global__ void dq_kernel(ops::AttentionDims s, AttentionPointers p, float* dq) {
  const int64_t lane = threadIdx.x % 32;
  for_warp_rows(s, s.tq, [&](int64_t b, int64_t i, int64_t row, int64_t plane) {
    float* out = dq + row * s.d;
    for (int64_t c = lane; c < s.d; c += 32) out[c] = 0.0f;
    const int64_t seen = ops::attention_keys_seen(s, i);
    for (int64_t j = 0; j < seen; ++j) {
      const float prob = probability(score(s, p, b, plane, i, j), p.lse[row]);
      const float ds = scaled_ds(s, p, b, i, j, prob);
      const float* k = p.k + (b * s.tk + j) * s.d;
      for (int64_t c = lane; c < s.d; c += 32) out[c] += ds * k[c];
    }
  });
}

__global__ void dkv_kernel(ops::AttentionDims s, AttentionPointers p, float* dk, float* dv) {
  const int64_t lane = threadIdx.x % 32;
  for_warp_rows(s, s.tk, [&](int64_t b, int64_t j, int64_t key, int64_t plane) {
    float* dk_row = dk != nullptr ? dk + key * s.d : nullptr;
    float* dv_row = dv != nullptr ? dv + key * s.dv : nullptr;
    for (int64_t c = lane; dk_row && c < s.d; c += 32) dk_row[c] = 0.0f;
    for (int64_t c = lane; dv_row && c < s.dv; c += 32) dv_row[c] = 0.0f;
    for (int64_t i = ops::attention_first_query(s, j); i < s.tq; ++i) {
      const int64_t row = b * s.tq + i;
      const float prob = probability(score(s, p, b, plane, i, j), p.lse[row]);
      const float* d_o = p.d_o + row * s.dv;
      for (int64_t c = lane; dv_row && c < s.dv; c += 32) dv_row[c] += prob * d_o[c];
      if (!dk_row) continue;
      const float ds = scaled_ds(s, p, b, i, j, prob);
      const float* q = p.q + row * s.d;
      for (int64_t c = lane; c < s.d; c += 32) dk_row[c] += ds * q[c];
    }
  });
}

// dmask: one warp per element e of the mask, summing dS = P * (dO V^T - D) over every (entry,
// query, key) the mask broadcasts e to, in a fixed order: the entries whose plane is e's, then
// the queries and keys e covers (one of each where the mask has a dim for it, all where it
// broadcasts along it). The element's query and key come from the mask's strides (dense, right-
// aligned to [lead..., Tq, Tk]; attention_shape.h), its plane from what is left.
__global__ void dmask_kernel(ops::AttentionDims s, AttentionPointers p, float* dmask,
                             int64_t numel) {
  const int64_t rows = s.mask_row_stride, cols = s.mask_col_stride;
  for (int64_t e = warp_index(); e < numel; e += warp_count()) {
    const int64_t i_at = rows != 0 ? (e / rows) % s.tq : 0;
    const int64_t j_at = cols != 0 ? (e / cols) % s.tk : 0;
    const int64_t plane = e - i_at * rows - j_at * cols;
    const int64_t i_end = rows != 0 ? i_at + 1 : s.tq;
    const int64_t j_end = cols != 0 ? j_at + 1 : s.tk;
    float sum = 0.0f;
    for (int64_t b = 0; b < s.batch; ++b) {
      if (ops::attention_mask_plane(s, b) != plane) continue;
      for (int64_t i = rows != 0 ? i_at : 0; i < i_end; ++i) {
        const int64_t row = b * s.tq + i;
        const int64_t seen = ops::attention_keys_seen(s, i);
        for (int64_t j = cols != 0 ? j_at : 0; j < j_end && j < seen; ++j) {
          const float prob = probability(score(s, p, b, plane, i, j), p.lse[row]);
          const float dp = warp_dot(p.d_o + row * s.dv, p.v + (b * s.tk + j) * s.dv, s.dv);
          sum += prob * (dp - p.delta[row]);
        }
      }
    }
    if (threadIdx.x % 32 == 0) dmask[e] = sum;
  }
}

// Which kernels run where they apply: $STAGECRAFT_ATTENTION_KERNELS, "mma" (the default: 16-bit
// nodes on the tensor cores, attention_mma.cu, GPT-2 mixed's step 79 -> 64 ms on an H200;
// float32 nodes as "tiled"), "tiled" (the tile products on the ordinary cores for 16-bit nodes
// too), "tensor-core" (float32 nodes' products in three tf32 passes; measured slower on an H200,
// bench/RESULTS.md), "mma-ldmatrix" (the tensor-core kernels with their B fragments read by
// ldmatrix.trans, not yet checked on a GPU), "mma-async" (those with the next tile of keys or
// queries copied by cp.async while the current one is computed on, not yet checked), "mma-expf"
// (the tensor-core kernels applying the mask rules and an accurate expf to every score, as before
// they skipped the rules on unmasked tiles) or "plain", to compare them; any other value is the
// default. Read once.
enum class Kernels { kTensorCore, kTiled, kMma, kMmaLdmatrix, kMmaAsync, kMmaExpf, kPlain };
Kernels chosen_kernels() {
  static const Kernels chosen = [] {
    const char* e = std::getenv("STAGECRAFT_ATTENTION_KERNELS");
    if (e != nullptr && std::strcmp(e, "tensor-core") == 0) return Kernels::kTensorCore;
    if (e != nullptr && std::strcmp(e, "tiled") == 0) return Kernels::kTiled;
    if (e != nullptr && std::strcmp(e, "mma-ldmatrix") == 0) return Kernels::kMmaLdmatrix;
    if (e != nullptr && std::strcmp(e, "mma-async") == 0) return Kernels::kMmaAsync;
    if (e != nullptr && std::strcmp(e, "mma-expf") == 0) return Kernels::kMmaExpf;
    if (e != nullptr && std::strcmp(e, "plain") == 0) return Kernels::kPlain;
    return Kernels::kMma;
  }();
  return chosen;
}

// Runs `tensor_core` or `tiled` (each returns whether it applied) as chosen; false: the plain
// kernel runs.
template <class TensorCore, class Tiled>
bool ran_tiled(TensorCore tensor_core, Tiled tiled) {
  switch (chosen_kernels()) {
    case Kernels::kTensorCore: return tensor_core() || tiled();
    case Kernels::kTiled:
    case Kernels::kMma:
    case Kernels::kMmaLdmatrix:
    case Kernels::kMmaAsync:
    case Kernels::kMmaExpf:
      return tiled();
    case Kernels::kPlain: return false;
  }
  return false;
}

}  // namespace

bool plain_attention_chosen() { return chosen_kernels() == Kernels::kPlain; }

bool mma_attention_chosen() {
  const Kernels k = chosen_kernels();
  return k == Kernels::kMma || k == Kernels::kMmaLdmatrix || k == Kernels::kMmaAsync ||
         k == Kernels::kMmaExpf;
}

bool every_element_attention_chosen() { return chosen_kernels() == Kernels::kMmaExpf; }

MmaTiles mma_tiles_chosen() {
  switch (chosen_kernels()) {
    case Kernels::kMmaLdmatrix:
      return MmaTiles::kLdmatrix;
    case Kernels::kMmaAsync:
      return MmaTiles::kAsync;
    default:
      return MmaTiles::kTransposed;
  }
}

void launch_attention_forward(const ops::AttentionDims& dims, const AttentionPointers& p, float* o,
                              float* lse, cudaStream_t stream) {
  const int64_t rows = dims.batch * dims.tq;
  if (rows == 0 ||
      ran_tiled([&] { return tensor_core_attention_forward(dims, p, o, lse, stream); },
                [&] { return tiled_attention_forward(dims, p, o, lse, stream); }))
    return;
  forward_kernel<<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream>>>(dims, p, o, lse);
}

void launch_attention_delta(const float* d_o, const float* o, const float* dlse, float* delta,
                            int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  delta_kernel<<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream>>>(d_o, o, dlse, delta, rows,
                                                                     cols);
}

void launch_attention_dq(const ops::AttentionDims& dims, const AttentionPointers& p, float* dq,
                         cudaStream_t stream) {
  const int64_t rows = dims.batch * dims.tq;
  if (rows == 0 || ran_tiled([&] { return tensor_core_attention_dq(dims, p, dq, stream); },
                             [&] { return tiled_attention_dq(dims, p, dq, stream); }))
    return;
  dq_kernel<<<blocks_for(rows), kWarpsPerBlock * 32, 0, stream>>>(dims, p, dq);
}

void launch_attention_dkv(const ops::AttentionDims& dims, const AttentionPointers& p, float* dk,
                          float* dv, cudaStream_t stream) {
  const int64_t keys = dims.batch * dims.tk;
  if (keys == 0 || (dk == nullptr && dv == nullptr)) return;
  if (ran_tiled([&] { return tensor_core_attention_dkv(dims, p, dk, dv, stream); },
                [&] { return tiled_attention_dkv(dims, p, dk, dv, stream); }))
    return;
  dkv_kernel<<<blocks_for(keys), kWarpsPerBlock * 32, 0, stream>>>(dims, p, dk, dv);
}

void launch_attention_dmask(const ops::AttentionDims& dims, const AttentionPointers& p,
                            float* dmask, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return;
  dmask_kernel<<<blocks_for(numel), kWarpsPerBlock * 32, 0, stream>>>(dims, p, dmask, numel);
}

}  // namespace stagecraft::rt::cuda
