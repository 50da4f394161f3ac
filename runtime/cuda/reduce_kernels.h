#pragma once
/// \file
/// Device kernels of the CUDA reduction family (reduce_kernels.cu): ReduceSum, Max, Min, Prod,
/// L1, L2, SumSquare, LogSum and LogSumExp forward on float32, float64, int32 and int64, and
/// their gradients on float32, through the loops and per-element functions of reduce_element.h.
/// Every launch is queued on `stream`; the host side (reduce.cpp) reads the node and builds
/// the loops.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/cuda/reduce_element.h"

namespace stagecraft::rt::cuda {

/// y[o] = the reduction `kind` of output o's elements of x, for the s.outputs outputs: one
/// thread per output where the reductions are short or many, else one block per output (a fixed
/// tree, so the result depends only on the shapes).
void launch_reduce(float* y, const float* x, Reduction kind, const ReduceGroups& s,
                   cudaStream_t stream);
void launch_reduce(double* y, const double* x, Reduction kind, const ReduceGroups& s,
                   cudaStream_t stream);
void launch_reduce(int32_t* y, const int32_t* x, Reduction kind, const ReduceGroups& s,
                   cudaStream_t stream);
void launch_reduce(int64_t* y, const int64_t* x, Reduction kind, const ReduceGroups& s,
                   cudaStream_t stream);

/// dx (n elements, X's shape) from x, the forward output y (null where `kind` does not read it:
/// ops::gradient_reads_y) and dy: Prod one thread per output (the CPU's two passes), Max and
/// Min their tie shares per output into `share` (s.outputs floats of scratch) and then, like
/// the others, one thread per dx element.
void launch_reduce_grad(Reduction kind, float* dx, const float* x, const float* y, const float* dy,
                        float* share, int64_t n, const ReduceGroups& s, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
