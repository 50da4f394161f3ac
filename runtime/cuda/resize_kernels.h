#pragma once
/// \file
/// Device kernels of the CUDA resize family (resize_kernels.cu): one thread per destination
/// element running runtime/ops/resize_element.h's `separable_sum` over tables in device memory,
/// for Resize (destination Y, source X) and ResizeGrad (destination dX, source dY) alike. Every
/// launch is queued on `stream`; the host side (resize.cpp) reads the node and builds and
/// uploads the tables.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/ops/resize_element.h"

namespace stagecraft::rt::cuda {

/// destination[e] = separable_sum(table, source, e) for e in [0, n).
void launch_separable_sum(float* destination, const float* source, int64_t n,
                          const ops::SeparableTable& table, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
