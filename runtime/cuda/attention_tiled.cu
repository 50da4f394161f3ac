// The tiled attention kernels (attention_tiled.h): blocks of 64 queries (the forward, dQ) or 64
// keys (dK and dV) that stage 64-row tiles of Q, K, V and dO in shared memory and compute each
// 64 x 64 tile of scores as a product of two tiles, 16 x 16 threads each holding a 4 x 4 block
// of it in registers. Float32 throughout, and no atomics: every sum runs in a fixed order, so a
// run is reproducible, as the plain kernels' (attention_kernels.cu).
//
// Shared-memory layout: a [64][D] tile is stored with rows of D + 4 floats, so that each row
// starts 16-byte aligned (float4 reads) and the 8 threads of a quarter-warp that read 8
// different rows at one column land in 8 different groups of 4 banks; a [64][64] tile of
// probabilities or dS likewise with rows of 68.
//
// Thread (ty, tx) = (threadIdx.x / 16, threadIdx.x % 16). In a score tile it holds rows
// 4 ty .. 4 ty + 3 and columns tx, tx + 16, tx + 32, tx + 48 (strided, so that the 16 threads
// of a row read 16 different rows of the other tile); in an output tile ([64][D]: O, dQ, dK,
// dV) it holds the same rows and the D / 16 consecutive columns from tx * D / 16 (vector reads
// of V, K, Q or dO, and vector writes).
#include <math_constants.h>

#include <cstdint>
#include <type_traits>

#include "runtime/cuda/attention_tiled.h"
#include "runtime/cuda/attention_tiles.cuh"

namespace stagecraft::rt::cuda {
namespace {

using namespace attention_tiles;

__device__ int thread_row() { return static_cast<int>(threadIdx.x) / 16; }
__device__ int thread_col() { return static_cast<int>(threadIdx.x) % 16; }

// acc[r][c] = sum over k of a[4 ty + r][k] * b[tx + 16 c][k]: one thread's share of A B^T for
// two [64][D] tiles.
template <int D>
__device__ void product_abt(const float* a, const float* b, float (&acc)[4][4]) {
  constexpr int S = Geometry<D>::kStride;
  const int ty = thread_row(), tx = thread_col();
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
#pragma unroll 4
  for (int k = 0; k < D; k += 4) {
    float4 av[4], bv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) av[r] = *reinterpret_cast<const float4*>(a + (4 * ty + r) * S + k);
#pragma unroll
    for (int c = 0; c < 4; ++c) bv[c] = *reinterpret_cast<const float4*>(b + (tx + 16 * c) * S + k);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        acc[r][c] = fmaf(av[r].x, bv[c].x, acc[r][c]);
        acc[r][c] = fmaf(av[r].y, bv[c].y, acc[r][c]);
        acc[r][c] = fmaf(av[r].z, bv[c].z, acc[r][c]);
        acc[r][c] = fmaf(av[r].w, bv[c].w, acc[r][c]);
      }
  }
}

// N consecutive floats of shared memory at `src` (16-byte aligned where N % 4 == 0, 8 where
// N % 2 == 0).
template <int N>
__device__ void read_vector(const float* src, float (&dst)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int e = 0; e < N; e += 4) {
      const float4 v = *reinterpret_cast<const float4*>(src + e);
      dst[e] = v.x;
      dst[e + 1] = v.y;
      dst[e + 2] = v.z;
      dst[e + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < N; e += 2) {
      const float2 v = *reinterpret_cast<const float2*>(src + e);
      dst[e] = v.x;
      dst[e + 1] = v.y;
    }
  }
}

// out[r][e] += sum over k < 64 of w[k][4 ty + r] * m[k][cols + e] (`transposed`: w is read as
// [row][k], w[(4 ty + r)][k]), cols = tx * D / 16: one thread's share of W^T M or W M for a
// [64][64] weight tile w (stride 68) and a [64][D] tile m.
template <int D, bool kTransposed>
__device__ void accumulate_product(const float* w, const float* m,
                                   float (&out)[4][Geometry<D>::kCols]) {
  constexpr int S = Geometry<D>::kStride, N = Geometry<D>::kCols;
  const int ty = thread_row(), col = thread_col() * N;
#pragma unroll 2
  for (int k = 0; k < kTile; k += 4) {
    float wk[4][4];  // wk[j][r]: the weight of row 4 ty + r at k + j
    if constexpr (kTransposed) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(w + (k + j) * kSquareStride + 4 * ty);
        wk[j][0] = v.x;
        wk[j][1] = v.y;
        wk[j][2] = v.z;
        wk[j][3] = v.w;
      }
    } else {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float4 v = *reinterpret_cast<const float4*>(w + (4 * ty + r) * kSquareStride + k);
        wk[0][r] = v.x;
        wk[1][r] = v.y;
        wk[2][r] = v.z;
        wk[3][r] = v.w;
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float mv[N];
      read_vector<N>(m + (k + j) * S + col, mv);
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int e = 0; e < N; ++e) out[r][e] = fmaf(wk[j][r], mv[e], out[r][e]);
    }
  }
}

// Row `row` of a [rows][D] output from one thread's N values (scaled by `factor`): float32
// as vectors, or rounded to a 16-bit type two elements (one 32-bit word) at a time.
template <int N, class T>
__device__ void write_row(T* dst, const float (&v)[N], float factor) {
  if constexpr (!std::is_same_v<T, float>) {
#pragma unroll
    for (int e = 0; e < N; e += 2) {
      const uint32_t low = narrow<T>(v[e] * factor).bits, high = narrow<T>(v[e + 1] * factor).bits;
      *reinterpret_cast<uint32_t*>(dst + e) = low | high << 16;
    }
  } else if constexpr (N % 4 == 0) {
#pragma unroll
    for (int e = 0; e < N; e += 4)
      *reinterpret_cast<float4*>(dst + e) =
          make_float4(v[e] * factor, v[e + 1] * factor, v[e + 2] * factor, v[e + 3] * factor);
  } else {
#pragma unroll
    for (int e = 0; e < N; e += 2)
      *reinterpret_cast<float2*>(dst + e) = make_float2(v[e] * factor, v[e + 1] * factor);
  }
}

// Max and sum over the 16 threads of a row group (lanes that differ in their low 4 bits).
__device__ float group_max(float x) {
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ float group_sum(float x) {
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <int D, class T>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(ops::AttentionDims s, TilePointers<T> p, T* o, float* lse) {
  using G = Geometry<D>;
  extern __shared__ float4 shared_vectors[];
  float* qs = reinterpret_cast<float*>(shared_vectors);
  float* ks = qs + G::kTileFloats;
  float* vs = ks + G::kTileFloats;
  float* ps = vs + G::kTileFloats;
  const auto [b, q0] = block_tile(s.tq);
  const int64_t plane = ops::attention_mask_plane(s, b);
  const int ty = thread_row(), tx = thread_col();
  load_tile<D>(qs, p.q + b * s.tq * D, q0, s.tq);
  float out[4][G::kCols] = {};
  float top[4], sum[4];
#pragma unroll
  for (int r = 0; r < 4; ++r) top[r] = -CUDART_INF_F, sum[r] = 0.0f;
  const int64_t last = (q0 + kTile < s.tq ? q0 + kTile : s.tq) - 1;
  const int64_t keys = ops::attention_keys_seen(s, last);
  for (int64_t k0 = 0; k0 < keys; k0 += kTile) {
    __syncthreads();  // every thread is done with the last tiles of K, V and P
    load_tile<D>(ks, p.k + b * s.tk * D, k0, s.tk);
    load_tile<D>(vs, p.v + b * s.tk * D, k0, s.tk);
    __syncthreads();
    float x[4][4];
    product_abt<D>(qs, ks, x);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t i = q0 + 4 * ty + r;
      float m = -CUDART_INF_F;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        x[r][c] = masked_score(s, p.mask, plane, i, k0 + tx + 16 * c, x[r][c]);
        m = fmaxf(m, x[r][c]);
      }
      const float next = fmaxf(top[r], group_max(m));
      // A row with no key seen so far keeps O = 0 and sum = 0 (the plain kernel's rule).
      const bool none = next == -CUDART_INF_F;
      const float rescale = none ? 1.0f : expf(top[r] - next);
      float row_sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        x[r][c] = none ? 0.0f : expf(x[r][c] - next);
        row_sum += x[r][c];
        ps[(4 * ty + r) * kSquareStride + tx + 16 * c] = x[r][c];
      }
      sum[r] = sum[r] * rescale + group_sum(row_sum);
      top[r] = next;
#pragma unroll
      for (int e = 0; e < G::kCols; ++e) out[r][e] *= rescale;
    }
    __syncthreads();
    accumulate_product<D, false>(ps, vs, out);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t i = q0 + 4 * ty + r;
    if (i >= s.tq) continue;
    const int64_t row = b * s.tq + i;
    write_row(o + row * D + tx * G::kCols, out[r], sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f);
    if (lse != nullptr && tx == 0) lse[row] = sum[r] > 0.0f ? top[r] + logf(sum[r]) : -CUDART_INF_F;
  }
}

template <int D, class T>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(ops::AttentionDims s, TilePointers<T> p, T* dq) {
  using G = Geometry<D>;
  extern __shared__ float4 shared_vectors[];
  float* qs = reinterpret_cast<float*>(shared_vectors);
  float* dos = qs + G::kTileFloats;
  float* ks = dos + G::kTileFloats;
  float* vs = ks + G::kTileFloats;
  float* dss = vs + G::kTileFloats;
  float* lse_s = dss + kSquareFloats;
  float* delta_s = lse_s + kTile;
  const auto [b, q0] = block_tile(s.tq);
  const int64_t plane = ops::attention_mask_plane(s, b);
  const int ty = thread_row(), tx = thread_col();
  load_tile<D>(qs, p.q + b * s.tq * D, q0, s.tq);
  load_tile<D>(dos, p.d_o + b * s.tq * D, q0, s.tq);
  load_rows(lse_s, delta_s, p.lse + b * s.tq, p.delta + b * s.tq, q0, s.tq);
  float acc[4][G::kCols] = {};
  const int64_t last = (q0 + kTile < s.tq ? q0 + kTile : s.tq) - 1;
  const int64_t keys = ops::attention_keys_seen(s, last);
  for (int64_t k0 = 0; k0 < keys; k0 += kTile) {
    __syncthreads();
    load_tile<D>(ks, p.k + b * s.tk * D, k0, s.tk);
    load_tile<D>(vs, p.v + b * s.tk * D, k0, s.tk);
    __syncthreads();
    float x[4][4], dp[4][4];
    product_abt<D>(qs, ks, x);
    product_abt<D>(dos, vs, dp);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int local = 4 * ty + r;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float prob =
            probability(s, p.mask, plane, q0 + local, k0 + tx + 16 * c, x[r][c], lse_s[local]);
        dss[local * kSquareStride + tx + 16 * c] = s.scale * prob * (dp[r][c] - delta_s[local]);
      }
    }
    __syncthreads();
    accumulate_product<D, false>(dss, ks, acc);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t i = q0 + 4 * ty + r;
    if (i < s.tq) write_row(dq + (b * s.tq + i) * D + tx * G::kCols, acc[r], 1.0f);
  }
}

template <int D, class T>
__global__ void __launch_bounds__(kThreads)
    dkv_kernel(ops::AttentionDims s, TilePointers<T> p, T* dk, T* dv) {
  using G = Geometry<D>;
  extern __shared__ float4 shared_vectors[];
  float* ks = reinterpret_cast<float*>(shared_vectors);
  float* vs = ks + G::kTileFloats;
  float* qs = vs + G::kTileFloats;
  float* dos = qs + G::kTileFloats;
  float* ps = dos + G::kTileFloats;
  float* dss = ps + kSquareFloats;
  float* lse_s = dss + kSquareFloats;
  float* delta_s = lse_s + kTile;
  const auto [b, k0] = block_tile(s.tk);
  const int64_t plane = ops::attention_mask_plane(s, b);
  const int ty = thread_row(), tx = thread_col();
  load_tile<D>(ks, p.k + b * s.tk * D, k0, s.tk);
  load_tile<D>(vs, p.v + b * s.tk * D, k0, s.tk);
  float acc_k[4][G::kCols] = {}, acc_v[4][G::kCols] = {};
  // The first query tile with a query that sees key k0 (causal: from query k0 on).
  const int64_t first = (ops::attention_first_query(s, k0) / kTile) * kTile;
  for (int64_t q0 = first; q0 < s.tq; q0 += kTile) {
    __syncthreads();
    load_tile<D>(qs, p.q + b * s.tq * D, q0, s.tq);
    load_tile<D>(dos, p.d_o + b * s.tq * D, q0, s.tq);
    load_rows(lse_s, delta_s, p.lse + b * s.tq, p.delta + b * s.tq, q0, s.tq);
    __syncthreads();
    float x[4][4], dp[4][4];
    product_abt<D>(qs, ks, x);
    product_abt<D>(dos, vs, dp);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int local = 4 * ty + r;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float prob =
            probability(s, p.mask, plane, q0 + local, k0 + tx + 16 * c, x[r][c], lse_s[local]);
        ps[local * kSquareStride + tx + 16 * c] = prob;
        dss[local * kSquareStride + tx + 16 * c] = s.scale * prob * (dp[r][c] - delta_s[local]);
      }
    }
    __syncthreads();
    accumulate_product<D, true>(ps, dos, acc_v);
    accumulate_product<D, true>(dss, qs, acc_k);
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t j = k0 + 4 * ty + r;
    if (j >= s.tk) continue;
    const int64_t key = b * s.tk + j;
    if (dk != nullptr) write_row(dk + key * D + tx * G::kCols, acc_k[r], 1.0f);
    if (dv != nullptr) write_row(dv + key * D + tx * G::kCols, acc_v[r], 1.0f);
  }
}

/// This implementation's kernels and their shared bytes, for Launches.
struct Kernels {
  template <int D, class T>
  static auto forward() {
    return forward_kernel<D, T>;
  }
  template <int D, class T>
  static auto dq() {
    return dq_kernel<D, T>;
  }
  template <int D, class T>
  static auto dkv() {
    return dkv_kernel<D, T>;
  }
  template <int D>
  static constexpr size_t forward_bytes() {
    return sizeof(float) * (3 * Geometry<D>::kTileFloats + kSquareFloats);
  }
  template <int D>
  static constexpr size_t dq_bytes() {
    return sizeof(float) * (4 * Geometry<D>::kTileFloats + kSquareFloats + 2 * kTile);
  }
  template <int D>
  static constexpr size_t dkv_bytes() {
    return sizeof(float) * (4 * Geometry<D>::kTileFloats + 2 * kSquareFloats + 2 * kTile);
  }
};

// D of each row from 16-bit dO and O (launch_attention_delta's rule, each product in float32):
// one warp per row, its lanes over strided columns, summed by a fixed butterfly.
template <class T>
__global__ void delta_kernel(const T* d_o, const T* o, const float* dlse, float* delta,
                             int64_t rows, int64_t cols) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
       row < rows; row += warps) {
    float sum = 0.0f;
    for (int64_t c = threadIdx.x % 32; c < cols; c += 32)
      sum += widen(d_o[row * cols + c]) * widen(o[row * cols + c]);
    for (int offset = 16; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x % 32 == 0) delta[row] = dlse != nullptr ? sum - dlse[row] : sum;
  }
}

TilePointers<float> tile_pointers(const AttentionPointers& p) {
  return {p.q, p.k, p.v, p.mask, p.lse, p.d_o, p.delta};
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

}  // namespace

bool tiled_attention_forward(const ops::AttentionDims& s, const AttentionPointers& p, float* o,
                             float* lse, cudaStream_t stream) {
  return Launches<Kernels>::forward(s, tile_pointers(p), o, lse, stream);
}

bool tiled_attention_dq(const ops::AttentionDims& s, const AttentionPointers& p, float* dq,
                        cudaStream_t stream) {
  return Launches<Kernels>::dq(s, tile_pointers(p), dq, stream);
}

bool tiled_attention_dkv(const ops::AttentionDims& s, const AttentionPointers& p, float* dk,
                         float* dv, cudaStream_t stream) {
  return Launches<Kernels>::dkv(s, tile_pointers(p), dk, dv, stream);
}

bool tiled_attention_forward(const ops::AttentionDims& s, const HalfAttentionPointers& p,
                             uint16_t* o, float* lse, cudaStream_t stream) {
  return with_16bit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    return Launches<Kernels>::forward(s, tile_pointers<T>(p), reinterpret_cast<T*>(o), lse, stream);
  });
}

bool tiled_attention_dq(const ops::AttentionDims& s, const HalfAttentionPointers& p, uint16_t* dq,
                        cudaStream_t stream) {
  return with_16bit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    return Launches<Kernels>::dq(s, tile_pointers<T>(p), reinterpret_cast<T*>(dq), stream);
  });
}

bool tiled_attention_dkv(const ops::AttentionDims& s, const HalfAttentionPointers& p, uint16_t* dk,
                         uint16_t* dv, cudaStream_t stream) {
  return with_16bit(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    return Launches<Kernels>::dkv(s, tile_pointers<T>(p), reinterpret_cast<T*>(dk),
                                  reinterpret_cast<T*>(dv), stream);
  });
}

bool launch_attention_delta(DType dtype, const uint16_t* d_o, const uint16_t* o, const float* dlse,
                            float* delta, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return true;
  const int64_t blocks = (rows + kThreads / 32 - 1) / (kThreads / 32);
  const auto grid = static_cast<unsigned>(blocks < (int64_t{1} << 20) ? blocks : int64_t{1} << 20);
  return with_16bit(dtype, [&](auto tag) {
    using T = decltype(tag);
    delta_kernel<T><<<grid, kThreads, 0, stream>>>(
        reinterpret_cast<const T*>(d_o), reinterpret_cast<const T*>(o), dlse, delta, rows, cols);
    return true;
  });
}

}  // namespace stagecraft::rt::cuda
