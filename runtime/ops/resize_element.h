#pragma once
/// \file
/// The arithmetic of Resize and its gradient, one element at a time, as plain inline functions
/// that the host compiler builds for the CPU backend (runtime/cpu/resize.cpp) and nvcc for the
/// CUDA one (runtime/cuda/resize_kernels.cu): both backends run these very functions on tables
/// built by the same host code, so they sum in the same order. Nothing here includes a CUDA
/// header. tests/gpu/cuda_resize_element_test.cpp checks the tables as the CUDA backend lays
/// them out against the CPU kernels on the host.
///
/// Resize (nearest and linear, any rank) is separable: along each dim d, output index o reads
/// one input index (nearest) or two (linear), each with a weight. An output element is the
/// nested sum over the dims, outermost first,
///   y[o_0..o_{R-1}] = sum_{t_0} w_0 * ( sum_{t_1} w_1 * ( ... sum_{t_{R-1}} w_{R-1} * x[...] ))
/// which is the ONNX reference's dim-by-dim interpolation. The gradient has the same form with
/// the roles swapped: along each dim, input index i is read by the output indices whose taps
/// name it, with those taps' weights, so dx[i] is the nested sum of dy over its readers. One
/// function (`separable_sum`) computes both from a `SeparableTable`: per dim and per
/// destination coordinate, a list of (source offset, weight) entries.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::ops {

/// The highest rank the Resize kernels take (both backends; the CPU's check refuses more).
inline constexpr int kMaxResizeRank = 8;

/// Views into the tables of one separable sum (see `SeparableTableData` for the layout).
struct SeparableTable {
  int32_t rank = 0;
  const int64_t* dims = nullptr;   ///< rank: the destination's dims
  const int64_t* first = nullptr;  ///< rank: where dim d's bounds begin in `bounds`
  /// Per dim, dims[d] + 1 bounds: the entries of destination index c along dim d are
  /// [bounds[first[d] + c], bounds[first[d] + c + 1]).
  const int64_t* bounds = nullptr;
  const int64_t* offsets = nullptr;  ///< Per entry: the source offset along its dim (in elements).
  const float* weights = nullptr;    ///< Per entry: its weight.
};

/// Destination element e (row-major over `dims`): the nested sum, outermost dim first, of
/// weight times source over every combination of the dims' entries; 0 where a dim has none.
/// Each level starts from zero and adds its entries in table order, so every caller of the same
/// tables gets the same bits.
STAGECRAFT_HOST_DEVICE inline float separable_sum(const SeparableTable& t, const float* source,
                                                  int64_t e) {
  if (t.rank == 0) return source[0];
  int64_t begin[kMaxResizeRank], count[kMaxResizeRank], tap[kMaxResizeRank];
  float partial[kMaxResizeRank];
  for (int d = t.rank - 1; d >= 0; --d) {
    const int64_t c = e % t.dims[d];
    e /= t.dims[d];
    const int64_t* b = t.bounds + t.first[d] + c;
    begin[d] = b[0];
    count[d] = b[1] - b[0];
    if (count[d] == 0) return 0.0f;
    tap[d] = 0;
    partial[d] = 0.0f;
  }
  const int inner = t.rank - 1;
  for (;;) {
    int64_t offset = 0;
    for (int d = 0; d < t.rank; ++d) offset += t.offsets[begin[d] + tap[d]];
    // Add the leaf into the innermost level, then carry each completed level outwards.
    float value = source[offset];
    int d = inner;
    for (;;) {
      partial[d] += t.weights[begin[d] + tap[d]] * value;
      if (++tap[d] < count[d]) break;
      if (d == 0) return partial[0];
      value = partial[d];
      partial[d] = 0.0f;
      tap[d] = 0;
      --d;
    }
  }
}

/// One dim of a separable sum in host memory: per destination index c, the entries
/// [bounds[c], bounds[c + 1]) of `offsets` (source index times the source's stride along the
/// dim) and `weights`.
struct SeparableDim {
  std::vector<int64_t> bounds{0};
  std::vector<int64_t> offsets;
  std::vector<float> weights;

  /// Ends destination index c's entries (call once per index, in order).
  void close() { bounds.push_back(static_cast<int64_t>(offsets.size())); }
  void add(int64_t offset, float weight) {
    offsets.push_back(offset);
    weights.push_back(weight);
  }
};

/// The tables of one separable sum laid out as one int64 array and one float array (uploaded
/// to the device as they are), with the start of each section.
struct SeparableTableData {
  int32_t rank = 0;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  size_t dims = 0, first = 0, bounds = 0, offsets = 0;

  /// The views over `int_base` and `float_base`, copies of `ints` and `floats` (on the host or
  /// the device).
  SeparableTable at(const int64_t* int_base, const float* float_base) const {
    return {rank,      int_base + dims, int_base + first, int_base + bounds, int_base + offsets,
            float_base};
  }
};

/// The tables of `dims_of`, one `SeparableDim` per destination dim.
inline SeparableTableData separable_tables(const std::vector<SeparableDim>& dims_of) {
  SeparableTableData t;
  const size_t rank = dims_of.size();
  t.rank = static_cast<int32_t>(rank);
  std::vector<int64_t>& v = t.ints;
  t.dims = 0;
  for (const SeparableDim& d : dims_of) v.push_back(static_cast<int64_t>(d.bounds.size()) - 1);
  t.first = v.size();
  v.resize(v.size() + rank, 0);
  t.bounds = v.size();
  // Each dim's bounds are shifted to index the one array of entries.
  int64_t entries = 0;
  for (size_t d = 0; d < rank; ++d) {
    v[t.first + d] = static_cast<int64_t>(v.size() - t.bounds);
    for (int64_t b : dims_of[d].bounds) v.push_back(b + entries);
    entries += static_cast<int64_t>(dims_of[d].offsets.size());
  }
  t.offsets = v.size();
  for (const SeparableDim& d : dims_of) {
    v.insert(v.end(), d.offsets.begin(), d.offsets.end());
    t.floats.insert(t.floats.end(), d.weights.begin(), d.weights.end());
  }
  return t;
}

}  // namespace stagecraft::rt::ops
