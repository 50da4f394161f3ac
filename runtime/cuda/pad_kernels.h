#pragma once
/// \file
/// Device kernels of the CUDA pad family (pad_kernels.cu): Pad on elements of 1, 4 or 8 bytes
/// and PadGrad on float32, each one thread per element through the tables of pad_element.h
/// (which live in device memory). Every launch is queued on `stream`; the host side (pad.cpp)
/// reads the node, builds and uploads the tables.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/cuda/pad_element.h"

namespace stagecraft::rt::cuda {

/// y[e] = pad_element(tables, x, value, e) for e in [0, n), elements of `element_bytes` (1, 4 or
/// 8) bytes; `value` holds the constant's bytes in its low `element_bytes` bytes.
void launch_pad(void* y, const void* x, int64_t element_bytes, uint64_t value, int64_t n,
                const PadTables& tables, cudaStream_t stream);

/// dx[i] = pad_grad_element(tables, dy, i) for i in [0, n).
void launch_pad_grad(float* dx, const float* dy, int64_t n, const PadTables& tables,
                     cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
