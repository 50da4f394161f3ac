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

#include "runtime/cuda/attention_kernels.h"

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

/// The same three on the tensor cores (attention_wmma.cu).
bool tensor_core_attention_forward(const ops::AttentionDims& dims, const AttentionPointers& p,
                                   float* o, float* lse, cudaStream_t stream);
bool tensor_core_attention_dq(const ops::AttentionDims& dims, const AttentionPointers& p, float* dq,
                              cudaStream_t stream);
bool tensor_core_attention_dkv(const ops::AttentionDims& dims, const AttentionPointers& p,
                               float* dk, float* dv, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
