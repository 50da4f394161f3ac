#pragma once
/// \file
/// The reductions' host-side rules (ReduceSum, Max, Min, Prod, L1, L2, SumSquare, LogSum,
/// LogSumExp), shared by the CPU kernels (runtime/cpu/reduce.cpp) and the CUDA ones
/// (runtime/cuda/reduce.cpp): which reduction an op is, which dims a node reduces and the
/// shape it gives, and the reduction's loops as groups of merged dims. Both backends read a node
/// through these, so they reduce and refuse alike.

#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/reductions.h"

namespace stagecraft::rt::ops {


/// The reduction of op `op_type` (forward or gradient: "ReduceL2" and "ReduceL2Grad" alike).
inline Reduction reduction_of(std::string_view op_type) {
  if (op_type.starts_with("ReduceSumSquare")) return Reduction::kSumSquare;
  if (op_type.starts_with("ReduceSum")) return Reduction::kSum;
  if (op_type.starts_with("ReduceL1")) return Reduction::kL1;
  if (op_type.starts_with("ReduceLogSumExp")) return Reduction::kLogSumExp;
  if (op_type.starts_with("ReduceLogSum")) return Reduction::kLogSum;
  if (op_type.starts_with("ReduceMax")) return Reduction::kMax;
  if (op_type.starts_with("ReduceMin")) return Reduction::kMin;
  if (op_type.starts_with("ReduceProd")) return Reduction::kProd;
  return Reduction::kL2;
}

/// Whether the reduction's gradient reads the forward output Y (Max, Min, L2, LogSum,
/// LogSumExp); the others need only X and dY.
inline bool gradient_reads_y(Reduction kind) {
  return kind != Reduction::kSum && kind != Reduction::kProd && kind != Reduction::kL1 &&
         kind != Reduction::kSumSquare;
}

/// Which dims of X a reduction node reduces, and the shape of its output.
struct ReducedDims {
  std::vector<bool> reduced;
  Shape y_shape;
};

/// The dims a node reduces: the attribute `axes`, else operand 1 (`axes_input`, in host memory;
/// null when omitted); no axes reduce every dim, or none with noop_with_empty_axes; keepdims
/// (default 1) keeps the reduced dims as 1s. An axis out of range or given twice is a model
/// error.
inline ReducedDims reduced_dims(const KernelArgs& a, const Shape& x_shape,
                                const Tensor* axes_input) {
  const int64_t rank = static_cast<int64_t>(x_shape.size());
  std::vector<int64_t> axes = a.attrs.ints("axes");
  if (!a.attrs.has("axes") && axes_input != nullptr) axes = read_ints(a, *axes_input, 1);
  const bool noop = axes.empty() && a.attrs.i("noop_with_empty_axes", 0) != 0;
  ReducedDims r{std::vector<bool>(x_shape.size(), axes.empty() && !noop), {}};
  std::vector<bool> listed(x_shape.size(), false);
  for (int64_t axis : axes) {
    const int64_t d = normalize_axis(a, axis, rank);
    if (listed[d])
      fail(ErrorKind::kModel, "{} '{}': axis {} is given twice", a.op_type, a.name, axis);
    listed[d] = r.reduced[d] = true;
  }
  const bool keepdims = a.attrs.i("keepdims", 1) != 0;
  for (int64_t d = 0; d < rank; ++d) {
    if (!r.reduced[d])
      r.y_shape.push_back(x_shape[d]);
    else if (keepdims)
      r.y_shape.push_back(1);
  }
  return r;
}

/// X's dims as (size, reduced) groups, innermost first: unit dims dropped, neighbours both kept
/// or both reduced merged. Output element o (row-major over the kept groups, which is Y's order
/// with or without keepdims) reduces the elements of the reduced groups, in ascending offset.
inline std::vector<std::pair<int64_t, bool>> reduction_groups(const Shape& shape,
                                                              const std::vector<bool>& reduced) {
  std::vector<std::pair<int64_t, bool>> groups;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (!groups.empty() && groups.back().second == reduced[i])
      groups.back().first *= shape[i];
    else
      groups.emplace_back(shape[i], reduced[i]);
  }
  return groups;
}

/// ReduceMean (opsets <= 17) and its gradient resolved against X's shape: the dims it reduces,
/// its output's shape, X's shape with the reduced dims as 1, and the count each mean divides by.
struct MeanRule {
  std::vector<bool> reduced;
  Shape y_shape;     ///< The output: the kept dims, and the reduced ones as 1 when keepdims.
  Shape kept_shape;  ///< X's shape with every reduced dim 1.
  int64_t count = 1;
};

/// `axes` (the attribute, or the gradient's operand read to the host; empty: every dim, or none
/// with noop_with_empty_axes) and keepdims (default 1) of node `a` against `x_shape`.
/// `Error(kModel)` for an axis out of range or given twice.
inline MeanRule mean_rule(const KernelArgs& a, const Shape& x_shape,
                          const std::vector<int64_t>& axes) {
  MeanRule r;
  const auto rank = static_cast<int64_t>(x_shape.size());
  r.reduced.assign(x_shape.size(),
                   axes.empty() && a.attrs.i("noop_with_empty_axes", 0) == 0);
  std::vector<bool> listed(x_shape.size(), false);
  for (int64_t axis : axes) {
    const int64_t d = normalize_axis(a, axis, rank);
    if (listed[d]) fail(ErrorKind::kModel, "ReduceMean: axis {} is given twice", axis);
    listed[d] = r.reduced[d] = true;
  }
  const bool keepdims = a.attrs.i("keepdims", 1) != 0;
  for (size_t i = 0; i < x_shape.size(); ++i) {
    if (r.reduced[i]) r.count *= x_shape[i];
    r.kept_shape.push_back(r.reduced[i] ? 1 : x_shape[i]);
    if (!r.reduced[i] || keepdims) r.y_shape.push_back(r.kept_shape.back());
  }
  return r;
}

}  // namespace stagecraft::rt::ops
