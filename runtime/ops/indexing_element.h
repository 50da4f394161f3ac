#pragma once
/// \file
/// The arithmetic of Tile, CumSum, GatherElements and ScatterND and of their gradients, one
/// element (or one line) at a time, as plain inline functions that the host compiler builds for
/// the CPU backend (runtime/cpu/indexing.cpp) and nvcc for the CUDA one
/// (runtime/cuda/indexing_kernels.cu). Both backends call these on the same plain shapes and
/// tables, built by the same host code (indexing_shape.h), so they index alike and sum in the
/// same order. Nothing here includes a CUDA header; tests/gpu/cuda_indexing_element_test.cpp
/// checks the CPU kernels they give against straightforward references on the host.
///
/// Tile's gradient is a separable sum (resize_element.h): along each dim, input index i gathers
/// the output indices i, i + n, i + 2n, ...

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::ops {

/// The highest rank Tile and GatherElements take (both backends; the CPU's check refuses more).
inline constexpr int kMaxIndexingRank = 8;

/// A Tile node resolved: Y[c] = X[c mod x_dims], row-major, dims of both and X's strides.
struct TileShape {
  int32_t rank = 0;
  int64_t x_dims[kMaxIndexingRank] = {};
  int64_t y_dims[kMaxIndexingRank] = {};
  int64_t x_strides[kMaxIndexingRank] = {};
};

/// The offset in X of output element e.
STAGECRAFT_HOST_DEVICE inline int64_t tile_source(const TileShape& s, int64_t e) {
  int64_t offset = 0;
  for (int d = s.rank - 1; d >= 0; --d) {
    const int64_t c = e % s.y_dims[d];
    e /= s.y_dims[d];
    offset += (c % s.x_dims[d]) * s.x_strides[d];
  }
  return offset;
}

/// A CumSum node resolved: X viewed as [outer, length, inner] around the axis.
struct ScanShape {
  int64_t outer = 1, length = 1, inner = 1;
  bool exclusive = false, reverse = false;
  STAGECRAFT_HOST_DEVICE int64_t lines() const { return outer * inner; }
};

/// The type a running sum of T is kept in: T for floats; for integers the unsigned type of the
/// same width, so that overflow wraps (as two's complement hardware and the ONNX reference's
/// numpy do) instead of being undefined.
template <class T, bool = std::is_integral_v<T>>
struct ScanSumOf {
  using type = T;
};
template <class T>
struct ScanSumOf<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using ScanSum = typename ScanSumOf<T>::type;

/// The running sums of line `line` (one (outer, inner) pair) of X into Y, along the axis
/// forward or (reverse) backward, each output including its own element or (exclusive) not.
template <class T>
STAGECRAFT_HOST_DEVICE void scan_line(const ScanShape& s, const T* x, T* y, int64_t line) {
  const int64_t base = (line / s.inner) * s.length * s.inner + line % s.inner;
  ScanSum<T> sum = 0;
  for (int64_t k = 0; k < s.length; ++k) {
    const int64_t p = base + (s.reverse ? s.length - 1 - k : k) * s.inner;
    const ScanSum<T> v = static_cast<ScanSum<T>>(x[p]);
    if (s.exclusive) {
      y[p] = static_cast<T>(sum);
      sum = static_cast<ScanSum<T>>(sum + v);
    } else {
      sum = static_cast<ScanSum<T>>(sum + v);
      y[p] = static_cast<T>(sum);
    }
  }
}

/// A GatherElements node resolved: the output (and the indices) has `index_dims`, the data
/// `data_dims`; along `axis` output element c reads data index indices[c] (made non-negative
/// and checked on the host), elsewhere data index c.
struct GatherElementsShape {
  int32_t rank = 0;
  int32_t axis = 0;
  int64_t data_dims[kMaxIndexingRank] = {};
  int64_t data_strides[kMaxIndexingRank] = {};
  int64_t index_dims[kMaxIndexingRank] = {};
  int64_t index_strides[kMaxIndexingRank] = {};
};

/// The offset in the data of output element e.
STAGECRAFT_HOST_DEVICE inline int64_t gather_elements_source(const GatherElementsShape& s,
                                                             const int64_t* indices, int64_t e) {
  int64_t offset = 0, rest = e;
  for (int d = s.rank - 1; d >= 0; --d) {
    const int64_t c = rest % s.index_dims[d];
    rest /= s.index_dims[d];
    offset += (d == s.axis ? indices[e] : c) * s.data_strides[d];
  }
  return offset;
}

/// GatherElements' gradient at data element p: the sum of dy over the output elements that read
/// p, in ascending output order (along the axis; every other coordinate is p's own).
STAGECRAFT_HOST_DEVICE inline float gather_elements_grad_element(const GatherElementsShape& s,
                                                                 const int64_t* indices,
                                                                 const float* dy, int64_t p) {
  int64_t base = 0, target = 0;
  for (int d = s.rank - 1; d >= 0; --d) {
    const int64_t c = p % s.data_dims[d];
    p /= s.data_dims[d];
    if (d == s.axis) {
      target = c;
    } else {
      if (c >= s.index_dims[d]) return 0.0f;
      base += c * s.index_strides[d];
    }
  }
  float sum = 0.0f;
  const int64_t step = s.index_strides[s.axis];
  for (int64_t j = 0; j < s.index_dims[s.axis]; ++j)
    if (indices[base + j * step] == target) sum += dy[base + j * step];
  return sum;
}

/// ScatterND's reductions (opset 16's attribute; before, none).
enum class ScatterReduction : int32_t { kNone, kAdd, kMul };

/// A ScatterND node resolved on the host from its indices: the output is the data cut into
/// `slots` slices of `slice` elements (the dims the index tuples address, then the rest); each
/// update u (a slice of `slice` elements of the updates) goes to slot `update_slot[u]`. Per
/// slot, `slot_entry` is -1 (no update) or an entry whose updates, in the order ONNX applies
/// them, are `entry_updates[entry_bounds[entry] .. entry_bounds[entry + 1])`; `update_wins[u]`
/// is 1 for the last update of its slot (the one reduction none leaves).
struct ScatterPlan {
  ScatterReduction reduction = ScatterReduction::kNone;
  int64_t slice = 1;
  const int64_t* slot_entry = nullptr;
  const int64_t* entry_bounds = nullptr;
  const int64_t* entry_updates = nullptr;
  const int64_t* update_slot = nullptr;
  const int64_t* update_wins = nullptr;
};

/// Output element e of ScatterND: the data's element with every update of its slot applied in
/// order (replaced, added or multiplied; integer arithmetic wraps).
template <class T>
STAGECRAFT_HOST_DEVICE T scatter_nd_element(const ScatterPlan& p, const T* data, const T* updates,
                                            int64_t e) {
  const int64_t entry = p.slot_entry[e / p.slice];
  T v = data[e];
  if (entry < 0) return v;
  const int64_t j = e % p.slice;
  for (int64_t b = p.entry_bounds[entry]; b < p.entry_bounds[entry + 1]; ++b) {
    const T u = updates[p.entry_updates[b] * p.slice + j];
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      if (p.reduction == ScatterReduction::kAdd)
        v = static_cast<T>(static_cast<U>(static_cast<U>(v) + static_cast<U>(u)));
      else if (p.reduction == ScatterReduction::kMul)
        v = static_cast<T>(static_cast<U>(static_cast<U>(v) * static_cast<U>(u)));
      else
        v = u;
    } else {
      if (p.reduction == ScatterReduction::kAdd)
        v = v + u;
      else if (p.reduction == ScatterReduction::kMul)
        v = v * u;
      else
        v = u;
    }
  }
  return v;
}

/// ScatterND's gradient of the data at element e: dy where no update replaced the element
/// (every element for reduction add), else 0.
STAGECRAFT_HOST_DEVICE inline float scatter_nd_data_grad(const ScatterPlan& p, const float* dy,
                                                         int64_t e) {
  if (p.reduction == ScatterReduction::kAdd || p.slot_entry[e / p.slice] < 0) return dy[e];
  return 0.0f;
}

/// ScatterND's gradient of the updates at element e (update e / slice): dy at the element it
/// wrote, for the update that wins its slot (every update for reduction add), else 0.
STAGECRAFT_HOST_DEVICE inline float scatter_nd_updates_grad(const ScatterPlan& p, const float* dy,
                                                            int64_t e) {
  const int64_t u = e / p.slice;
  if (p.reduction != ScatterReduction::kAdd && p.update_wins[u] == 0) return 0.0f;
  return dy[p.update_slot[u] * p.slice + e % p.slice];
}

}  // namespace stagecraft::rt::ops
