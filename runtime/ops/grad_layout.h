#pragma once
/// \file
/// The operand rules of the layout gradients that both backends share (runtime/cpu/grad_data.cpp
/// and runtime/cuda/grad_data.cpp): Transpose's inverse permutation, Concat's pieces of dY and
/// Split's piece sizes. A refusal is one line naming the op and the numbers.

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/layout.h"

namespace stagecraft::rt::ops {

/// Transpose's gradient: dX at X-coordinate c is dY at the coordinate whose dim d is c[perm[d]].
/// The strides (one per dim of X) at which dX reads the dense dY; `perm` (default: reversed)
/// and dY's shape checked.
inline std::vector<int64_t> transpose_grad_strides(const KernelArgs& a, const Tensor& x,
                                                   const Tensor& dy) {
  const std::vector<int64_t> perm = transpose_perm(a, x.rank());
  Shape y_shape;
  std::vector<int64_t> inverse(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) {
    inverse[static_cast<size_t>(perm[d])] = static_cast<int64_t>(d);
    y_shape.push_back(x.shape[static_cast<size_t>(perm[d])]);
  }
  expect_dy_shape(a, dy, y_shape);
  const std::vector<int64_t> dy_strides = dense_strides(y_shape);
  std::vector<int64_t> strides(perm.size());
  for (size_t e = 0; e < perm.size(); ++e) strides[e] = dy_strides[inverse[e]];
  return strides;
}

/// Concat's gradient: dY [rows, joined, inner] (the dims before the axis, the axis, the dims
/// after it) holds input k's piece at element `starts[k]` of each row, `sizes[k]` elements long.
struct ConcatPieces {
  int64_t axis = 0, rows = 1, inner = 1;
  int64_t row = 0;  ///< Elements of one row of dY: the joined axis times `inner`.
  std::vector<int64_t> starts, sizes;
};

/// The pieces of ConcatGrad node `a`'s dY (read through `io`), the inputs' ranks, the gradients
/// asked for and dY's shape checked.
inline ConcatPieces concat_grad_pieces(const KernelArgs& a, const GradIo& io, const Tensor& dy) {
  const Tensor& first = io.need_x(0);
  ConcatPieces p;
  p.axis = normalize_axis(a, a.attrs.required_i("axis"), first.rank());
  Shape y_shape = first.shape;
  y_shape[p.axis] = 0;
  for (int64_t d = 0; d < p.axis; ++d) p.rows *= first.shape[d];
  for (int64_t d = p.axis + 1; d < first.rank(); ++d) p.inner *= first.shape[d];
  for (size_t k = 0; k < io.n; ++k) {
    const Tensor& x = io.need_x(k);
    if (x.rank() != first.rank())
      fail(ErrorKind::kShape, "Concat of {} and {}: the ranks differ", first.describe(),
           x.describe());
    p.starts.push_back(y_shape[p.axis] * p.inner);
    p.sizes.push_back(x.shape[p.axis] * p.inner);
    y_shape[p.axis] += x.shape[p.axis];
    if (io.dx(k) != nullptr) expect_shape(a, k, x.shape);
  }
  expect_dy_shape(a, dy, y_shape);
  p.row = y_shape[p.axis] * p.inner;
  return p;
}

/// Split's piece sizes along `axis` (`dim` long) for `n` outputs: `given` (the `split`
/// attribute or input), or, when empty, equal pieces of ceil(dim / n) with the last ones
/// smaller; refused where they are not n or do not add up to `dim`.
inline std::vector<int64_t> split_sizes(std::vector<int64_t> given, int64_t n, int64_t dim,
                                        int64_t axis) {
  if (given.empty()) {
    const int64_t piece = (dim + n - 1) / n;
    for (int64_t k = 0; k < n; ++k)
      given.push_back(std::max<int64_t>(0, std::min(piece, dim - k * piece)));
  }
  if (static_cast<int64_t>(given.size()) != n)
    fail(ErrorKind::kModel, "Split lists {} sizes for {} outputs", given.size(), n);
  if (std::accumulate(given.begin(), given.end(), int64_t{0}) != dim)
    fail(ErrorKind::kModel, "Split sizes do not add up to axis {}'s {}", axis, dim);
  return given;
}

}  // namespace stagecraft::rt::ops
