#pragma once
/// \file
/// Device kernels of the CUDA data family (data_kernels.cu): element moves through strided
/// index maps on raw bytes (Transpose, Slice, Expand and their gradients), Gather and its
/// deterministic scatter-add, and sums over reduced dims (ReduceMean, ExpandGrad). Every launch
/// is queued on `stream`; the host side (data.cpp, grad_data.cpp) validates shapes and builds
/// the index maps.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/ops/trilu_element.h"

namespace stagecraft::rt::cuda {

/// The highest rank an index map handles (after merging contiguous dims).
inline constexpr int kMaxIndexRank = 8;

/// A map from a dense index i over `dims` (row-major) to the element offset
/// `sum(c[d] * strides[d])` of its coordinate c; strides may be zero or negative. Rank 0 maps
/// every index to 0. Passed to kernels by value.
struct IndexMap {
  int32_t rank = 0;
  int64_t dims[kMaxIndexRank] = {};
  int64_t strides[kMaxIndexRank] = {};
};

/// dst[i] = src[map(i)] for i in [0, n), elements of `element_bytes` (1, 2, 4, 8 or 16) bytes.
void launch_strided_gather(void* dst, const void* src, int64_t element_bytes, int64_t n,
                           const IndexMap& map, cudaStream_t stream);

/// dst[map(i)] = src[i] for i in [0, n); the mapped positions must be distinct.
void launch_strided_scatter(void* dst, const void* src, int64_t element_bytes, int64_t n,
                            const IndexMap& map, cudaStream_t stream);

/// dst[e] = trilu_keeps(shape, e) ? src[e] : 0 for e in [0, n), elements of `element_bytes`
/// (1, 2, 4, 8 or 16) bytes: Trilu, and its gradient on float32.
void launch_trilu(void* dst, const void* src, int64_t element_bytes, int64_t n,
                  const ops::TriluShape& shape, cudaStream_t stream);

/// Gather along an axis seen as [outer, dim, inner] -> [outer, count, inner], in units of
/// `unit_bytes` (1, 2, 4, 8 or 16): out[o, i, j] = data[o, indices[i], j]. `indices` (device,
/// `count` of them) are already in [0, dim).
void launch_gather(void* out, const void* data, const int64_t* indices, int64_t outer,
                   int64_t count, int64_t dim, int64_t inner, int64_t unit_bytes,
                   cudaStream_t stream);

/// Gather's gradient without atomics: dx[o, d, j] = sum over the positions p of index d (listed
/// ascending in positions[offsets[d] .. offsets[d + 1])) of dy[o, p, j], summed in float in
/// that order; zero where d is never gathered. `offsets` (dim + 1) and `positions` (count) are
/// device arrays.
void launch_gather_grad(float* dx, const float* dy, const int64_t* offsets,
                        const int64_t* positions, int64_t outer, int64_t count, int64_t dim,
                        int64_t inner, cudaStream_t stream);

/// A reduction of a dense input: output element o reads input `kept(o) + reduced(r)` for each r
/// in [0, count), where count is the product of `reduced`'s dims.
struct ReduceMap {
  IndexMap kept, reduced;
  int64_t count = 1;
};

/// out[o] = mean over r of in[...] for n_out outputs: float32 and float64 summed in double,
/// int32 and int64 in int64 with the mean truncated toward zero.
void launch_reduce_mean_f32(float* out, const float* in, int64_t n_out, const ReduceMap& map,
                            cudaStream_t stream);
void launch_reduce_mean_f64(double* out, const double* in, int64_t n_out, const ReduceMap& map,
                            cudaStream_t stream);
void launch_reduce_mean_i32(int32_t* out, const int32_t* in, int64_t n_out, const ReduceMap& map,
                            cudaStream_t stream);
void launch_reduce_mean_i64(int64_t* out, const int64_t* in, int64_t n_out, const ReduceMap& map,
                            cudaStream_t stream);

/// out[o] = sum over r of in[...] (float32, summed in double).
void launch_reduce_sum_f32(float* out, const float* in, int64_t n_out, const ReduceMap& map,
                           cudaStream_t stream);

/// Column sums across the device (column_reduce.cuh): blocks of kColumnTile columns by
/// kColumnLanes row lanes, over column_slices slices of rows.
constexpr int kColumnTile = 32, kColumnLanes = 8;

/// Slices of rows for a column sum of [rows, cols]: about 1024 blocks in all (every SM busy on
/// any GPU of today), each slice at least 64 rows. From the shape alone, so the sum's order is.
inline int64_t column_slices(int64_t rows, int64_t cols) {
  const int64_t tiles = (cols + kColumnTile - 1) / kColumnTile;
  int64_t slices = 1024 / (tiles < 1 ? 1 : tiles);
  if (slices > rows / 64) slices = rows / 64;
  if (slices > 65535) slices = 65535;
  return slices < 1 ? 1 : slices;
}

/// Whether `map` (of n_out outputs) sums columns: the outputs one unit-stride run, the reduced
/// elements one strided dim of at least 64, where launch_column_sum_f32 beats a block per output
/// (whose threads would read one element per row, 4 bytes of every 32-byte sector).
inline bool column_reduction(const ReduceMap& map, int64_t n_out) {
  return n_out > 1 && map.kept.rank == 1 && map.kept.strides[0] == 1 && map.reduced.rank == 1 &&
         map.count >= 64;
}

/// out[c] = the sum over r < rows of in[r * row_stride + c] for c < cols (float32, summed in
/// double); `partial` holds column_slices(rows, cols) * cols doubles of scratch.
void launch_column_sum_f32(float* out, const float* in, int64_t rows, int64_t cols,
                           int64_t row_stride, double* partial, int64_t slices,
                           cudaStream_t stream);

/// dst[i] = src[map(i)] * scale for i in [0, n) (float32).
void launch_broadcast_scale(float* dst, const float* src, int64_t n, const IndexMap& map,
                            float scale, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
