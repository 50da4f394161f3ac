// 16-bit attention on the tensor cores (attention_tiled.h: mma_attention_forward, _dq, _dkv),
// FlashAttention-2's way. A block of 4 warps takes 64 rows (queries for the forward and dQ, keys
// for dK and dV), each warp 16 of them, and walks the other side 64 at a time. Each warp keeps
// its rows' operands as mma A fragments in registers and computes its 16 x 64 scores with
// mma.sync m16n8k16 (bfloat16 or float16 operands, float32 accumulators), then applies the
// scale, the mask and the softmax (online in the forward; from lse in the gradient) to the
// accumulators where they lie. A 16 x 64 block of probabilities or dS, rounded to the 16-bit
// type, is an A fragment as it lies (the score fragments of two adjacent 8-column tiles are one
// A fragment of 16 columns), so P V, dS K, P^T dO and dS^T Q run on the same instruction with a
// tile stored transposed in shared memory ([d][row]: its B fragments are 32-bit reads); S = Q K^T
// and dP = dO V^T read row-major tiles. Running max, sums, lse and D stay float32, as in the
// tiled kernels; P and dS are rounded to 16 bits before they multiply (what the 16-bit tensor
// cores take), so results differ from the tiled kernels' by those roundings. dQ and dK/dV are
// separate kernels that each recompute the scores: no atomics, reproducible runs.
//
// Two ways to the B fragments of those four products (kLdmatrix): a copy of the tile stored
// transposed, read a 32-bit word at a time (the first version, checked on an H200 on
// 2026-11-30), or the row-major tile itself read by ldmatrix.trans, which hands each lane the
// two elements of a column it needs: no transposed copy (fewer bytes loaded and stored; the
// transposing stores were 16-bit and 8-way bank-conflicted) and one instruction per four
// fragments. Chosen by $STAGECRAFT_ATTENTION_KERNELS=mma-ldmatrix until a GPU has checked it.
//
// The streamed tiles (K and V for the forward and dQ, Q, dO and their lse and D for dK/dV) come
// in through registers, every warp waiting for each tile's loads before it computes (the first
// two ways), or, with kAsync ($STAGECRAFT_ATTENTION_KERNELS=mma-async; the ldmatrix way, since
// cp.async copies 16 bytes as they lie), by cp.async into one of two buffers: the copy of tile
// i + 1 is issued before the warps compute on tile i, so the loads overlap the products
// (FlashAttention-2's pipelining; one __syncthreads more per tile, the rows' lse and D still
// loaded by plain reads into their buffer). Rows past the end are zero-filled (src-size 0).
//
// The scores' element work (kFast, the default): on a tile where no score is masked
// (ops::attention_tile_unmasked: no mask tensor, every row and key in range, and under causal
// every query of the tile sees every key of it: all tiles of a causal attention below its
// diagonal), each score is its product times scale * log2(e), with no mask rule per element, and
// the softmax runs on exp2f in that base-2 domain (FlashAttention's way): the running max and
// sums are of base-2 exponents, the lse written is converted back to the natural log, and the
// gradients' P = exp2(s log2(e) - lse log2(e)). Tiles with a masked score apply the rules per
// element as before, their scores then scaled by log2(e) too. Without kFast
// ($STAGECRAFT_ATTENTION_KERNELS=mma-expf, to compare), every element takes the rules and expf.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"): lane = 4 g + t; A (16 x 16,
// row-major) register r holds two adjacent columns 2t, 2t + 1 (+ 8 for r = 2, 3) of row g (+ 8
// for r = 1, 3); B (16 x 8) register r holds rows 2t, 2t + 1 (+ 8 for r = 1) of column g; C
// (16 x 8, float32) c0, c1 are row g, columns 2t, 2t + 1 and c2, c3 the same of row g + 8. In a
// 32-bit register the lower-indexed element is the low half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <cstdint>
#include <type_traits>

#include "runtime/cuda/attention_kernels.h"
#include "runtime/cuda/attention_tiled.h"
#include "runtime/cuda/attention_tiles.cuh"

namespace stagecraft::rt::cuda {
namespace {

using namespace attention_tiles;

constexpr int kWarps = 4;
constexpr int kBlockThreads = 32 * kWarps;  // 64 queries a block, 16 a warp
constexpr int kPad = 8;                     // 16-bit elements of padding per shared row
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D>
struct MmaGeometry {
  static constexpr int kRow = D + kPad;       ///< A [64][D] tile's row, in 16-bit elements.
  static constexpr int kTRow = kTile + kPad;  ///< A [D][64] tile's (V transposed) row.
  static constexpr int kTileElements = kTile * kRow;
  static constexpr int kTransposedElements = D * kTRow;
};

// d += a b: one m16n8k16 product on the tensor cores, float32 accumulators.
template <class T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<T, eltwise::BFloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to nearest even into T, `lo` in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<T, eltwise::BFloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// ldmatrix.trans of four 8 x 8 tiles of 16-bit elements: lane 8 i + r gives the shared address
// of tile i's row r (16 bytes, 16-byte aligned); b[i] is then, in lane 4 g + t, tile i's
// elements (2 t, g) and (2 t + 1, g) (row, column), the lower row in the low half: an mma B
// fragment register of the tile's rows as k and its columns as n.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&b)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(address));
}

// The 32-bit word (two 16-bit elements) at `p` in shared memory.
__device__ __forceinline__ uint32_t word(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// body(r, c, v) for every 16 bytes v (eight elements from 8 c) of rows first .. first + 63 of
// the entry's [rows][D] array `src`, r counted from `first`; rows at or past `limit` as zeros.
template <int D, class T, class Body>
__device__ void for_row_vectors(const T* src, int64_t first, int64_t limit, Body body) {
  constexpr int kVectors = D / 8;
  for (int idx = threadIdx.x; idx < kTile * kVectors; idx += kBlockThreads) {
    const int r = idx / kVectors, c = idx % kVectors;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (first + r < limit) v = reinterpret_cast<const uint4*>(src + (first + r) * D)[c];
    body(r, c, v);
  }
}

// Those rows into `tile` ([64][D + pad]) as they are.
template <int D, class T>
__device__ void load_rows(uint16_t* tile, const T* src, int64_t first, int64_t limit) {
  for_row_vectors<D>(src, first, limit, [&](int r, int c, uint4 v) {
    *reinterpret_cast<uint4*>(tile + r * MmaGeometry<D>::kRow + 8 * c) = v;
  });
}

// Those rows stored transposed: row r's element e at tile[e][r] ([D][64 + pad]).
template <int D, class T>
__device__ void load_transposed(uint16_t* tile, const T* src, int64_t first, int64_t limit) {
  for_row_vectors<D>(src, first, limit, [&](int r, int c, uint4 v) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 8; ++e)
      tile[(8 * c + e) * MmaGeometry<D>::kTRow + r] =
          static_cast<uint16_t>(e % 2 == 0 ? words[e / 2] & 0xffffu : words[e / 2] >> 16);
  });
}

// cp.async of the 16 bytes at `src` (global) to `dst` (shared), or 16 zero bytes where !valid
// (src-size 0: nothing is read; `src` must still be a mapped address).
__device__ __forceinline__ void copy_async(void* dst, const void* src, bool valid) {
  const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void commit_async() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits for every group this thread committed but the newest.
__device__ __forceinline__ void wait_async_but_newest() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

// Commits the copies this thread issued since the last call (the next tile's: possibly none)
// and waits until every thread's copies of the current tile, committed one call before, are in
// shared memory.
__device__ __forceinline__ void await_tile() {
  commit_async();
  wait_async_but_newest();
  __syncthreads();
}

// load_rows by cp.async (no wait): rows first .. first + 63 of `src` into `tile`, rows at or
// past `limit` as zeros.
template <int D, class T>
__device__ void copy_rows_async(uint16_t* tile, const T* src, int64_t first, int64_t limit) {
  constexpr int kVectors = D / 8;
  for (int idx = threadIdx.x; idx < kTile * kVectors; idx += kBlockThreads) {
    const int r = idx / kVectors, c = idx % kVectors;
    const bool valid = first + r < limit;
    copy_async(tile + r * MmaGeometry<D>::kRow + 8 * c, valid ? src + (first + r) * D + 8 * c : src,
               valid);
  }
}

// Max and sum over the 4 lanes of a quad (the lanes that hold one row's columns).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The warp's lane split: g (the row of a fragment, and B's column), t (its column pair).
struct Lane {
  int warp, g, t;
};
__device__ __forceinline__ Lane lane_of() {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  return {static_cast<int>(threadIdx.x) / 32, lane / 4, lane % 4};
}

// The warp's 16 rows of a [64][D] tile (rows 16 warp ..) as A fragments, one per 16 of D.
template <int D>
__device__ void a_fragments(const uint16_t* tile, uint32_t (&a)[D / 16][4]) {
  constexpr int R = MmaGeometry<D>::kRow;
  const Lane l = lane_of();
  const uint16_t* rows = tile + 16 * l.warp * R;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    a[kk][0] = word(rows + l.g * R + 16 * kk + 2 * l.t);
    a[kk][1] = word(rows + (l.g + 8) * R + 16 * kk + 2 * l.t);
    a[kk][2] = word(rows + l.g * R + 16 * kk + 8 + 2 * l.t);
    a[kk][3] = word(rows + (l.g + 8) * R + 16 * kk + 8 + 2 * l.t);
  }
}

// x = A B^T for the warp's 16 rows `a` and the 64 rows of `tile` ([64][D], row-major): x[j]
// holds columns 8 j + 2 t, + 1 (tile rows) of rows g (0, 1) and g + 8 (2, 3).
template <int D, class T>
__device__ void products_abt(const uint32_t (&a)[D / 16][4], const uint16_t* tile,
                             float (&x)[8][4]) {
  const Lane l = lane_of();
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
    const uint16_t* row = tile + (8 * j + l.g) * MmaGeometry<D>::kRow;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      mma<T>(x[j], a[kk], word(row + 16 * kk + 2 * l.t), word(row + 16 * kk + 8 + 2 * l.t));
  }
}

// Columns 16 u .. 16 u + 15 of the warp's 16 x 64 block `w` (as products_abt leaves it: the
// score fragments of two adjacent 8-column tiles are one 16-column A fragment), rounded to T.
struct A16 {
  uint32_t r[4];
};
template <class T>
__device__ __forceinline__ A16 a_fragment(const float (&w)[8][4], int u) {
  return {{pack<T>(w[2 * u][0], w[2 * u][1]), pack<T>(w[2 * u][2], w[2 * u][3]),
           pack<T>(w[2 * u + 1][0], w[2 * u + 1][1]), pack<T>(w[2 * u + 1][2], w[2 * u + 1][3])}};
}

// acc += W M for W the warp's 16 x 64 block held as products_abt left it (rounded to T here)
// and M the [64][D] tile stored transposed in `tile_t` ([D][64 + pad]): acc[n] holds columns
// 8 n + 2 t, + 1 of rows g (0, 1) and g + 8 (2, 3).
template <int D, class T>
__device__ void accumulate_product(const float (&w)[8][4], const uint16_t* tile_t,
                                   float (&acc)[D / 8][4]) {
  const Lane l = lane_of();
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const A16 a = a_fragment<T>(w, u);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const uint16_t* column = tile_t + (8 * n + l.g) * MmaGeometry<D>::kTRow + 16 * u;
      mma<T>(acc[n], a.r, word(column + 2 * l.t), word(column + 8 + 2 * l.t));
    }
  }
}

// accumulate_product with M read from its row-major tile `tile` ([64][D + pad]) by
// ldmatrix.trans: for rows 16 u .. 16 u + 15 of M (the product's k) and columns 16 q .. 16 q +
// 15, the lane's address is row 16 u + 8 (i % 2) + r, column 16 q + 8 (i / 2) for its tile i and
// row r, so b[0], b[1] are the B fragment of columns 16 q .. + 7 (k 0-7, 8-15) and b[2], b[3]
// that of columns 16 q + 8 .. + 15.
template <int D, class T>
__device__ void accumulate_product_rows(const float (&w)[8][4], const uint16_t* tile,
                                        float (&acc)[D / 8][4]) {
  constexpr int R = MmaGeometry<D>::kRow;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int i = lane / 8, r = lane % 8;
  const uint32_t base =
      static_cast<uint32_t>(__cvta_generic_to_shared(tile + (8 * (i % 2) + r) * R + 8 * (i / 2)));
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const A16 a = a_fragment<T>(w, u);
#pragma unroll
    for (int q = 0; q < D / 16; ++q) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, base + 2 * (16 * u * R + 16 * q));  // bytes: 2 per element
      mma<T>(acc[2 * q], a.r, b[0], b[1]);
      mma<T>(acc[2 * q + 1], a.r, b[2], b[3]);
    }
  }
}

// acc += W M for M the [64][D] tile `rows` (row-major), or its transposed copy `transposed`
// where the kernel keeps one (kLdmatrix false).
template <bool kLdmatrix, int D, class T>
__device__ __forceinline__ void accumulate(const float (&w)[8][4], const uint16_t* rows,
                                           const uint16_t* transposed, float (&acc)[D / 8][4]) {
  if constexpr (kLdmatrix)
    accumulate_product_rows<D, T>(w, rows, acc);
  else
    accumulate_product<D, T>(w, transposed, acc);
}

// Row `row` (global) of a [rows][D] output from the accumulators of fragment row h (0: g, 1:
// g + 8), scaled by `factor` and rounded to T, two elements per 32-bit write.
template <int D, class T>
__device__ void write_row(T* out, int64_t row, const float (&acc)[D / 8][4], int h, float factor) {
  const Lane l = lane_of();
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const uint32_t low = narrow<T>(acc[n][2 * h] * factor).bits,
                   high = narrow<T>(acc[n][2 * h + 1] * factor).bits;
    *reinterpret_cast<uint32_t*>(out + row * D + 8 * n + 2 * l.t) = low | high << 16;
  }
}

// kAsync (with kLdmatrix): shared K and V twice, [K0][V0][K1][V1] after Q.
template <int D, class T, bool kLdmatrix, bool kFast, bool kAsync>
__global__ void __launch_bounds__(kBlockThreads)
    forward_kernel(ops::AttentionDims s, TilePointers<T> p, T* o, float* lse) {
  static_assert(!kAsync || kLdmatrix, "cp.async copies row-major tiles only");
  using G = MmaGeometry<D>;
  extern __shared__ uint4 shared_words[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(shared_words);
  const auto [b, q0] = block_tile(s.tq);
  const int64_t plane = ops::attention_mask_plane(s, b);
  const Lane l = lane_of();
  const T* k_rows = p.k + b * s.tk * D;
  const T* v_rows = p.v + b * s.tk * D;
  const int64_t last = (q0 + kTile < s.tq ? q0 + kTile : s.tq) - 1;
  const int64_t keys = ops::attention_keys_seen(s, last);
  if constexpr (kAsync) {  // the first tiles of K and V on their way while Q loads
    if (keys > 0) {
      copy_rows_async<D>(qs + G::kTileElements, k_rows, 0, s.tk);
      copy_rows_async<D>(qs + 2 * G::kTileElements, v_rows, 0, s.tk);
    }
    commit_async();
  }
  load_rows<D>(qs, p.q + b * s.tq * D, q0, s.tq);
  __syncthreads();
  uint32_t qa[D / 16][4];
  a_fragments<D>(qs, qa);
  float acc[D / 8][4] = {};
  float top[2] = {-CUDART_INF_F, -CUDART_INF_F}, sum[2] = {0.0f, 0.0f};
  const int64_t rows[2] = {q0 + 16 * l.warp + l.g, q0 + 16 * l.warp + l.g + 8};
  const float scale_log2 = s.scale * kLog2e;
  for (int64_t k0 = 0, tile = 0; k0 < keys; k0 += kTile, ++tile) {
    // This tile's K and V (V row-major with kLdmatrix, else transposed).
    uint16_t* ks = qs + G::kTileElements * (1 + (kAsync ? 2 * (tile % 2) : 0));
    uint16_t* vt = ks + G::kTileElements;
    if constexpr (kAsync) {
      if (k0 + kTile < keys) {  // the next tiles into the other buffer
        uint16_t* next = qs + G::kTileElements * (1 + 2 * ((tile + 1) % 2));
        copy_rows_async<D>(next, k_rows, k0 + kTile, s.tk);
        copy_rows_async<D>(next + G::kTileElements, v_rows, k0 + kTile, s.tk);
      }
      await_tile();
    } else {
      __syncthreads();  // every warp is done with the last tiles of K and V
      load_rows<D>(ks, k_rows, k0, s.tk);
      if constexpr (kLdmatrix)
        load_rows<D>(vt, v_rows, k0, s.tk);
      else
        load_transposed<D>(vt, v_rows, k0, s.tk);
      __syncthreads();
    }
    float x[8][4];
    products_abt<D, T>(qa, ks, x);
    // kFast: scores in base 2 (times log2(e)); the per-element rules only on a tile that
    // masks some score (one answer for the whole block).
    const bool unmasked = kFast && ops::attention_tile_unmasked(s, q0, kTile, k0, kTile);
    float rescale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = x[j][2 * h + e];
          v = unmasked ? v * scale_log2
                       : masked_score(s, p.mask, plane, rows[h], k0 + 8 * j + 2 * l.t + e, v) *
                             (kFast ? kLog2e : 1.0f);  // times 1: exact
          m = fmaxf(m, v);
        }
      const float next = fmaxf(top[h], quad_max(m));
      // A row with no key seen so far keeps O = 0 and sum = 0 (the other kernels' rule).
      const bool none = next == -CUDART_INF_F;
      rescale[h] = none ? 1.0f : kFast ? exp2f(top[h] - next) : expf(top[h] - next);
      float row_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = x[j][2 * h + e];
          v = none ? 0.0f : kFast ? exp2f(v - next) : expf(v - next);
          row_sum += v;
        }
      sum[h] = sum[h] * rescale[h] + quad_sum(row_sum);
      top[h] = next;
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      acc[n][0] *= rescale[0];
      acc[n][1] *= rescale[0];
      acc[n][2] *= rescale[1];
      acc[n][3] *= rescale[1];
    }
    accumulate<kLdmatrix, D, T>(x, vt, vt, acc);  // O += P V
    // kAsync: every warp is done with this buffer before the next tile's copies refill it.
    if constexpr (kAsync) __syncthreads();
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (rows[h] >= s.tq) continue;
    const int64_t row = b * s.tq + rows[h];
    write_row<D>(o, row, acc, h, sum[h] > 0.0f ? 1.0f / sum[h] : 0.0f);
    // kFast: top is a base-2 exponent; lse is the natural log: top ln 2 + ln(sum).
    if (lse != nullptr && l.t == 0)
      lse[row] = sum[h] > 0.0f ? (kFast ? top[h] * kLn2 : top[h]) + logf(sum[h]) : -CUDART_INF_F;
  }
}

// dQ of 64 queries: per key tile S = Q K^T and dP = dO V^T, dS = scale P (dP - D) with P from
// lse, dQ += dS K. Shared: K row-major and transposed, V row-major, each query's lse and D.
// kAsync (with kLdmatrix): shared [K0][V0][K1][V1], then lse and D.
template <int D, class T, bool kLdmatrix, bool kFast, bool kAsync>
__global__ void __launch_bounds__(kBlockThreads)
    dq_kernel(ops::AttentionDims s, TilePointers<T> p, T* dq) {
  static_assert(!kAsync || kLdmatrix, "cp.async copies row-major tiles only");
  using G = MmaGeometry<D>;
  extern __shared__ uint4 shared_words[];
  uint16_t* tiles_s = reinterpret_cast<uint16_t*>(shared_words);
  uint16_t* kt = tiles_s + G::kTileElements * (kAsync ? 4 : 2);  // K transposed (!kLdmatrix)
  float* lse_s = reinterpret_cast<float*>(kt + (kLdmatrix ? 0 : G::kTransposedElements));
  float* delta_s = lse_s + kTile;
  const auto [b, q0] = block_tile(s.tq);
  const int64_t plane = ops::attention_mask_plane(s, b);
  const Lane l = lane_of();
  const T* k_rows = p.k + b * s.tk * D;
  const T* v_rows = p.v + b * s.tk * D;
  const int64_t last = (q0 + kTile < s.tq ? q0 + kTile : s.tq) - 1;
  const int64_t keys = ops::attention_keys_seen(s, last);
  if constexpr (kAsync) {  // the first tiles of K and V on their way into buffer 0
    if (keys > 0) {
      copy_rows_async<D>(tiles_s, k_rows, 0, s.tk);
      copy_rows_async<D>(tiles_s + G::kTileElements, v_rows, 0, s.tk);
    }
    commit_async();
  }
  // Q and dO staged through a buffer of the K and V tiles (kAsync: the second), then held as A
  // fragments.
  uint16_t* stage = tiles_s + (kAsync ? 2 * G::kTileElements : 0);
  load_rows<D>(stage, p.q + b * s.tq * D, q0, s.tq);
  load_rows<D>(stage + G::kTileElements, p.d_o + b * s.tq * D, q0, s.tq);
  attention_tiles::load_rows(lse_s, delta_s, p.lse + b * s.tq, p.delta + b * s.tq, q0, s.tq);
  __syncthreads();
  uint32_t qa[D / 16][4], doa[D / 16][4];
  a_fragments<D>(stage, qa);
  a_fragments<D>(stage + G::kTileElements, doa);
  if constexpr (kAsync) __syncthreads();  // every warp has its fragments: the buffer is free
  const int local[2] = {16 * l.warp + l.g, 16 * l.warp + l.g + 8};
  const float row_lse[2] = {lse_s[local[0]], lse_s[local[1]]};
  const float row_delta[2] = {delta_s[local[0]], delta_s[local[1]]};
  // kFast on an unmasked tile: P = exp2(s log2(e) - lse log2(e)) (every row there sees a key,
  // so its lse is finite).
  const float scale_log2 = s.scale * kLog2e;
  const float row_lse2[2] = {row_lse[0] * kLog2e, row_lse[1] * kLog2e};
  float acc[D / 8][4] = {};
  for (int64_t k0 = 0, tile = 0; k0 < keys; k0 += kTile, ++tile) {
    uint16_t* ks = tiles_s + (kAsync ? 2 * G::kTileElements * (tile % 2) : 0);
    uint16_t* vs = ks + G::kTileElements;
    if constexpr (kAsync) {
      if (k0 + kTile < keys) {  // the next tiles into the other buffer
        uint16_t* next = tiles_s + 2 * G::kTileElements * ((tile + 1) % 2);
        copy_rows_async<D>(next, k_rows, k0 + kTile, s.tk);
        copy_rows_async<D>(next + G::kTileElements, v_rows, k0 + kTile, s.tk);
      }
      await_tile();
    } else {
      __syncthreads();  // every warp has its fragments, and is done with the last tiles
      load_rows<D>(ks, k_rows, k0, s.tk);
      if constexpr (!kLdmatrix) load_transposed<D>(kt, k_rows, k0, s.tk);
      load_rows<D>(vs, v_rows, k0, s.tk);
      __syncthreads();
    }
    float x[8][4], dp[8][4];
    products_abt<D, T>(qa, ks, x);
    products_abt<D, T>(doa, vs, dp);
    const bool unmasked = kFast && ops::attention_tile_unmasked(s, q0, kTile, k0, kTile);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int h = c / 2;
        const float prob = unmasked
                               ? exp2f(fmaf(x[j][c], scale_log2, -row_lse2[h]))
                               : probability(s, p.mask, plane, q0 + local[h],
                                             k0 + 8 * j + 2 * l.t + c % 2, x[j][c], row_lse[h]);
        x[j][c] = s.scale * prob * (dp[j][c] - row_delta[h]);
      }
    accumulate<kLdmatrix, D, T>(x, ks, kt, acc);  // dQ += dS K
    if constexpr (kAsync) __syncthreads();        // this buffer is free for the tile after next
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (q0 + local[h] < s.tq) write_row<D>(dq, b * s.tq + q0 + local[h], acc, h, 1.0f);
}

// dK and dV of 64 keys: per query tile S^T = K Q^T and dP^T = V dO^T, P^T from each query's
// lse, dS^T = scale P^T (dP^T - D), dV += P^T dO and dK += dS^T Q. Shared: Q and dO row-major
// and transposed, each query's lse and D.
// kAsync (with kLdmatrix): shared [Q0][dO0][Q1][dO1], then lse and D twice ([lse0][D0][lse1][D1]).
template <int D, class T, bool kLdmatrix, bool kFast, bool kAsync>
__global__ void __launch_bounds__(kBlockThreads)
    dkv_kernel(ops::AttentionDims s, TilePointers<T> p, T* dk, T* dv) {
  static_assert(!kAsync || kLdmatrix, "cp.async copies row-major tiles only");
  using G = MmaGeometry<D>;
  extern __shared__ uint4 shared_words[];
  uint16_t* tiles_s = reinterpret_cast<uint16_t*>(shared_words);
  // Q and dO transposed (not kept with kLdmatrix).
  uint16_t* qt = tiles_s + G::kTileElements * (kAsync ? 4 : 2);
  uint16_t* dot = qt + (kLdmatrix ? 0 : G::kTransposedElements);
  float* rows_s = reinterpret_cast<float*>(dot + (kLdmatrix ? 0 : G::kTransposedElements));
  const auto [b, k0] = block_tile(s.tk);
  const int64_t plane = ops::attention_mask_plane(s, b);
  const Lane l = lane_of();
  const T* q_rows = p.q + b * s.tq * D;
  const T* do_rows = p.d_o + b * s.tq * D;
  // The first query tile with a query that sees key k0 (causal: from query k0 on).
  const int64_t first = (ops::attention_first_query(s, k0) / kTile) * kTile;
  if constexpr (kAsync) {  // the first tiles of Q and dO (and their rows' lse, D) into buffer 0
    if (first < s.tq) {
      copy_rows_async<D>(tiles_s, q_rows, first, s.tq);
      copy_rows_async<D>(tiles_s + G::kTileElements, do_rows, first, s.tq);
      attention_tiles::load_rows(rows_s, rows_s + kTile, p.lse + b * s.tq, p.delta + b * s.tq,
                                 first, s.tq);
    }
    commit_async();
  }
  // K and V staged through a buffer of the Q and dO tiles (kAsync: the second), then held as A
  // fragments.
  uint16_t* stage = tiles_s + (kAsync ? 2 * G::kTileElements : 0);
  load_rows<D>(stage, p.k + b * s.tk * D, k0, s.tk);
  load_rows<D>(stage + G::kTileElements, p.v + b * s.tk * D, k0, s.tk);
  __syncthreads();
  uint32_t ka[D / 16][4], va[D / 16][4];
  a_fragments<D>(stage, ka);
  a_fragments<D>(stage + G::kTileElements, va);
  if constexpr (kAsync) __syncthreads();  // every warp has its fragments: the buffer is free
  const int64_t key[2] = {k0 + 16 * l.warp + l.g, k0 + 16 * l.warp + l.g + 8};
  float acc_k[D / 8][4] = {}, acc_v[D / 8][4] = {};
  const float scale_log2 = s.scale * kLog2e;
  for (int64_t q0 = first, tile = 0; q0 < s.tq; q0 += kTile, ++tile) {
    const int buffer = kAsync ? static_cast<int>(tile % 2) : 0;
    uint16_t* qs = tiles_s + 2 * G::kTileElements * buffer;
    uint16_t* dos = qs + G::kTileElements;
    float* lse_s = rows_s + 2 * kTile * buffer;
    float* delta_s = lse_s + kTile;
    if constexpr (kAsync) {
      if (q0 + kTile < s.tq) {  // the next tiles into the other buffer
        uint16_t* next = tiles_s + 2 * G::kTileElements * (1 - buffer);
        copy_rows_async<D>(next, q_rows, q0 + kTile, s.tq);
        copy_rows_async<D>(next + G::kTileElements, do_rows, q0 + kTile, s.tq);
        float* next_rows = rows_s + 2 * kTile * (1 - buffer);
        attention_tiles::load_rows(next_rows, next_rows + kTile, p.lse + b * s.tq,
                                   p.delta + b * s.tq, q0 + kTile, s.tq);
      }
      await_tile();
    } else {
      __syncthreads();  // every warp has its fragments, and is done with the last tiles
      load_rows<D>(qs, q_rows, q0, s.tq);
      load_rows<D>(dos, do_rows, q0, s.tq);
      if constexpr (!kLdmatrix) {
        load_transposed<D>(qt, q_rows, q0, s.tq);
        load_transposed<D>(dot, do_rows, q0, s.tq);
      }
      attention_tiles::load_rows(lse_s, delta_s, p.lse + b * s.tq, p.delta + b * s.tq, q0, s.tq);
      __syncthreads();
    }
    float x[8][4], dp[8][4];
    products_abt<D, T>(ka, qs, x);
    products_abt<D, T>(va, dos, dp);
    // kFast on an unmasked tile (as dq_kernel): P = exp2(s log2(e) - lse log2(e)).
    const bool unmasked = kFast && ops::attention_tile_unmasked(s, q0, kTile, k0, kTile);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int query = 8 * j + 2 * l.t + c % 2;  // in the tile
        const float prob =
            unmasked ? exp2f(fmaf(x[j][c], scale_log2, -lse_s[query] * kLog2e))
                     : probability(s, p.mask, plane, q0 + query, key[c / 2], x[j][c], lse_s[query]);
        x[j][c] = prob;
        dp[j][c] = s.scale * prob * (dp[j][c] - delta_s[query]);
      }
    accumulate<kLdmatrix, D, T>(x, dos, dot, acc_v);  // dV += P^T dO
    accumulate<kLdmatrix, D, T>(dp, qs, qt, acc_k);   // dK += dS^T Q
    if constexpr (kAsync) __syncthreads();            // this buffer is free for the tile after next
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key[h] >= s.tk) continue;
    if (dk != nullptr) write_row<D>(dk, b * s.tk + key[h], acc_k, h, 1.0f);
    if (dv != nullptr) write_row<D>(dv, b * s.tk + key[h], acc_v, h, 1.0f);
  }
}

// Shared bytes of each kernel: its 16-bit tiles, and for the gradients each row's lse and D.
// kAsync: the streamed tiles (and dK/dV's lse and D) twice.
template <int D, bool kLdmatrix, bool kAsync>
constexpr size_t forward_bytes() {
  return 2 * ((kAsync ? 3 : 2) * MmaGeometry<D>::kTileElements +
              (kLdmatrix ? MmaGeometry<D>::kTileElements : MmaGeometry<D>::kTransposedElements) *
                  (kAsync ? 2 : 1));
}
template <int D, bool kLdmatrix, bool kAsync>
constexpr size_t dq_bytes() {
  return 2 * ((kAsync ? 4 : 2) * MmaGeometry<D>::kTileElements +
              (kLdmatrix ? 0 : MmaGeometry<D>::kTransposedElements)) +
         2 * kTile * sizeof(float);
}
template <int D, bool kLdmatrix, bool kAsync>
constexpr size_t dkv_bytes() {
  return 2 * ((kAsync ? 4 : 2) * MmaGeometry<D>::kTileElements +
              (kLdmatrix ? 0 : 2 * MmaGeometry<D>::kTransposedElements)) +
         (kAsync ? 4 : 2) * kTile * sizeof(float);
}

template <class T>
TilePointers<T> tile_pointers(const HalfAttentionPointers& p) {
  return {reinterpret_cast<const T*>(p.q),
          reinterpret_cast<const T*>(p.k),
          reinterpret_cast<const T*>(p.v),
          p.mask,
          p.lse,
          reinterpret_cast<const T*>(p.d_o),
          p.delta};
}

// Launches `kernel` on `blocks` blocks of kBlockThreads with `bytes` of shared memory; false
// (nothing launched) where the device refuses that much, the caller then running the tiled
// kernels.
template <class Kernel, class... Args>
bool launch_mma(Kernel kernel, int64_t blocks, size_t bytes, cudaStream_t stream, Args... args) {
  if (blocks <= 0 || blocks > (int64_t{1} << 31) - 1) return false;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  kernel<<<static_cast<unsigned>(blocks), kBlockThreads, bytes, stream>>>(args...);
  return true;
}

// body(kLdmatrix, kFast, kAsync) as std::bool_constants for `tiles`, kFast unless
// $STAGECRAFT_ATTENTION_KERNELS=mma-expf (which asks for kTransposed: mma-async is kFast only).
template <class Body>
bool with_variant(MmaTiles tiling, Body body) {
  using T = std::true_type;
  using F = std::false_type;
  if (tiling == MmaTiles::kAsync) return body(T{}, T{}, T{});
  const bool fast = !every_element_attention_chosen();
  if (tiling == MmaTiles::kLdmatrix) return fast ? body(T{}, T{}, F{}) : body(T{}, F{}, F{});
  return fast ? body(F{}, T{}, F{}) : body(F{}, F{}, F{});
}

}  // namespace

// Each: 16-byte reads of the 16-bit operands, 4-byte writes of the outputs.
bool mma_attention_forward(const ops::AttentionDims& s, const HalfAttentionPointers& p, uint16_t* o,
                           float* lse, MmaTiles tiling, cudaStream_t stream) {
  if (!vector_aligned({p.q, p.k, p.v, o}, 16)) return false;
  return with_16bit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    return with_head_size(s, [&](auto h) {
      constexpr int D = decltype(h)::value;
      const int64_t blocks = s.batch * tiles(s.tq);
      return with_variant(tiling, [&](auto ld, auto fast, auto async) {
        return launch_mma(forward_kernel<D, T, ld.value, fast.value, async.value>, blocks,
                          forward_bytes<D, ld.value, async.value>(), stream, s, tile_pointers<T>(p),
                          reinterpret_cast<T*>(o), lse);
      });
    });
  });
}

bool mma_attention_dq(const ops::AttentionDims& s, const HalfAttentionPointers& p, uint16_t* dq,
                      MmaTiles tiling, cudaStream_t stream) {
  if (!vector_aligned({p.q, p.k, p.v, p.d_o, dq}, 16)) return false;
  return with_16bit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    return with_head_size(s, [&](auto h) {
      constexpr int D = decltype(h)::value;
      const int64_t blocks = s.batch * tiles(s.tq);
      return with_variant(tiling, [&](auto ld, auto fast, auto async) {
        return launch_mma(dq_kernel<D, T, ld.value, fast.value, async.value>, blocks,
                          dq_bytes<D, ld.value, async.value>(), stream, s, tile_pointers<T>(p),
                          reinterpret_cast<T*>(dq));
      });
    });
  });
}

bool mma_attention_dkv(const ops::AttentionDims& s, const HalfAttentionPointers& p, uint16_t* dk,
                       uint16_t* dv, MmaTiles tiling, cudaStream_t stream) {
  if (!vector_aligned({p.q, p.k, p.v, p.d_o, dk, dv}, 16)) return false;
  return with_16bit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    return with_head_size(s, [&](auto h) {
      constexpr int D = decltype(h)::value;
      const int64_t blocks = s.batch * tiles(s.tk);
      T* k = reinterpret_cast<T*>(dk);
      T* v = reinterpret_cast<T*>(dv);
      return with_variant(tiling, [&](auto ld, auto fast, auto async) {
        return launch_mma(dkv_kernel<D, T, ld.value, fast.value, async.value>, blocks,
                          dkv_bytes<D, ld.value, async.value>(), stream, s, tile_pointers<T>(p), k,
                          v);
      });
    });
  });
}

}  // namespace stagecraft::rt::cuda
