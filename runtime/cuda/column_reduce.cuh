#pragma once
// Column sums of a row-major [rows, cols] operand across the whole device (device code only),
// deterministic: stage one, blocks of kColumnTile columns x kColumnLanes row lanes each fold one
// slice of rows (lane l takes rows l, l + kColumnLanes, ... of the slice; a warp reads 32
// adjacent columns of a row, 128 bytes) into a double partial per column and slice, the lanes
// added in lane order; stage two, one thread per column adds its slices' partials in slice
// order. The result depends on rows, cols and the slice count (column_slices, from the shape
// alone), never on timing. Used for every bias-style gradient (sum_to_shape over leading dims)
// and LayerNorm's scale and bias gradients, which before ran a block per column over strided
// rows or a thread per column over all rows (issue 31).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/cuda/data_kernels.h"

namespace stagecraft::rt::cuda {

/// Term: `static constexpr int kTerms` and `__device__ void operator()(int64_t r, int64_t c,
/// double (&t)[kTerms]) const`, the terms of row r, column c. Partials land at
/// partial[(k * slices + slice) * cols + c] for term k.
template <class Term>
__global__ void __launch_bounds__(kColumnTile * kColumnLanes)
    column_partials_kernel(Term term, int64_t rows, int64_t cols, int64_t per_slice,
                           double* partial) {
  constexpr int K = Term::kTerms;
  __shared__ double lanes[K][kColumnLanes][kColumnTile + 1];
  const int64_t c = blockIdx.x * int64_t{kColumnTile} + threadIdx.x;
  const int64_t r0 = blockIdx.y * per_slice;
  const int64_t r1 = r0 + per_slice < rows ? r0 + per_slice : rows;
  double acc[K];
#pragma unroll
  for (int k = 0; k < K; ++k) acc[k] = 0.0;
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColumnLanes) {
      double t[K];
      term(r, c, t);
#pragma unroll
      for (int k = 0; k < K; ++k) acc[k] += t[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) lanes[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      double s = 0.0;
#pragma unroll
      for (int l = 0; l < kColumnLanes; ++l) s += lanes[k][l][threadIdx.x];
      partial[(k * int64_t{gridDim.y} + blockIdx.y) * cols + c] = s;
    }
  }
}

/// Finish: `__device__ void operator()(int k, int64_t c, double sum) const`, given term k's
/// column sum.
template <int K, class Finish>
__global__ void column_finish_kernel(const double* partial, int64_t slices, int64_t cols,
                                     Finish finish) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
       c += int64_t{blockDim.x} * gridDim.x) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      double s = 0.0;
      for (int64_t i = 0; i < slices; ++i) s += partial[(k * slices + i) * cols + c];
      finish(k, c, s);
    }
  }
}

/// Both stages on `stream`; `partial` holds Term::kTerms * slices * cols doubles.
template <class Term, class Finish>
void launch_column_reduce(const Term& term, const Finish& finish, int64_t rows, int64_t cols,
                          double* partial, int64_t slices, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t per_slice = (rows + slices - 1) / slices;
  const dim3 grid(static_cast<unsigned>((cols + kColumnTile - 1) / kColumnTile),
                  static_cast<unsigned>(slices));
  column_partials_kernel<Term>
      <<<grid, dim3(kColumnTile, kColumnLanes), 0, stream>>>(term, rows, cols, per_slice, partial);
  const int64_t blocks = (cols + 255) / 256;
  column_finish_kernel<Term::kTerms, Finish>
      <<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(
          partial, slices, cols, finish);
}

}  // namespace stagecraft::rt::cuda
