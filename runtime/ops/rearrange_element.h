#pragma once
/// \file
/// The index arithmetic of DepthToSpace, SpaceToDepth and TopK and of their gradients, as plain
/// inline functions the host compiler builds for the CPU backend (runtime/cpu/rearrange.cpp)
/// and nvcc for the CUDA one, on the plain shapes rearrange_shape.h builds. Nothing here
/// includes a CUDA header.
///
/// DepthToSpace and SpaceToDepth move elements between a "deep" tensor D [N, C*b*b, H, W] and a
/// "spatial" one S [N, C, H*b, W*b] (b the blocksize): S[n, c, y, x] is D[n, ch, y/b, x/b] where,
/// with i = y mod b and j = x mod b, ch = (i*b + j)*C + c (mode DCR, SpaceToDepth's only order)
/// or c*b*b + i*b + j (mode CRD). The map is a bijection, so every kernel and gradient is one
/// walk over S's elements: DepthToSpace gathers S from D, SpaceToDepth scatters S into D, and
/// each one's gradient is the other's move.

#include <cstdint>

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::ops {

/// A DepthToSpace or SpaceToDepth node resolved: S's dims [n, c, h*b, w*b] and D's [n, c*b*b,
/// h, w], the blocksize b and the channel order.
struct SpaceDepthShape {
  int64_t n = 0, c = 0, h = 0, w = 0, b = 1;
  bool crd = false;  ///< DepthToSpace's mode CRD; false for DCR.
  STAGECRAFT_HOST_DEVICE int64_t numel() const { return n * c * h * b * w * b; }
};

/// The offset in D of S's element `s` (row-major offsets in both).
STAGECRAFT_HOST_DEVICE inline int64_t space_to_deep(const SpaceDepthShape& p, int64_t s) {
  const int64_t wide = p.w * p.b, high = p.h * p.b;
  const int64_t x = s % wide;
  s /= wide;
  const int64_t y = s % high;
  s /= high;
  const int64_t c = s % p.c;
  const int64_t n = s / p.c;
  const int64_t i = y % p.b, j = x % p.b;
  const int64_t ch = p.crd ? (c * p.b + i) * p.b + j : (i * p.b + j) * p.c + c;
  return ((n * p.c * p.b * p.b + ch) * p.h + y / p.b) * p.w + x / p.b;
}

/// A TopK node resolved: X viewed as [outer, length, inner] around the axis; K of the `length`
/// elements of each line, the largest (or smallest) first.
struct TopKShape {
  int64_t outer = 1, length = 1, inner = 1, k = 0;
  int64_t axis = 0;  ///< The axis, non-negative.
  bool largest = true, sorted = true;
  STAGECRAFT_HOST_DEVICE int64_t lines() const { return outer * inner; }
};

/// Whether element (a, ia) comes before (b, ib) in TopK's output: the larger (or smaller) value
/// first, equal values in index order (ONNX's rule: the lower index first). NaN counts as
/// larger than every number, as in numpy's sort.
template <class T>
STAGECRAFT_HOST_DEVICE inline bool topk_before(T a, int64_t ia, T b, int64_t ib, bool largest) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan || b_nan) {
    if (a_nan && b_nan) return ia < ib;
    return largest ? a_nan : b_nan;
  }
  if (a != b) return largest ? a > b : a < b;
  return ia < ib;
}

/// The offset in X (and in dX) of element `e` of line `line`.
STAGECRAFT_HOST_DEVICE inline int64_t topk_offset(const TopKShape& p, int64_t line, int64_t e) {
  const int64_t o = line / p.inner, in = line % p.inner;
  return (o * p.length + e) * p.inner + in;
}

/// ArgMax (`p.largest`) or ArgMin of line `line` of X: TopK's first index (the lower index
/// among equal values, NaN larger than every number), or with `last` (select_last_index) the
/// higher one among equal values. Line `line` is also the output's offset.
template <class T>
STAGECRAFT_HOST_DEVICE inline int64_t arg_of_line(const T* x, const TopKShape& p, int64_t line,
                                                  bool last) {
  int64_t best = 0;
  T best_value = x[topk_offset(p, line, 0)];
  for (int64_t e = 1; e < p.length; ++e) {
    const T v = x[topk_offset(p, line, e)];
    // Negated indices turn TopK's "lower index first" into "higher index first".
    if (topk_before(v, last ? -e : e, best_value, last ? -best : best, p.largest)) {
      best = e;
      best_value = v;
    }
  }
  return best;
}

/// The offset in Values and Indices of rank `r` (0 .. k-1) of line `line`.
STAGECRAFT_HOST_DEVICE inline int64_t topk_out_offset(const TopKShape& p, int64_t line, int64_t r) {
  const int64_t o = line / p.inner, in = line % p.inner;
  return (o * p.k + r) * p.inner + in;
}

}  // namespace stagecraft::rt::ops
