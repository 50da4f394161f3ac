#pragma once
/// \file
/// Device kernel of the CUDA random family (random_kernels.cu): each element the draw of
/// runtime/ops/random_element.h for (the node's key, its index), the CPU's numbers.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/ops/random_element.h"

namespace stagecraft::rt::cuda {

/// Fills `n` elements of `out` (float64 when `f64`, else float32) with the node's draws.
void launch_random(const ops::RandomParams& params, uint64_t node_key, void* out, bool f64,
                   int64_t n, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
