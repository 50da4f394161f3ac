#pragma once
/// \file
/// Device kernels of the CUDA rearrange family (rearrange_kernels.cu): DepthToSpace,
/// SpaceToDepth and TopK and their gradients, around runtime/ops/rearrange_element.h's
/// functions, which the CPU backend runs too. The host side (rearrange.cpp) reads the nodes
/// with the shared rules (runtime/ops/rearrange_shape.h).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/cuda/indexing_kernels.h"  // NumberType: the dtypes TopK selects on
#include "runtime/ops/rearrange_element.h"

namespace stagecraft::rt::cuda {

/// Every element of the spatial tensor S moved from the deep one D (`gather`: S[e] =
/// D[space_to_deep(e)]) or to it (D[space_to_deep(e)] = S[e]); elements of `element_bytes`
/// (1, 2, 4 or 8) bytes.
void launch_space_depth(void* dst, const void* src, int64_t element_bytes,
                        const ops::SpaceDepthShape& shape, bool gather, cudaStream_t stream);

/// TopK of every line: one thread per line picks its K elements in order (each the first, by
/// topk_before, of those after the one picked before), so ties go to the lower index as on
/// the CPU.
void launch_topk(void* values, int64_t* indices, const void* x, NumberType type,
                 const ops::TopKShape& shape, cudaStream_t stream);

/// out[line] = arg_of_line(x, shape, line, last) for every line: ArgMax (shape.largest) or
/// ArgMin, one thread a line.
void launch_arg_extreme(int64_t* out, const void* x, NumberType type, const ops::TopKShape& shape,
                        bool last, cudaStream_t stream);

/// dX[topk_offset(line, indices[o])] = dValues[o] for every output o; dX zeroed before.
void launch_topk_grad(float* dx, const float* d_values, const int64_t* indices,
                      const ops::TopKShape& shape, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
