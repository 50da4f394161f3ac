#pragma once
/// \file
/// The tiled attention kernels: the fused Attention forward, dQ, and dK with dV, in 64 x 64
/// tiles of queries and keys staged in shared memory, float32, for heads of 32, 64 or 128
/// (d = dv) and operands 16-byte aligned, in two versions: the tile products on the ordinary
/// cores (attention_tiled.cu) or on the tensor cores in three tf32 passes, float32's precision
/// (attention_wmma.cu). Each returns false, launching nothing, for any other node, which the
/// plain kernels of attention_kernels.cu then run; all give the same results to float32
/// rounding (tests/gpu/cuda_attention_test.cpp checks each against the CPU backend's).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/cuda/attention_kernels.h"
#include "runtime/format/dtype.h"

namespace stagecraft::rt::cuda {

/// O and lse (which may be null), as launch_attention_forward.
bool tiled_attention_forward(const ops::AttentionDims& dims, const AttentionPointers& p, float* o,
                             float* lse, cudaStream_t stream);

/// dQ, as launch_attention_dq.
bool tiled_attention_dq(const ops::AttentionDims& dims, const AttentionPointers& p, float* dq,
                        cudaStream_t stream);

/// dK and dV (either may be null), as launch_attention_dkv.
bool tiled_attention_dkv(const ops::AttentionDims& dims, const AttentionPointers& p, float* dk,
                         float* dv, cudaStream_t stream);

/// A node whose activations are 16-bit floats (`dtype`: bfloat16 or float16): Q, K, V and dO as
/// that type's bits, and so are the outputs O, dQ, dK and dV; the mask, lse and D float32. The
/// tiled kernels widen each element to float32 as they load a tile and round each output once,
/// so they compute as the float32 kernels on the widened operands do; 8-byte-aligned operands.
struct HalfAttentionPointers {
  DType dtype = DType::kBFloat16;
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const float* mask = nullptr;
  const float* lse = nullptr;
  const uint16_t* d_o = nullptr;
  const float* delta = nullptr;
};

/// The three on 16-bit activations: false, launching nothing, where the tiles do not take the
/// node (the caller then runs it widened to float32).
bool tiled_attention_forward(const ops::AttentionDims& dims, const HalfAttentionPointers& p,
                             uint16_t* o, float* lse, cudaStream_t stream);
bool tiled_attention_dq(const ops::AttentionDims& dims, const HalfAttentionPointers& p,
                        uint16_t* dq, cudaStream_t stream);
bool tiled_attention_dkv(const ops::AttentionDims& dims, const HalfAttentionPointers& p,
                         uint16_t* dk, uint16_t* dv, cudaStream_t stream);

/// The three on 16-bit activations on the tensor cores (attention_mma.cu: mma.sync m16n8k16,
/// float32 accumulators, softmax statistics, lse and D; P and dS rounded to the 16-bit type
/// before they multiply); false, launching nothing, where they do not take the node (heads of 32,
/// 64 or 128 with d = dv, operands 16-byte aligned). The default for 16-bit nodes since an H200
/// checked them against the CPU and under racecheck and measured them (bench/RESULTS.md);
/// $STAGECRAFT_ATTENTION_KERNELS=tiled runs the tiled ones instead. `tiling`: how the streamed
/// tiles reach shared memory and the products' B fragments (MmaTiles).
bool mma_attention_forward(const ops::AttentionDims& dims, const HalfAttentionPointers& p,
                           uint16_t* o, float* lse, MmaTiles tiling, cudaStream_t stream);
bool mma_attention_dq(const ops::AttentionDims& dims, const HalfAttentionPointers& p, uint16_t* dq,
                      MmaTiles tiling, cudaStream_t stream);
bool mma_attention_dkv(const ops::AttentionDims& dims, const HalfAttentionPointers& p, uint16_t* dk,
                       uint16_t* dv, MmaTiles tiling, cudaStream_t stream);

/// launch_attention_delta for 16-bit dO and O (`dtype`); false for another dtype.
bool launch_attention_delta(DType dtype, const uint16_t* d_o, const uint16_t* o, const float* dlse,
                            float* delta, int64_t rows, int64_t cols, cudaStream_t stream);

/// The same three on the tensor cores (attention_wmma.cu).
bool tensor_core_attention_forward(const ops::AttentionDims& dims, const AttentionPointers& p,
                                   float* o, float* lse, cudaStream_t stream);
bool tensor_core_attention_dq(const ops::AttentionDims& dims, const AttentionPointers& p, float* dq,
                              cudaStream_t stream);
bool tensor_core_attention_dkv(const ops::AttentionDims& dims, const AttentionPointers& p,
                               float* dk, float* dv, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
