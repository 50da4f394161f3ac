// The forward of 16-bit attention on the tensor cores (attention_tiled.h: mma_attention_forward),
// FlashAttention-2's way: a block of 4 warps takes 64 queries, each warp 16 of them, and walks
// the keys 64 at a time. Each warp keeps its queries as mma A fragments in registers, computes
// its 16 x 64 scores with mma.sync m16n8k16 (bfloat16 or float16 operands, float32
// accumulators), applies the scale, the mask and the online softmax to the accumulators where
// they lie, rounds the probabilities to the 16-bit type in the A-fragment layout (the score
// fragments of two adjacent 8-key tiles are one A fragment of 16 keys) and accumulates P V with
// the same instruction. K is staged in shared memory row-major ([key][d]: B fragments of K^T are
// 32-bit reads), V transposed ([d][key]: B fragments of V likewise). The softmax's running max
// and sum stay float32, as in the tiled kernels; P is rounded to 16 bits before P V (what the
// 16-bit tensor cores take), so O differs from the tiled kernels' by that rounding.
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

#include "runtime/cuda/attention_tiled.h"
#include "runtime/cuda/attention_tiles.cuh"

namespace stagecraft::rt::cuda {
namespace {

using namespace attention_tiles;

constexpr int kWarps = 4;
constexpr int kBlockThreads = 32 * kWarps;  // 64 queries a block, 16 a warp
constexpr int kPad = 8;                     // 16-bit elements of padding per shared row

template <int D>
struct MmaGeometry {
  static constexpr int kRow = D + kPad;       ///< A [64][D] tile's row, in 16-bit elements.
  static constexpr int kTRow = kTile + kPad;  ///< A [D][64] tile's (V transposed) row.
  static constexpr int kTileElements = kTile * kRow;
  static constexpr int kTransposedElements = D * kTRow;
  static constexpr size_t kBytes = 2 * (2 * kTileElements + kTransposedElements);
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

// Max and sum over the 4 lanes of a quad (the lanes that hold one row's columns).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int D, class T>
__global__ void __launch_bounds__(kBlockThreads)
    forward_kernel(ops::AttentionDims s, TilePointers<T> p, T* o, float* lse) {
  using G = MmaGeometry<D>;
  extern __shared__ uint4 shared_words[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(shared_words);
  uint16_t* ks = qs + G::kTileElements;
  uint16_t* vt = ks + G::kTileElements;
  const auto [b, q0] = block_tile(s.tq);
  const int64_t plane = ops::attention_mask_plane(s, b);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  load_rows<D>(qs, p.q + b * s.tq * D, q0, s.tq);
  __syncthreads();
  // This warp's 16 queries as A fragments, one per 16 of the head.
  uint32_t qa[D / 16][4];
  const uint16_t* mine = qs + 16 * warp * G::kRow;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qa[kk][0] = word(mine + g * G::kRow + 16 * kk + 2 * t);
    qa[kk][1] = word(mine + (g + 8) * G::kRow + 16 * kk + 2 * t);
    qa[kk][2] = word(mine + g * G::kRow + 16 * kk + 8 + 2 * t);
    qa[kk][3] = word(mine + (g + 8) * G::kRow + 16 * kk + 8 + 2 * t);
  }
  // acc[n]: O's columns 8 n + 2 t, + 1 of rows g (0, 1) and g + 8 (2, 3).
  float acc[D / 8][4] = {};
  float top[2] = {-CUDART_INF_F, -CUDART_INF_F}, sum[2] = {0.0f, 0.0f};
  const int64_t rows[2] = {q0 + 16 * warp + g, q0 + 16 * warp + g + 8};
  const int64_t last = (q0 + kTile < s.tq ? q0 + kTile : s.tq) - 1;
  const int64_t keys = ops::attention_keys_seen(s, last);
  for (int64_t k0 = 0; k0 < keys; k0 += kTile) {
    __syncthreads();  // every warp is done with the last tiles of K and V
    load_rows<D>(ks, p.k + b * s.tk * D, k0, s.tk);
    load_transposed<D>(vt, p.v + b * s.tk * D, k0, s.tk);
    __syncthreads();
    // x[j]: the scores of keys k0 + 8 j + 2 t, + 1 for rows g (0, 1) and g + 8 (2, 3).
    float x[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
      const uint16_t* key = ks + (8 * j + g) * G::kRow;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        mma<T>(x[j], qa[kk], word(key + 16 * kk + 2 * t), word(key + 16 * kk + 8 + 2 * t));
    }
    float rescale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = x[j][2 * h + e];
          v = masked_score(s, p.mask, plane, rows[h], k0 + 8 * j + 2 * t + e, v);
          m = fmaxf(m, v);
        }
      const float next = fmaxf(top[h], quad_max(m));
      // A row with no key seen so far keeps O = 0 and sum = 0 (the other kernels' rule).
      const bool none = next == -CUDART_INF_F;
      rescale[h] = none ? 1.0f : expf(top[h] - next);
      float row_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = x[j][2 * h + e];
          v = none ? 0.0f : expf(v - next);
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
    // O += P V over four steps of 16 keys: P's A fragment of keys 16 u .. 16 u + 15 is the
    // score fragments of key tiles 2 u and 2 u + 1.
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint32_t pa[4] = {pack<T>(x[2 * u][0], x[2 * u][1]), pack<T>(x[2 * u][2], x[2 * u][3]),
                              pack<T>(x[2 * u + 1][0], x[2 * u + 1][1]),
                              pack<T>(x[2 * u + 1][2], x[2 * u + 1][3])};
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const uint16_t* column = vt + (8 * n + g) * G::kTRow + 16 * u;
        mma<T>(acc[n], pa, word(column + 2 * t), word(column + 8 + 2 * t));
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (rows[h] >= s.tq) continue;
    const int64_t row = b * s.tq + rows[h];
    const float inv = sum[h] > 0.0f ? 1.0f / sum[h] : 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const uint32_t low = narrow<T>(acc[n][2 * h] * inv).bits,
                     high = narrow<T>(acc[n][2 * h + 1] * inv).bits;
      *reinterpret_cast<uint32_t*>(o + row * D + 8 * n + 2 * t) = low | high << 16;
    }
    if (lse != nullptr && t == 0) lse[row] = sum[h] > 0.0f ? top[h] + logf(sum[h]) : -CUDART_INF_F;
  }
}

}  // namespace

bool mma_attention_forward(const ops::AttentionDims& s, const HalfAttentionPointers& p, uint16_t* o,
                           float* lse, cudaStream_t stream) {
  // 16-byte reads of Q, K and V; 4-byte writes of O.
  if (!vector_aligned({p.q, p.k, p.v, o}, 16)) return false;
  const int64_t blocks = s.batch * tiles(s.tq);
  if (blocks <= 0 || blocks > (int64_t{1} << 31) - 1) return false;
  return with_16bit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const TilePointers<T> tp{reinterpret_cast<const T*>(p.q),
                             reinterpret_cast<const T*>(p.k),
                             reinterpret_cast<const T*>(p.v),
                             p.mask,
                             p.lse,
                             nullptr,
                             nullptr};
    return with_head_size(s, [&](auto h) {
      constexpr int D = decltype(h)::value;
      const auto kernel = forward_kernel<D, T>;
      constexpr size_t bytes = MmaGeometry<D>::kBytes;
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes)) != cudaSuccess) {
        (void)cudaGetLastError();  // cleared: the caller runs the tiled kernels instead
        return false;
      }
      kernel<<<static_cast<unsigned>(blocks), kBlockThreads, bytes, stream>>>(
          s, tp, reinterpret_cast<T*>(o), lse);
      return true;
    });
  });
}

}  // namespace stagecraft::rt::cuda
