// The tensor-core attention kernels (attention_tiled.h): the tiled kernels' blocks and tiles
// (attention_tiled.cu: 64 queries or 64 keys a block, 256 threads, Q, K, V and dO staged in
// shared memory), with every tile product on the tensor cores through WMMA's tf32 shape
// (16 x 16 x 8) in three passes: each float32 operand x split as hi = tf32(x) and
// lo = tf32(x - hi), and a b summed as lo_a hi_b + hi_a lo_b + hi_a hi_b in float32, which
// leaves out only lo_a lo_b (2^-22 of the product): float32's precision to within a few
// roundings, where one tf32 pass would keep 10 bits. The softmax and the dS arithmetic run on
// the ordinary cores over score tiles stored in shared memory. No atomics: dQ and dK/dV are
// separate kernels, as in the tiled ones, and every sum runs in a fixed order.
//
// Warp w of the 8 holds score fragments (rt, ct) = (w / 2, 2 (w % 2) + {0, 1}) of a 64 x 64
// tile, and output fragments f = w D / 32 + {0 .. D / 32 - 1} of a [64][D] tile, at
// (f / (D / 16), f % (D / 16)). Shared rows are padded to D + 4 and 68 floats: 16-byte
// aligned rows whose 16-row fragments start 32-byte aligned, as WMMA needs.
#include <math_constants.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "runtime/cuda/attention_tiled.h"
#include "runtime/cuda/attention_tiles.cuh"

namespace stagecraft::rt::cuda {
namespace {

using namespace nvcuda;
using namespace attention_tiles;

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;
template <class Layout>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, Layout>;
template <class Layout>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, Layout>;

template <class Frag>
__device__ void split(Frag& hi, Frag& lo) {
#pragma unroll
  for (int e = 0; e < hi.num_elements; ++e) {
    const float x = hi.x[e], h = wmma::__float_to_tf32(x);
    hi.x[e] = h;
    lo.x[e] = wmma::__float_to_tf32(x - h);
  }
}

// acc += A B over `length` (a multiple of 8) of the shared dimension: A's 16 rows from `a`
// (stepping `a_step` floats per 8 of the shared dimension), B's 16 columns from `b` (likewise).
template <class LayoutA, class LayoutB>
__device__ void product(Acc& acc, const float* a, int lda, int a_step, const float* b, int ldb,
                        int b_step, int length) {
  for (int k = 0; k < length; k += 8) {
    FragA<LayoutA> a_hi, a_lo;
    FragB<LayoutB> b_hi, b_lo;
    wmma::load_matrix_sync(a_hi, a + (k / 8) * a_step, lda);
    wmma::load_matrix_sync(b_hi, b + (k / 8) * b_step, ldb);
    split(a_hi, a_lo);
    split(b_hi, b_lo);
    wmma::mma_sync(acc, a_lo, b_hi, acc);
    wmma::mma_sync(acc, a_hi, b_lo, acc);
    wmma::mma_sync(acc, a_hi, b_hi, acc);
  }
}

__device__ int warp() { return static_cast<int>(threadIdx.x) / 32; }

// The warp's two fragments of X Y^T (X, Y: [64][D] tiles) stored row-major into `out` (a
// [64][64] tile).
template <int D>
__device__ void scores(const float* x, const float* y, float* out) {
  constexpr int S = Geometry<D>::kStride;
  const int rt = warp() / 2;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int ct = 2 * (warp() % 2) + i;
    Acc acc;
    wmma::fill_fragment(acc, 0.0f);
    // Y^T's element (k, n) is y[n][k]: column-major with leading dimension S.
    product<wmma::row_major, wmma::col_major>(acc, x + 16 * rt * S, S, 8, y + 16 * ct * S, S, 8, D);
    wmma::store_matrix_sync(out + 16 * rt * kSquareStride + 16 * ct, acc, kSquareStride,
                            wmma::mem_row_major);
  }
}

// acc[i] += W M (or W^T M when `kTransposed`) for the warp's output fragments: W a [64][64]
// tile, M a [64][D] tile.
template <int D, bool kTransposed>
__device__ void accumulate(Acc (&acc)[Geometry<D>::kOutFrags], const float* w, const float* m) {
  constexpr int S = Geometry<D>::kStride;
#pragma unroll
  for (int i = 0; i < Geometry<D>::kOutFrags; ++i) {
    const int f = warp() * Geometry<D>::kOutFrags + i;
    const int rt = f / Geometry<D>::kCols, ct = f % Geometry<D>::kCols;
    if constexpr (kTransposed)  // W^T's element (m, k) is w[k][m]: column-major
      product<wmma::col_major, wmma::row_major>(acc[i], w + 16 * rt, kSquareStride,
                                                8 * kSquareStride, m + 16 * ct, S, 8 * S, kTile);
    else
      product<wmma::row_major, wmma::row_major>(acc[i], w + 16 * rt * kSquareStride, kSquareStride,
                                                8, m + 16 * ct, S, 8 * S, kTile);
  }
}

// The warp's output fragments stored into a [64][D] tile.
template <int D>
__device__ void store_outputs(const Acc (&acc)[Geometry<D>::kOutFrags], float* tile) {
  constexpr int S = Geometry<D>::kStride;
#pragma unroll
  for (int i = 0; i < Geometry<D>::kOutFrags; ++i) {
    const int f = warp() * Geometry<D>::kOutFrags + i;
    const int rt = f / Geometry<D>::kCols, ct = f % Geometry<D>::kCols;
    wmma::store_matrix_sync(tile + 16 * rt * S + 16 * ct, acc[i], S, wmma::mem_row_major);
  }
}

// Rows first .. of a [64][D] tile to the entry's [rows][D] array `dst`, those before `limit`.
template <int D>
__device__ void store_tile(float* dst, const float* tile, int64_t first, int64_t limit) {
  constexpr int kVectors = D / 4;
  for (int idx = threadIdx.x; idx < kTile * kVectors; idx += kThreads) {
    const int r = idx / kVectors, c = idx % kVectors;
    if (first + r < limit)
      reinterpret_cast<float4*>(dst + (first + r) * D)[c] =
          *reinterpret_cast<const float4*>(tile + r * Geometry<D>::kStride + 4 * c);
  }
}

// The SIMT share of a [64][64] tile: thread t holds row t / 4, columns 16 (t % 4) .. + 15.
__device__ int simt_row() { return static_cast<int>(threadIdx.x) / 4; }
__device__ int simt_first_col() { return 16 * (static_cast<int>(threadIdx.x) % 4); }
__device__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(ops::AttentionDims s, AttentionPointers p, float* o, float* lse) {
  using G = Geometry<D>;
  extern __shared__ __align__(128) float shared_floats[];
  float* qs = shared_floats;
  float* ks = qs + G::kTileFloats;
  float* vs = ks + G::kTileFloats;
  float* os = vs + G::kTileFloats;
  float* ss = os + G::kTileFloats;
  const auto [b, q0] = block_tile(s.tq);
  const int64_t plane = ops::attention_mask_plane(s, b);
  load_tile<D>(qs, p.q + b * s.tq * D, q0, s.tq);
  for (int idx = threadIdx.x; idx < G::kTileFloats; idx += kThreads) os[idx] = 0.0f;
  const int row = simt_row(), col0 = simt_first_col();
  const int64_t i = q0 + row;
  float top = -CUDART_INF_F, sum = 0.0f;  // the same in the 4 threads of the row
  const int64_t last = (q0 + kTile < s.tq ? q0 + kTile : s.tq) - 1;
  const int64_t keys = ops::attention_keys_seen(s, last);
  for (int64_t k0 = 0; k0 < keys; k0 += kTile) {
    __syncthreads();  // every thread is done with the last tiles of K, V and P
    load_tile<D>(ks, p.k + b * s.tk * D, k0, s.tk);
    load_tile<D>(vs, p.v + b * s.tk * D, k0, s.tk);
    __syncthreads();
    scores<D>(qs, ks, ss);
    __syncthreads();
    float x[16], m = -CUDART_INF_F;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      x[c] = masked_score(s, p.mask, plane, i, k0 + col0 + c, ss[row * kSquareStride + col0 + c]);
      m = fmaxf(m, x[c]);
    }
    const float next = fmaxf(top, quad_max(m));
    const bool none = next == -CUDART_INF_F;  // no key seen yet: O and sum stay 0
    const float rescale = none ? 1.0f : expf(top - next);
    float part = 0.0f;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      x[c] = none ? 0.0f : expf(x[c] - next);
      part += x[c];
      ss[row * kSquareStride + col0 + c] = x[c];
    }
    sum = sum * rescale + quad_sum(part);
    top = next;
    for (int c = (col0 / 16) * (D / 4); c < (col0 / 16 + 1) * (D / 4); ++c)
      os[row * G::kStride + c] *= rescale;
    __syncthreads();
    Acc acc[G::kOutFrags];
#pragma unroll
    for (int f = 0; f < G::kOutFrags; ++f) {
      const int fi = warp() * G::kOutFrags + f;
      wmma::load_matrix_sync(acc[f], os + 16 * (fi / G::kCols) * G::kStride + 16 * (fi % G::kCols),
                             G::kStride, wmma::mem_row_major);
    }
    accumulate<D, false>(acc, ss, vs);
    store_outputs<D>(acc, os);
  }
  __syncthreads();
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int c = (col0 / 16) * (D / 4); c < (col0 / 16 + 1) * (D / 4); ++c)
    os[row * G::kStride + c] *= inv;
  if (lse != nullptr && col0 == 0 && i < s.tq)
    lse[b * s.tq + i] = sum > 0.0f ? top + logf(sum) : -CUDART_INF_F;
  __syncthreads();
  store_tile<D>(o + b * s.tq * D, os, q0, s.tq);
}

// dS of the [64][64] tile from the scores in `ss` and dO V^T in `dps`: P to `ps` (may be `ss`),
// scale P (dP - D) to `dss` (may be `dps`).
__device__ void probabilities_and_ds(const ops::AttentionDims& s, const float* mask, int64_t plane,
                                     int64_t q0, int64_t k0, const float* lse_s,
                                     const float* delta_s, float* ss, float* dps) {
  const int row = simt_row(), col0 = simt_first_col();
#pragma unroll 4
  for (int c = 0; c < 16; ++c) {
    const int at = row * kSquareStride + col0 + c;
    const float prob = probability(s, mask, plane, q0 + row, k0 + col0 + c, ss[at], lse_s[row]);
    ss[at] = prob;
    dps[at] = s.scale * prob * (dps[at] - delta_s[row]);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(ops::AttentionDims s, AttentionPointers p, float* dq) {
  using G = Geometry<D>;
  extern __shared__ __align__(128) float shared_floats[];
  float* qs = shared_floats;
  float* dos = qs + G::kTileFloats;
  float* ks = dos + G::kTileFloats;
  float* vs = ks + G::kTileFloats;
  float* ss = vs + G::kTileFloats;
  float* dps = ss + kSquareFloats;
  float* lse_s = dps + kSquareFloats;
  float* delta_s = lse_s + kTile;
  const auto [b, q0] = block_tile(s.tq);
  const int64_t plane = ops::attention_mask_plane(s, b);
  load_tile<D>(qs, p.q + b * s.tq * D, q0, s.tq);
  load_tile<D>(dos, p.d_o + b * s.tq * D, q0, s.tq);
  load_rows(lse_s, delta_s, p.lse + b * s.tq, p.delta + b * s.tq, q0, s.tq);
  Acc acc[G::kOutFrags];
#pragma unroll
  for (int f = 0; f < G::kOutFrags; ++f) wmma::fill_fragment(acc[f], 0.0f);
  const int64_t last = (q0 + kTile < s.tq ? q0 + kTile : s.tq) - 1;
  const int64_t keys = ops::attention_keys_seen(s, last);
  for (int64_t k0 = 0; k0 < keys; k0 += kTile) {
    __syncthreads();
    load_tile<D>(ks, p.k + b * s.tk * D, k0, s.tk);
    load_tile<D>(vs, p.v + b * s.tk * D, k0, s.tk);
    __syncthreads();
    scores<D>(qs, ks, ss);
    scores<D>(dos, vs, dps);
    __syncthreads();
    probabilities_and_ds(s, p.mask, plane, q0, k0, lse_s, delta_s, ss, dps);
    __syncthreads();
    accumulate<D, false>(acc, dps, ks);
  }
  __syncthreads();  // qs is free: the staging tile of dQ
  store_outputs<D>(acc, qs);
  __syncthreads();
  store_tile<D>(dq + b * s.tq * D, qs, q0, s.tq);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    dkv_kernel(ops::AttentionDims s, AttentionPointers p, float* dk, float* dv) {
  using G = Geometry<D>;
  extern __shared__ __align__(128) float shared_floats[];
  float* ks = shared_floats;
  float* vs = ks + G::kTileFloats;
  float* qs = vs + G::kTileFloats;
  float* dos = qs + G::kTileFloats;
  float* ss = dos + G::kTileFloats;
  float* dps = ss + kSquareFloats;
  float* lse_s = dps + kSquareFloats;
  float* delta_s = lse_s + kTile;
  const auto [b, k0] = block_tile(s.tk);
  const int64_t plane = ops::attention_mask_plane(s, b);
  load_tile<D>(ks, p.k + b * s.tk * D, k0, s.tk);
  load_tile<D>(vs, p.v + b * s.tk * D, k0, s.tk);
  Acc acc_k[G::kOutFrags], acc_v[G::kOutFrags];
#pragma unroll
  for (int f = 0; f < G::kOutFrags; ++f) {
    wmma::fill_fragment(acc_k[f], 0.0f);
    wmma::fill_fragment(acc_v[f], 0.0f);
  }
  const int64_t first = (ops::attention_first_query(s, k0) / kTile) * kTile;
  for (int64_t q0 = first; q0 < s.tq; q0 += kTile) {
    __syncthreads();
    load_tile<D>(qs, p.q + b * s.tq * D, q0, s.tq);
    load_tile<D>(dos, p.d_o + b * s.tq * D, q0, s.tq);
    load_rows(lse_s, delta_s, p.lse + b * s.tq, p.delta + b * s.tq, q0, s.tq);
    __syncthreads();
    scores<D>(qs, ks, ss);
    scores<D>(dos, vs, dps);
    __syncthreads();
    probabilities_and_ds(s, p.mask, plane, q0, k0, lse_s, delta_s, ss, dps);
    __syncthreads();
    accumulate<D, true>(acc_v, ss, dos);
    accumulate<D, true>(acc_k, dps, qs);
  }
  __syncthreads();  // K and V are free: the staging tiles of dK and dV
  store_outputs<D>(acc_k, ks);
  store_outputs<D>(acc_v, vs);
  __syncthreads();
  if (dk != nullptr) store_tile<D>(dk + b * s.tk * D, ks, k0, s.tk);
  if (dv != nullptr) store_tile<D>(dv + b * s.tk * D, vs, k0, s.tk);
}

/// This implementation's kernels and their shared bytes, for Launches.
struct Kernels {
  template <int D, class T>
  static auto forward() {
    static_assert(std::is_same_v<T, float>, "the tensor-core kernels read float32 operands");
    return forward_kernel<D>;
  }
  template <int D, class T>
  static auto dq() {
    static_assert(std::is_same_v<T, float>, "the tensor-core kernels read float32 operands");
    return dq_kernel<D>;
  }
  template <int D, class T>
  static auto dkv() {
    static_assert(std::is_same_v<T, float>, "the tensor-core kernels read float32 operands");
    return dkv_kernel<D>;
  }
  template <int D>
  static constexpr size_t forward_bytes() {
    return sizeof(float) * (4 * Geometry<D>::kTileFloats + kSquareFloats);
  }
  template <int D>
  static constexpr size_t dq_bytes() {
    return sizeof(float) * (4 * Geometry<D>::kTileFloats + 2 * kSquareFloats + 2 * kTile);
  }
  template <int D>
  static constexpr size_t dkv_bytes() {
    return dq_bytes<D>();
  }
};

}  // namespace

bool tensor_core_attention_forward(const ops::AttentionDims& s, const AttentionPointers& p,
                                   float* o, float* lse, cudaStream_t stream) {
  return Launches<Kernels>::forward(s, p, o, lse, stream);
}

bool tensor_core_attention_dq(const ops::AttentionDims& s, const AttentionPointers& p, float* dq,
                              cudaStream_t stream) {
  return Launches<Kernels>::dq(s, p, dq, stream);
}

bool tensor_core_attention_dkv(const ops::AttentionDims& s, const AttentionPointers& p, float* dk,
                               float* dv, cudaStream_t stream) {
  return Launches<Kernels>::dkv(s, p, dk, dv, stream);
}

}  // namespace stagecraft::rt::cuda
