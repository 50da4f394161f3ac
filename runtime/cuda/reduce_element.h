#pragma once
/// \file
/// What one thread of the CUDA reduction kernels computes (reduce_kernels.cu), as plain inline
/// functions that nvcc compiles for the device and the host compiler for tests: the kernels are
/// grid-stride loops around these, and tests/gpu/cuda_pad_reduce_element_test.cpp runs the same
/// functions on the host against the CPU backend's reductions, so the index arithmetic and the
/// arithmetic of every reduction and gradient are checked without a GPU. Nothing here includes a
/// CUDA header.
///
/// The loops are the CPU's (runtime/cpu/reduce.cpp): X's dims grouped by
/// ops::reduction_groups (unit dims dropped, neighbours of a kind merged), output o row-major
/// over the kept groups, its elements in ascending offset. Forward values accumulate as the CPU
/// accumulates them: float32 and float64 in double, int32 and int64 in int64, folded by
/// `reduce_fold`, so a one-thread-per-output kernel equals the CPU bit for bit and a
/// one-block-per-output kernel (a fixed tree of the same folds) differs only in the order of
/// double additions. The gradients follow the CPU's formulas in float, term for term.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/ops/reductions.h"

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::cuda {

using ops::Reduction;  // runtime/ops/reductions.h: host and device alike

/// The most dim groups a reduction handles (kept and reduced groups alternate, so this covers
/// every input of rank 16 or less).
inline constexpr int kMaxReduceGroups = 16;

/// A reduction's loops: X's dim groups innermost first, each with its size, its stride in X,
/// whether it is reduced and, for a kept group, its stride in Y.
struct ReduceGroups {
  int32_t count = 0;
  int64_t size[kMaxReduceGroups] = {};
  int64_t x_stride[kMaxReduceGroups] = {};
  int64_t y_stride[kMaxReduceGroups] = {};
  bool reduced[kMaxReduceGroups] = {};
  int64_t outputs = 1;  ///< the product of the kept groups
  int64_t length = 1;   ///< elements per output: the product of the reduced groups
};

/// The loops of `groups` (ops::reduction_groups: (size, reduced), innermost first); false when
/// there are more than kMaxReduceGroups.
inline bool reduce_groups(const std::vector<std::pair<int64_t, bool>>& groups, ReduceGroups& s) {
  if (groups.size() > static_cast<size_t>(kMaxReduceGroups)) return false;
  s = ReduceGroups{};
  int64_t x_stride = 1;
  for (const auto& [size, reduced] : groups) {
    const int32_t g = s.count++;
    s.size[g] = size;
    s.reduced[g] = reduced;
    s.x_stride[g] = x_stride;
    x_stride *= size;
    if (reduced) {
      s.length *= size;
    } else {
      s.y_stride[g] = s.outputs;
      s.outputs *= size;
    }
  }
  return true;
}

/// The offset in X of output o's first element.
STAGECRAFT_HOST_DEVICE inline int64_t reduce_base(const ReduceGroups& s, int64_t o) {
  int64_t base = 0;
  for (int g = 0; g < s.count; ++g)
    if (!s.reduced[g]) {
      base += (o % s.size[g]) * s.x_stride[g];
      o /= s.size[g];
    }
  return base;
}

/// The offset from its output's base of the r-th element reduced (ascending in r).
STAGECRAFT_HOST_DEVICE inline int64_t reduce_offset(const ReduceGroups& s, int64_t r) {
  int64_t offset = 0;
  for (int g = 0; g < s.count; ++g)
    if (s.reduced[g]) {
      offset += (r % s.size[g]) * s.x_stride[g];
      r /= s.size[g];
    }
  return offset;
}

/// The output that X's element i is reduced into.
STAGECRAFT_HOST_DEVICE inline int64_t reduce_output_of(const ReduceGroups& s, int64_t i) {
  int64_t o = 0;
  for (int g = 0; g < s.count; ++g) {
    if (!s.reduced[g]) o += (i % s.size[g]) * s.y_stride[g];
    i /= s.size[g];
  }
  return o;
}

/// How T accumulates: in double for floating types, in int64 for integers (the CPU's `Acc`).
template <class T>
using ReduceAcc = std::conditional_t<std::is_floating_point<T>::value, double, long long>;

template <class T>
STAGECRAFT_HOST_DEVICE bool reduce_is_nan(T v) {
  if constexpr (std::is_floating_point<T>::value)
    return v != v;
  else
    return false;
}

/// The lowest (or with `highest` the highest) value of T: -inf / +inf for floats. (Written out
/// because std::numeric_limits is host code to nvcc.)
template <class T>
STAGECRAFT_HOST_DEVICE ReduceAcc<T> reduce_limit(bool highest) {
  if constexpr (std::is_floating_point<T>::value)
    return highest ? static_cast<double>(INFINITY) : -static_cast<double>(INFINITY);
  else if constexpr (sizeof(T) == 4)
    return highest ? INT32_MAX : INT32_MIN;
  else
    return highest ? INT64_MAX : INT64_MIN;
}

/// The value a reduction starts from (and gives when empty): 0, 1, or the lowest / highest T
/// for Max / Min.
template <class T>
STAGECRAFT_HOST_DEVICE ReduceAcc<T> reduce_identity(Reduction kind) {
  using Acc = ReduceAcc<T>;
  if (kind == Reduction::kProd) return Acc(1);
  if (kind == Reduction::kMax) return reduce_limit<T>(false);
  if (kind == Reduction::kMin) return reduce_limit<T>(true);
  return Acc(0);
}

/// What element v adds to the accumulator: |v|, v * v, exp(v - shift) (LogSumExp's shifted
/// term), or v itself.
template <class T>
STAGECRAFT_HOST_DEVICE ReduceAcc<T> reduce_term(Reduction kind, T v, double shift) {
  using Acc = ReduceAcc<T>;
  switch (kind) {
    case Reduction::kL1:
      return static_cast<Acc>(v < T(0) ? -v : v);
    case Reduction::kSumSquare:
      return static_cast<Acc>(v) * static_cast<Acc>(v);
    case Reduction::kL2:
      return static_cast<Acc>(static_cast<double>(v) * static_cast<double>(v));
    case Reduction::kLogSum:
      return static_cast<Acc>(static_cast<double>(v));
    case Reduction::kLogSumExp:
      return static_cast<Acc>(::exp(static_cast<double>(v) - shift));
    default:
      return static_cast<Acc>(v);
  }
}

/// Two partial results combined (or an accumulator and a term): multiplied for Prod, the larger
/// or smaller for Max and Min (a NaN wins and stays), else added.
template <class Acc>
STAGECRAFT_HOST_DEVICE Acc reduce_fold(Reduction kind, Acc a, Acc b) {
  switch (kind) {
    case Reduction::kProd:
      return a * b;
    case Reduction::kMax:
      if (reduce_is_nan(a)) return a;
      if (reduce_is_nan(b)) return b;
      return b > a ? b : a;
    case Reduction::kMin:
      if (reduce_is_nan(a)) return a;
      if (reduce_is_nan(b)) return b;
      return b < a ? b : a;
    default:
      return a + b;
  }
}

/// LogSumExp's shift folded: the larger of `top` and v, a NaN v ignored (std::max(top, v)).
STAGECRAFT_HOST_DEVICE inline double reduce_top(double top, double v) { return top < v ? v : top; }

/// The shift LogSumExp subtracts, from the largest element `top`: 0 where it is not finite
/// (all -inf, an +inf, or none).
STAGECRAFT_HOST_DEVICE inline double reduce_shift(double top) {
  const double inf = static_cast<double>(INFINITY);
  return top > -inf && top < inf ? top : 0.0;
}

/// The output from the accumulator: log for LogSum, log plus the shift for LogSumExp, sqrt for
/// L2, else the accumulator in T.
template <class T>
STAGECRAFT_HOST_DEVICE T reduce_finish(Reduction kind, ReduceAcc<T> acc, double shift) {
  switch (kind) {
    case Reduction::kLogSum:
      return static_cast<T>(::log(static_cast<double>(acc)));
    case Reduction::kLogSumExp:
      return static_cast<T>(::log(static_cast<double>(acc)) + shift);
    case Reduction::kL2:
      return static_cast<T>(::sqrt(static_cast<double>(acc)));
    default:
      return static_cast<T>(acc);
  }
}

/// Output o computed alone, its elements folded in ascending order (the CPU's loop).
template <class T>
STAGECRAFT_HOST_DEVICE T reduce_output(Reduction kind, const ReduceGroups& s, const T* x,
                                       int64_t o) {
  const T* base = x + reduce_base(s, o);
  double shift = 0.0;
  if (kind == Reduction::kLogSumExp) {
    double top = -static_cast<double>(INFINITY);
    for (int64_t r = 0; r < s.length; ++r)
      top = reduce_top(top, static_cast<double>(base[reduce_offset(s, r)]));
    shift = reduce_shift(top);
  }
  ReduceAcc<T> acc = reduce_identity<T>(kind);
  for (int64_t r = 0; r < s.length; ++r)
    acc = reduce_fold(kind, acc, reduce_term(kind, base[reduce_offset(s, r)], shift));
  return reduce_finish<T>(kind, acc, shift);
}

/// Whether x is one of Max's or Min's results y (NaN matches NaN).
STAGECRAFT_HOST_DEVICE inline bool reduce_hit(float x, float y) {
  return x == y || (reduce_is_nan(x) && reduce_is_nan(y));
}

/// Max's or Min's gradient share of output o: dy split evenly between the elements equal to y
/// (0 when none is).
STAGECRAFT_HOST_DEVICE inline float reduce_tie_share(const ReduceGroups& s, const float* x, float y,
                                                     float dy, int64_t o) {
  const float* base = x + reduce_base(s, o);
  int64_t ties = 0;
  for (int64_t r = 0; r < s.length; ++r) ties += reduce_hit(base[reduce_offset(s, r)], y) ? 1 : 0;
  return ties == 0 ? 0.0f : dy / static_cast<float>(ties);
}

/// The gradient of one element x of X, whose output has the value y and the gradient dy, for
/// every reduction but Prod; `share` is Max's and Min's reduce_tie_share of that output.
STAGECRAFT_HOST_DEVICE inline float reduce_grad_element(Reduction kind, float x, float y, float dy,
                                                        float share) {
  switch (kind) {
    case Reduction::kSum:
      return dy;
    case Reduction::kL2:
      return y == 0.0f ? 0.0f : dy * x / y;
    case Reduction::kL1:
      return x > 0.0f ? dy : (x < 0.0f ? -dy : 0.0f);
    case Reduction::kSumSquare:
      return 2.0f * x * dy;
    case Reduction::kLogSum:
      return dy * ::expf(-y);
    case Reduction::kLogSumExp:
      return dy * ::expf(x - y);
    case Reduction::kMax:
    case Reduction::kMin:
      return reduce_hit(x, y) ? share : 0.0f;
    case Reduction::kProd:
      break;
  }
  return 0.0f;
}

/// ReduceProd's gradient of output o's elements, written to dx: dy times the product of the
/// other elements, without division (exact at zeros), as the CPU forms it: the product before
/// each element (in double, stored in float), then times the product after it and dy.
STAGECRAFT_HOST_DEVICE inline void reduce_prod_grad_output(const ReduceGroups& s, const float* x,
                                                           float dy, float* dx, int64_t o) {
  const int64_t base = reduce_base(s, o);
  double before = 1.0, after = 1.0;
  for (int64_t r = 0; r < s.length; ++r) {
    const int64_t at = base + reduce_offset(s, r);
    dx[at] = static_cast<float>(before);
    before *= x[at];
  }
  for (int64_t r = s.length - 1; r >= 0; --r) {
    const int64_t at = base + reduce_offset(s, r);
    dx[at] = static_cast<float>(static_cast<double>(dx[at]) * after * dy);
    after *= x[at];
  }
}

}  // namespace stagecraft::rt::cuda
