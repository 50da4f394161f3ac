#pragma once
/// \file
/// The operand shapes of MatMul (numpy semantics) and Gemm, read once for the CPU and CUDA
/// backends' kernels and their gradients, so every backend accepts and refuses the same shapes
/// with the same words.

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <utility>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::ops {

/// A numpy matmul of X [..., m, k] and Y [..., k, n]: a 1-D X is the row [1, k] and a 1-D Y
/// the column [k, 1], and the batch dims (all but the last two, the shorter operand padded
/// with leading 1s) broadcast.
struct MatMulShape {
  int64_t m = 0, k = 0, n = 0;
  /// The batch dims with those that are 1 everywhere dropped and neighbours along which both
  /// operands broadcast alike merged: the product's (`batch`) and each operand's (`batch_a`,
  /// `batch_b`, of the same rank: a dim is the product's where the operand has it and 1 where
  /// it is broadcast). X's bytes are the dense [batch_a..., m, k], Y's [batch_b..., k, n] and
  /// the product's [batch..., m, n].
  Shape batch_a, batch_b, batch;
  /// The output shape ONNX records: the broadcast batch dims, then m unless X is 1-D and n
  /// unless Y is 1-D.
  Shape out;

  /// The number of matrices in the product (1 without batch dims).
  int64_t batch_count() const {
    int64_t count = 1;
    for (int64_t d : batch) count *= d;
    return count;
  }
};

/// The shapes of `op` (the op type, for messages) of `x` and `y`. Throws `Error(kShape)` when an
/// operand is a scalar, the inner dims differ or the batch dims do not broadcast.
inline MatMulShape matmul_shape(std::string_view op, const Tensor& x, const Tensor& y) {
  if (x.rank() == 0 || y.rank() == 0)
    fail(ErrorKind::kShape, "{} of {} and {}: operands must have rank 1 or more", op, x.describe(),
         y.describe());
  Shape sa = x.rank() == 1 ? Shape{1, x.shape[0]} : x.shape;
  Shape sb = y.rank() == 1 ? Shape{y.shape[0], 1} : y.shape;
  const size_t rank = std::max(sa.size(), sb.size());
  sa.insert(sa.begin(), rank - sa.size(), 1);
  sb.insert(sb.begin(), rank - sb.size(), 1);
  MatMulShape s;
  s.m = sa[rank - 2];
  s.k = sa[rank - 1];
  s.n = sb[rank - 1];
  if (sb[rank - 2] != s.k)
    fail(ErrorKind::kShape, "{} of {} and {}: inner dims {} and {} differ", op, x.describe(),
         y.describe(), s.k, sb[rank - 2]);
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (sa[i] != sb[i] && sa[i] != 1 && sb[i] != 1)
      fail(ErrorKind::kShape, "{} of {} and {}: batch dims {} and {} do not broadcast", op,
           x.describe(), y.describe(), sa[i], sb[i]);
    const int64_t d = sa[i] == 1 ? sb[i] : sa[i];
    s.out.push_back(d);
    if (d == 1) continue;
    const bool same_pattern = !s.batch.empty() && (s.batch_a.back() == 1) == (sa[i] == 1) &&
                              (s.batch_b.back() == 1) == (sb[i] == 1);
    if (same_pattern) {
      s.batch_a.back() *= sa[i];
      s.batch_b.back() *= sb[i];
      s.batch.back() *= d;
    } else {
      s.batch_a.push_back(sa[i]);
      s.batch_b.push_back(sb[i]);
      s.batch.push_back(d);
    }
  }
  if (x.rank() > 1) s.out.push_back(s.m);
  if (y.rank() > 1) s.out.push_back(s.n);
  return s;
}

/// Gemm's Y = alpha * A' x B' + beta * C with A' = transA ? A^T : A (likewise B'), A' [m, k]
/// and B' [k, n].
struct GemmShape {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, k = 0, n = 0;
};

/// The shapes of `op` (for messages) of the matrices `x` and `y` under `attrs`' transA and
/// transB. Throws `Error(kShape)` when an operand is not a matrix or the inner dims differ.
inline GemmShape gemm_shape(std::string_view op, const Tensor& x, const Tensor& y,
                            const Attrs& attrs) {
  if (x.rank() != 2 || y.rank() != 2)
    fail(ErrorKind::kShape, "{} of {} and {}: A and B must be matrices", op, x.describe(),
         y.describe());
  GemmShape g;
  g.trans_a = attrs.i("transA", 0) != 0;
  g.trans_b = attrs.i("transB", 0) != 0;
  g.m = g.trans_a ? x.shape[1] : x.shape[0];
  g.k = g.trans_a ? x.shape[0] : x.shape[1];
  g.n = g.trans_b ? y.shape[0] : y.shape[1];
  const int64_t kb = g.trans_b ? y.shape[1] : y.shape[0];
  if (g.k != kb)
    fail(ErrorKind::kShape, "{} of {} and {} (transA={}, transB={}): inner dims {} and {} differ",
         op, x.describe(), y.describe(), int(g.trans_a), int(g.trans_b), g.k, kb);
  return g;
}

/// The rows and columns of Gemm's C ([], [n], [1], [m, n], [1, n], [m, 1] or [1, 1]) as it is
/// broadcast to [m, n]: each is 1 or the product's. Throws `Error(kShape)` naming `op` when C
/// does not broadcast.
inline std::pair<int64_t, int64_t> gemm_c_dims(std::string_view op, const Tensor& c, int64_t m,
                                               int64_t n) {
  const Shape& sc = c.shape;
  const int64_t cm = sc.size() == 2 ? sc[0] : 1, cn = sc.empty() ? 1 : sc.back();
  if (sc.size() > 2 || (cm != 1 && cm != m) || (cn != 1 && cn != n))
    fail(ErrorKind::kShape, "{}: C {} does not broadcast to [{}, {}]", op, c.describe(), m, n);
  return {cm, cn};
}

}  // namespace stagecraft::rt::ops
