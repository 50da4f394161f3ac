#pragma once
/// \file
/// What the two tiled attention implementations share (attention_tiled.cu on the ordinary
/// cores, attention_wmma.cu on the tensor cores; attention_tiled.h): the tile geometry, the
/// loads of Q, K, V and dO tiles and of each row's lse and D into shared memory, the two rules
/// applied per score (the scaled, masked score; the probability from lse), the launcher and the
/// dispatch on the head size. Included by those .cu files only.

#include <cuda_runtime_api.h>
#include <math_constants.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "runtime/cuda/attention_choice.h"
#include "runtime/cuda/attention_tiled.h"
#include "runtime/cuda/elementwise_device.cuh"

namespace stagecraft::rt::cuda::attention_tiles {

/// A node's operands with its activations (Q, K, V, dO) stored as T: float, or a 16-bit float
/// (eltwise::BFloat16, eltwise::Half) that the tiles widen to float32 as they load it; the
/// mask, lse and D are float32 in every node.
template <class T>
struct TilePointers {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  const float* mask = nullptr;
  const float* lse = nullptr;
  const T* d_o = nullptr;
  const float* delta = nullptr;
};

/// x as a float32 (the 16-bit types exactly, as the CPU's Cast widens them).
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(eltwise::BFloat16 x) { return eltwise::to_float(x); }
__device__ __forceinline__ float widen(eltwise::Half x) { return eltwise::to_float(x); }

/// x rounded to nearest even into T (as the CPU's Cast rounds).
template <class T>
__device__ __forceinline__ T narrow(float x) {
  if constexpr (std::is_same_v<T, eltwise::BFloat16>)
    return eltwise::to_bfloat16(x);
  else if constexpr (std::is_same_v<T, eltwise::Half>)
    return eltwise::to_half(x);
  else
    return x;
}

inline constexpr int kTile = 64;      ///< Queries or keys per tile (and per block).
inline constexpr int kThreads = 256;  ///< Threads per block.
/// A [64][64] tile of scores, probabilities or dS: rows of 68 floats (16-byte aligned, and the
/// rows of 8 threads reading one column fall in 8 different groups of 4 banks).
inline constexpr int kSquareStride = kTile + 4;
inline constexpr int kSquareFloats = kTile * kSquareStride;

/// A [64][D] tile of Q, K, V, dO or an output, likewise padded.
template <int D>
struct Geometry {
  static constexpr int kStride = D + 4;
  static constexpr int kTileFloats = kTile * kStride;
  static constexpr int kCols = D / 16;      ///< Per thread (tiled); fragments across (wmma).
  static constexpr int kOutFrags = D / 32;  ///< Output fragments per warp (wmma).
};

/// Rows first .. first + 63 of the entry's [rows][D] array `src` into `tile`, as float32; rows
/// at or past `limit` as zeros. Four elements per read: a float4, or 8 bytes of 16-bit values.
template <int D, class T>
__device__ void load_tile(float* tile, const T* src, int64_t first, int64_t limit) {
  constexpr int kVectors = D / 4;
  for (int idx = threadIdx.x; idx < kTile * kVectors; idx += kThreads) {
    const int r = idx / kVectors, c = idx % kVectors;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (first + r < limit) {
      if constexpr (std::is_same_v<T, float>) {
        v = reinterpret_cast<const float4*>(src + (first + r) * D)[c];
      } else {
        const uint2 bits = reinterpret_cast<const uint2*>(src + (first + r) * D)[c];
        const auto part = [](uint32_t word, int high) {
          return widen(T{static_cast<uint16_t>(high ? word >> 16 : word & 0xffffu)});
        };
        v = make_float4(part(bits.x, 0), part(bits.x, 1), part(bits.y, 0), part(bits.y, 1));
      }
    }
    *reinterpret_cast<float4*>(tile + r * Geometry<D>::kStride + 4 * c) = v;
  }
}

/// lse and D of rows first .. first + 63 (-inf and 0 past `limit`) into shared memory.
__device__ inline void load_rows(float* lse_s, float* delta_s, const float* lse, const float* delta,
                                 int64_t first, int64_t limit) {
  if (threadIdx.x < kTile) {
    const int64_t row = first + threadIdx.x;
    lse_s[threadIdx.x] = row < limit ? lse[row] : -CUDART_INF_F;
    delta_s[threadIdx.x] = row < limit && delta != nullptr ? delta[row] : 0.0f;
  }
}

/// The scaled, masked score of query i and key j from its dot product; -inf for a key the
/// query does not see (causal, or past the keys) and for a query past the last.
__device__ inline float masked_score(const ops::AttentionDims& s, const float* mask, int64_t plane,
                                     int64_t i, int64_t j, float dot) {
  if (i >= s.tq || j >= ops::attention_keys_seen(s, i)) return -CUDART_INF_F;
  return s.scale * dot + ops::attention_mask_at(s, mask, plane, i, j);
}

/// P of query i and key j from its dot product and the query's lse (0 for a key it does not
/// see and for a query that sees none).
__device__ inline float probability(const ops::AttentionDims& s, const float* mask, int64_t plane,
                                    int64_t i, int64_t j, float dot, float row_lse) {
  const float x = masked_score(s, mask, plane, i, j, dot);
  return x == -CUDART_INF_F || row_lse == -CUDART_INF_F ? 0.0f : expf(x - row_lse);
}

/// Launches `kernel` on `blocks` blocks of kThreads with `bytes` of shared memory; false
/// (nothing launched) where the device refuses that much, the plain kernels then running.
template <class Kernel, class... Args>
bool launch(Kernel kernel, int64_t blocks, size_t bytes, cudaStream_t stream, Args... args) {
  if (blocks <= 0 || blocks > (int64_t{1} << 31) - 1) return false;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes)) != cudaSuccess) {
    (void)cudaGetLastError();  // cleared: the plain kernels run instead
    return false;
  }
  kernel<<<static_cast<unsigned>(blocks), kThreads, bytes, stream>>>(args...);
  return true;
}

/// body(T{}) with T the storage type of `dtype` (eltwise::BFloat16 or eltwise::Half); false for
/// another dtype.
template <class Body>
bool with_16bit(DType dtype, Body body) {
  if (dtype == DType::kBFloat16) return body(eltwise::BFloat16{});
  if (dtype == DType::kFloat16) return body(eltwise::Half{});
  return false;
}

template <int D>
struct HeadSize {
  static constexpr int value = D;
};

/// body(HeadSize<D>{}) for the head sizes the tiled kernels are built for (d = dv of 32, 64 or
/// 128); false for any other.
template <class Body>
bool with_head_size(const ops::AttentionDims& s, Body body) {
  if (!tiles_take(s)) return false;  // attention_choice.h: the rule host code reads
  switch (s.d) {
    case 32:
      return body(HeadSize<32>{});
    case 64:
      return body(HeadSize<64>{});
    case 128:
      return body(HeadSize<128>{});
    default:
      return false;
  }
}

/// Tiles of 64 over `rows`.
__host__ __device__ inline int64_t tiles(int64_t rows) { return (rows + kTile - 1) / kTile; }

/// This block's batch entry and first row: the blocks walk each entry's tiles of 64 of its
/// `rows` (queries, or keys for dK and dV), entry by entry.
struct BlockTile {
  int64_t entry, first;
};
__device__ inline BlockTile block_tile(int64_t rows) {
  const int64_t per_entry = tiles(rows);
  return {blockIdx.x / per_entry, (blockIdx.x % per_entry) * kTile};
}

/// Whether every non-null pointer is `bytes`-aligned (the tiles are read four elements at a
/// time: 16 bytes of float32, 8 of a 16-bit type).
inline bool vector_aligned(std::initializer_list<const void*> pointers, std::uintptr_t bytes) {
  for (const void* p : pointers)
    if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % bytes != 0) return false;
  return true;
}

/// The three launches of one implementation `K`, which gives, per head size D and storage type
/// T of the activations, its kernels (`K::forward<D, T>()`, `K::dq<D, T>()`, `K::dkv<D, T>()`)
/// and their shared bytes (`K::forward_bytes<D>()`, `K::dq_bytes<D>()`, `K::dkv_bytes<D>()`):
/// each false, launching nothing, where the node's head size or an operand's alignment does not
/// suit the tiles. `P` is the kernels' operand struct (AttentionPointers for float, or
/// TilePointers<T>).
template <class K>
struct Launches {
  template <class P, class T>
  static bool forward(const ops::AttentionDims& s, const P& p, T* o, float* lse,
                      cudaStream_t stream) {
    if (!vector_aligned({p.q, p.k, p.v, o}, 4 * sizeof(T))) return false;
    return with_head_size(s, [&](auto h) {
      constexpr int D = decltype(h)::value;
      return launch(K::template forward<D, T>(), s.batch * tiles(s.tq),
                    K::template forward_bytes<D>(), stream, s, p, o, lse);
    });
  }
  template <class P, class T>
  static bool dq(const ops::AttentionDims& s, const P& p, T* dq, cudaStream_t stream) {
    if (!vector_aligned({p.q, p.k, p.v, p.d_o, dq}, 4 * sizeof(T))) return false;
    return with_head_size(s, [&](auto h) {
      constexpr int D = decltype(h)::value;
      return launch(K::template dq<D, T>(), s.batch * tiles(s.tq), K::template dq_bytes<D>(),
                    stream, s, p, dq);
    });
  }
  template <class P, class T>
  static bool dkv(const ops::AttentionDims& s, const P& p, T* dk, T* dv, cudaStream_t stream) {
    if (!vector_aligned({p.q, p.k, p.v, p.d_o, dk, dv}, 4 * sizeof(T))) return false;
    return with_head_size(s, [&](auto h) {
      constexpr int D = decltype(h)::value;
      return launch(K::template dkv<D, T>(), s.batch * tiles(s.tk), K::template dkv_bytes<D>(),
                    stream, s, p, dk, dv);
    });
  }
};

}  // namespace stagecraft::rt::cuda::attention_tiles
