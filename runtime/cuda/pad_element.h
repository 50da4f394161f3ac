#pragma once
/// \file
/// What one thread of the CUDA Pad kernels computes (pad_kernels.cu), as plain inline functions
/// that nvcc compiles for the device and the host compiler for tests: the kernels are
/// grid-stride loops around these, and tests/gpu/cuda_pad_reduce_element_test.cpp runs the same
/// functions on the host against the CPU backend's Pad and PadGrad, so the index arithmetic is
/// checked without a GPU. Nothing here includes a CUDA header.
///
/// Both kernels read tables built once on the host from the shared geometry
/// (ops::PadGeometry, runtime/ops/pad_shape.h): per dim, the input index each output index
/// reads (-1 for the constant), and the inverse, the output indices that read each input index.
/// Modes, negative pads and reflections past the dim are all in the tables, so the device
/// follows the shared rules by construction. PadGrad gathers (one thread per dx element, no
/// atomics): dx[i] adds dy over every position reading x[i] in ascending dy order, the order of
/// the CPU's loops, so the two agree bit for bit.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::cuda {

/// Views into the tables of one Pad node (all int64, one array; see `PadTableData`).
struct PadTables {
  int32_t rank = 0;
  const int64_t* y_dims = nullptr;        ///< rank: the output's dims
  const int64_t* x_dims = nullptr;        ///< rank: the input's dims
  const int64_t* x_strides = nullptr;     ///< rank: the input's row-major strides
  const int64_t* source_start = nullptr;  ///< rank: where dim d's entries of `sources` begin
  const int64_t* sources = nullptr;  ///< per dim, per output index: the input index read, or -1
  const int64_t* reader_start = nullptr;  ///< rank: where dim d's entries of `reader_bounds` begin
  /// Per dim, x_dims[d] + 1 bounds: the readers of input index i along dim d are
  /// readers[bounds[i] .. bounds[i + 1]).
  const int64_t* reader_bounds = nullptr;
  /// Output indices times the output's stride along their dim, ascending within an input index.
  const int64_t* readers = nullptr;
};

/// The tables of one Pad node in host memory, laid out as one int64 array (uploaded to the
/// device as is), with the start of each section.
struct PadTableData {
  int32_t rank = 0;
  std::vector<int64_t> values;
  size_t y_dims = 0, x_dims = 0, x_strides = 0, source_start = 0, sources = 0, reader_start = 0,
         reader_bounds = 0, readers = 0;

  /// The views over `base`, a copy of `values` (on the host or the device).
  PadTables at(const int64_t* base) const {
    return {rank,
            base + y_dims,
            base + x_dims,
            base + x_strides,
            base + source_start,
            base + sources,
            base + reader_start,
            base + reader_bounds,
            base + readers};
  }
};

/// The tables of a Pad from X of `x_dims` to Y of `y_dims`, where `source[d][o]` is the input
/// index output index o reads along dim d, or -1 (ops::PadGeometry::source).
inline PadTableData pad_tables(const std::vector<int64_t>& x_dims,
                               const std::vector<int64_t>& y_dims,
                               const std::vector<std::vector<int64_t>>& source) {
  PadTableData t;
  const size_t rank = x_dims.size();
  t.rank = static_cast<int32_t>(rank);
  std::vector<int64_t>& v = t.values;
  auto section = [&](size_t& start, size_t size) {
    start = v.size();
    v.resize(v.size() + size, 0);
  };
  section(t.y_dims, rank);
  section(t.x_dims, rank);
  section(t.x_strides, rank);
  section(t.source_start, rank);
  section(t.reader_start, rank);
  std::vector<int64_t> y_strides(rank, 1);
  for (size_t d = rank; d-- > 0;) {
    v[t.y_dims + d] = y_dims[d];
    v[t.x_dims + d] = x_dims[d];
    v[t.x_strides + d] = d + 1 < rank ? v[t.x_strides + d + 1] * x_dims[d + 1] : 1;
    y_strides[d] = d + 1 < rank ? y_strides[d + 1] * y_dims[d + 1] : 1;
  }
  t.sources = v.size();
  for (size_t d = 0; d < rank; ++d) {
    v[t.source_start + d] = static_cast<int64_t>(v.size() - t.sources);
    v.insert(v.end(), source[d].begin(), source[d].end());
  }
  // Readers: counted per input index, then placed in ascending output order.
  t.reader_bounds = v.size();
  std::vector<std::vector<int64_t>> bounds(rank);
  int64_t total = 0;
  for (size_t d = 0; d < rank; ++d) {
    v[t.reader_start + d] = static_cast<int64_t>(v.size() - t.reader_bounds);
    bounds[d].assign(static_cast<size_t>(x_dims[d]) + 1, 0);
    for (int64_t s : source[d])
      if (s >= 0) ++bounds[d][static_cast<size_t>(s) + 1];
    bounds[d][0] = total;
    for (size_t i = 1; i < bounds[d].size(); ++i) bounds[d][i] += bounds[d][i - 1];
    total = bounds[d].back();
    v.insert(v.end(), bounds[d].begin(), bounds[d].end());
  }
  t.readers = v.size();
  v.resize(v.size() + static_cast<size_t>(total), 0);
  for (size_t d = 0; d < rank; ++d) {
    std::vector<int64_t> next(bounds[d].begin(), bounds[d].end() - 1);
    for (size_t o = 0; o < source[d].size(); ++o)
      if (const int64_t s = source[d][o]; s >= 0)
        v[t.readers + static_cast<size_t>(next[static_cast<size_t>(s)]++)] =
            static_cast<int64_t>(o) * y_strides[d];
  }
  return t;
}

/// Pad's output element e (row-major over Y): the input element it reads, or `value`.
template <class T>
STAGECRAFT_HOST_DEVICE T pad_element(const PadTables& p, const T* x, T value, int64_t e) {
  int64_t offset = 0;
  for (int d = p.rank - 1; d >= 0; --d) {
    const int64_t o = e % p.y_dims[d];
    e /= p.y_dims[d];
    const int64_t s = p.sources[p.source_start[d] + o];
    if (s < 0) return value;
    offset += s * p.x_strides[d];
  }
  return x[offset];
}

/// PadGrad's input element i (row-major over X): the sum in float of dy over every output
/// position that reads x[i], in ascending dy offset (the readers' product, dim 0 slowest).
STAGECRAFT_HOST_DEVICE inline float pad_grad_element(const PadTables& p, const float* dy,
                                                     int64_t i) {
  int64_t terms = 1;
  for (int d = 0; d < p.rank; ++d) {
    const int64_t* b = p.reader_bounds + p.reader_start[d] + (i / p.x_strides[d]) % p.x_dims[d];
    terms *= b[1] - b[0];
  }
  float sum = 0.0f;
  for (int64_t t = 0; t < terms; ++t) {
    int64_t rest = t, offset = 0;
    for (int d = p.rank - 1; d >= 0; --d) {
      const int64_t* b = p.reader_bounds + p.reader_start[d] + (i / p.x_strides[d]) % p.x_dims[d];
      const int64_t count = b[1] - b[0];
      offset += p.readers[b[0] + rest % count];
      rest /= count;
    }
    sum += dy[offset];
  }
  return sum;
}

}  // namespace stagecraft::rt::cuda
