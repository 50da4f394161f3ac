#pragma once
/// \file
/// Device kernels of the CUDA indexing family (indexing_kernels.cu): Tile, CumSum,
/// GatherElements and ScatterND and their gradients, each a grid-stride loop (one thread per
/// element, or per line for the scans) around runtime/ops/indexing_element.h's functions, which
/// the CPU backend runs too. Tables and indices live in device memory; the host side
/// (indexing.cpp) reads the nodes with the shared rules and uploads them. Element kernels move
/// elements of `element_bytes` (1, 2, 4 or 8) bytes as opaque values; the adding ones take a
/// `DTypeCode`.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/ops/indexing_element.h"

namespace stagecraft::rt::cuda {

/// The arithmetic dtypes of CumSum and of ScatterND's add and mul.
enum class NumberType : int32_t { kFloat32, kFloat64, kInt32, kInt64 };

/// y[e] = x[tile_source(shape, e)] for e in [0, n).
void launch_tile(void* y, const void* x, int64_t element_bytes, int64_t n,
                 const ops::TileShape& shape, cudaStream_t stream);

/// scan_line(shape, x, y, l) for every line l of the shape.
void launch_scan(void* y, const void* x, NumberType type, const ops::ScanShape& shape,
                 cudaStream_t stream);

/// y[e] = data[gather_elements_source(shape, indices, e)] for e in [0, n).
void launch_gather_elements(void* y, const void* data, int64_t element_bytes, int64_t n,
                            const ops::GatherElementsShape& shape, const int64_t* indices,
                            cudaStream_t stream);

/// dx[p] = gather_elements_grad_element(shape, indices, dy, p) for p in [0, n).
void launch_gather_elements_grad(float* dx, const float* dy, int64_t n,
                                 const ops::GatherElementsShape& shape, const int64_t* indices,
                                 cudaStream_t stream);

/// y[e] = scatter_nd_element(plan, data, updates, e) for e in [0, n): by element size for
/// reduction none, by `type` for add and mul.
void launch_scatter_nd(void* y, const void* data, const void* updates, int64_t element_bytes,
                       NumberType type, int64_t n, const ops::ScatterPlan& plan,
                       cudaStream_t stream);

/// dData[e] = scatter_nd_data_grad (n_data elements) and dUpdates[e] = scatter_nd_updates_grad
/// (n_updates); either output may be null.
void launch_scatter_nd_grad(float* d_data, int64_t n_data, float* d_updates, int64_t n_updates,
                            const float* dy, const ops::ScatterPlan& plan, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
