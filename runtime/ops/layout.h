#pragma once
/// \file
/// Index arithmetic the layout ops and their gradients share: row-major strides, axis
/// normalisation, integer operand reading, and the strided view a Slice selects.

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/trilu_element.h"

namespace stagecraft::rt::ops {

/// Row-major element strides of `shape`.
inline std::vector<int64_t> dense_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

/// `axis` in [-rank, rank) (or [-rank, rank] with `inclusive`) made non-negative.
inline int64_t normalize_axis(const KernelArgs& a, int64_t axis, int64_t rank,
                              bool inclusive = false) {
  if (axis < -rank || axis > (inclusive ? rank : rank - 1))
    fail(ErrorKind::kModel, "{} axis {} is out of range for rank {}", a.op_type, axis, rank);
  return axis < 0 ? axis + rank : axis;
}

/// Transpose's `perm` for an input of `rank` (default: the dims reversed), each entry made
/// non-negative; refused unless it names every dim once.
inline std::vector<int64_t> transpose_perm(const KernelArgs& a, int64_t rank) {
  std::vector<int64_t> perm = a.attrs.ints("perm");
  if (perm.empty()) {
    perm.resize(static_cast<size_t>(rank));
    std::iota(perm.rbegin(), perm.rend(), 0);
  }
  if (static_cast<int64_t>(perm.size()) != rank)
    fail(ErrorKind::kModel, "Transpose perm has {} entries for a rank-{} input", perm.size(),
         rank);
  std::vector<bool> seen(perm.size(), false);
  for (int64_t& p : perm) {
    const int64_t given = p;
    p = normalize_axis(a, p, rank);
    if (seen[static_cast<size_t>(p)])
      fail(ErrorKind::kModel, "Transpose perm lists axis {} twice", given);
    seen[static_cast<size_t>(p)] = true;
  }
  return perm;
}

/// Gather's output shape: data's dims before `axis`, the indices' shape, data's dims after it.
inline Shape gather_shape(const Shape& data, const Shape& indices, int64_t axis) {
  Shape out(data.begin(), data.begin() + axis);
  out.insert(out.end(), indices.begin(), indices.end());
  out.insert(out.end(), data.begin() + axis + 1, data.end());
  return out;
}

/// Gather's indices along axis `axis` of `dim` elements made non-negative; one outside
/// [-dim, dim) is refused.
inline std::vector<int64_t> gather_indices_in_range(std::vector<int64_t> indices, int64_t axis,
                                                    int64_t dim) {
  for (int64_t& index : indices) {
    if (index < -dim || index >= dim)
      fail(ErrorKind::kModel, "Gather index {} is out of range for axis {} of size {}", index, axis,
           dim);
    if (index < 0) index += dim;
  }
  return indices;
}

/// GatherGrad's padding rows (grad::kPaddingRowsAttr: entries of the gathered axis that get no
/// gradient, nn.Embedding's padding_idx) as a mask over the axis's `dim` entries, 1 for each;
/// empty when the node has none. A row outside [0, dim) is refused, naming the node.
inline std::vector<uint8_t> padding_row_mask(const KernelArgs& a, int64_t dim) {
  const std::vector<int64_t> rows = a.attrs.ints(grad::kPaddingRowsAttr);
  if (rows.empty()) return {};
  std::vector<uint8_t> mask(static_cast<size_t>(dim), 0);
  for (int64_t row : rows) {
    if (row < 0 || row >= dim)
      fail(ErrorKind::kModel, "{} '{}': padding row {} is outside the table's {} rows", a.op_type,
           a.name, row, dim);
    mask[static_cast<size_t>(row)] = 1;
  }
  return mask;
}

/// True when Dropout's scalar input `what` (ratio or training_mode: float32, float64 or bool) is
/// nonzero; the forward kernel and its gradient read them alike.
inline bool scalar_is_nonzero(const Tensor& t, std::string_view what) {
  if (t.numel() != 1)
    fail(ErrorKind::kShape, "Dropout's {} must be a scalar, not {}", what, shape_string(t.shape));
  switch (t.dtype) {
    case DType::kFloat32:
      return t.as<float>()[0] != 0;
    case DType::kFloat64:
      return t.as<double>()[0] != 0;
    case DType::kBool:
      return t.as<uint8_t>()[0] != 0;
    default:
      fail(ErrorKind::kUnsupported, "Dropout's {} of type {} is not supported", what,
           dtype_name(t.dtype));
  }
}

/// Dropout's ratio input (float32 or float64 scalar), checked to lie in [0, 1) as ONNX says.
inline float dropout_ratio(const Tensor& t) {
  if (t.numel() != 1)
    fail(ErrorKind::kShape, "Dropout's ratio must be a scalar, not {}", shape_string(t.shape));
  double r = 0;
  if (t.dtype == DType::kFloat32)
    r = t.as<float>()[0];
  else if (t.dtype == DType::kFloat64)
    r = t.as<double>()[0];
  else
    fail(ErrorKind::kUnsupported, "Dropout's ratio of type {} is not supported",
         dtype_name(t.dtype));
  if (!(r >= 0 && r < 1)) fail(ErrorKind::kModel, "Dropout's ratio {} is outside [0, 1)", r);
  return static_cast<float>(r);
}

/// Dropout in training mode, on either backend: float32 data and, when the node has output 1,
/// a bool mask (its shape is the caller's expect_shape).
inline void check_dropout_training(const Tensor& x, const Tensor* mask) {
  if (x.dtype != DType::kFloat32)
    fail(ErrorKind::kUnsupported, "Dropout in training mode on {} is not supported (float32 only)",
         dtype_name(x.dtype));
  if (mask != nullptr && mask->dtype != DType::kBool)
    fail(ErrorKind::kUnsupported, "Dropout in training mode with a {} mask is not supported",
         dtype_name(mask->dtype));
}

/// DropoutGrad in training mode, on either backend: the forward's bool mask (Dropout's output
/// 1) of dx's shape, and float32 gradients.
inline void check_dropout_grad(const Tensor* mask, const Tensor& dx) {
  if (mask == nullptr || mask->dtype != DType::kBool || mask->shape != dx.shape)
    fail(ErrorKind::kModel,
         "DropoutGrad in training mode needs the forward's bool mask (Dropout's output 1) of "
         "shape {}",
         shape_string(dx.shape));
  if (dx.dtype != DType::kFloat32)
    fail(ErrorKind::kUnsupported,
         "DropoutGrad in training mode on {} is not supported (float32 only)",
         dtype_name(dx.dtype));
}

/// A reduction over merged dims: `groups` are (size, reduced) innermost first, neighbours of the
/// same kind merged, size-1 dims dropped. Kept and reduced groups with their strides in the
/// dense input, and the offset of every reduced element relative to a base, ascending.
struct ReductionLayout {
  std::vector<int64_t> kept_dims, kept_strides, red_dims, red_strides, offsets{0};

  explicit ReductionLayout(const std::vector<std::pair<int64_t, bool>>& groups) {
    int64_t stride = 1;
    for (const auto& [size, reduced] : groups) {
      (reduced ? red_dims : kept_dims).push_back(size);
      (reduced ? red_strides : kept_strides).push_back(stride);
      stride *= size;
    }
    for (size_t g = 0; g < red_dims.size(); ++g) {
      std::vector<int64_t> next;
      next.reserve(offsets.size() * red_dims[g]);
      for (int64_t j = 0; j < red_dims[g]; ++j)
        for (int64_t o : offsets) next.push_back(o + j * red_strides[g]);
      offsets = std::move(next);
    }
  }
};

/// The values of `t`, operand `k` of the op, which must be int32 or int64.
inline std::vector<int64_t> read_ints(const KernelArgs& a, const Tensor& t, size_t k) {
  const int64_t n = t.numel();
  std::vector<int64_t> values(static_cast<size_t>(n));
  if (t.dtype == DType::kInt64) {
    for (int64_t i = 0; i < n; ++i) values[i] = t.as<int64_t>()[i];
  } else if (t.dtype == DType::kInt32) {
    for (int64_t i = 0; i < n; ++i) values[i] = t.as<int32_t>()[i];
  } else {
    fail(ErrorKind::kModel, "{} input {} is {}, expected int32 or int64", a.op_type, k,
         dtype_name(t.dtype));
  }
  return values;
}

/// A strided walk over `shape` (element c at `sum(c[d] * strides[d])`) with size-1 dims
/// dropped and each dim merged into the next where the two are contiguous, so the inner loop
/// runs as long as possible. Never empty: a walk of one element is {1} with step 1.
struct StridedWalk {
  Shape dims;
  std::vector<int64_t> steps;
};

inline StridedWalk merge_strided_dims(const Shape& shape, const std::vector<int64_t>& strides) {
  StridedWalk walk;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!walk.dims.empty() && walk.steps.back() == strides[d] * shape[d]) {
      walk.dims.back() *= shape[d];
      walk.steps.back() = strides[d];
    } else {
      walk.dims.push_back(shape[d]);
      walk.steps.push_back(strides[d]);
    }
  }
  if (walk.dims.empty()) {
    walk.dims.push_back(1);
    walk.steps.push_back(1);
  }
  return walk;
}

/// The elements a Slice selects from a dense tensor: element c of the result (shape `shape`)
/// is `x[base + sum(c[d] * strides[d])]`.
struct SliceView {
  Shape shape;
  std::vector<int64_t> strides;
  int64_t base = 0;
};

/// The view of a Slice of X (shape `x_shape`) with `forward_inputs` operands, `input(k)`
/// giving operand k (null when omitted): starts/ends/axes/steps as inputs 1-4 (opset 10+) or,
/// with one operand, as attributes (opset 1). Negative and out-of-range bounds are clamped as
/// ONNX says; a zero step or a repeated axis is an error.
inline SliceView slice_view(const KernelArgs& a, const Shape& x_shape, size_t forward_inputs,
                            const std::function<const Tensor*(size_t)>& input) {
  std::vector<int64_t> starts, ends, axes, steps;
  if (forward_inputs > 1) {
    auto operand = [&](size_t k) -> const Tensor& {
      if (input(k) == nullptr) fail(ErrorKind::kModel, "{} needs input {}", a.op_type, k);
      return *input(k);
    };
    starts = read_ints(a, operand(1), 1);
    ends = read_ints(a, operand(2), 2);
    if (input(3) != nullptr) axes = read_ints(a, *input(3), 3);
    if (input(4) != nullptr) steps = read_ints(a, *input(4), 4);
  } else {
    starts = a.attrs.ints("starts");
    ends = a.attrs.ints("ends");
    axes = a.attrs.ints("axes");
  }
  if (axes.empty())
    for (size_t d = 0; d < starts.size(); ++d) axes.push_back(static_cast<int64_t>(d));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    fail(ErrorKind::kModel, "Slice has {} starts, {} ends, {} axes and {} steps", starts.size(),
         ends.size(), axes.size(), steps.size());
  SliceView view{x_shape, dense_strides(x_shape), 0};
  const std::vector<int64_t> x_strides = view.strides;
  std::vector<bool> seen(x_shape.size(), false);
  for (size_t k = 0; k < starts.size(); ++k) {
    const int64_t d = normalize_axis(a, axes[k], static_cast<int64_t>(x_shape.size()));
    if (seen[d]) fail(ErrorKind::kModel, "Slice lists axis {} twice", axes[k]);
    seen[d] = true;
    const int64_t dim = x_shape[d], step = steps[k];
    if (step == 0) fail(ErrorKind::kModel, "Slice step is 0 on axis {}", axes[k]);
    // Clamp before adding dim so INT64_MIN/INT64_MAX sentinels cannot overflow.
    int64_t start = std::clamp<int64_t>(starts[k], -dim - 1, dim + 1);
    int64_t end = std::clamp<int64_t>(ends[k], -dim - 1, dim + 1);
    if (start < 0) start += dim;
    if (end < 0) end += dim;
    int64_t count;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      count = end > start ? (end - start - 1) / step + 1 : 0;
    } else {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      count =
          start > end
              ? (step == std::numeric_limits<int64_t>::min() ? 1 : (start - end - 1) / -step + 1)
              : 0;
    }
    // ceil(span / |step|) as (span - 1) / |step| + 1, and a stride only where a second element
    // is taken: a step near 2^63 must not wrap.
    view.shape[d] = count;
    if (count > 0) view.base += start * x_strides[d];
    view.strides[d] = count > 1 ? step * x_strides[d] : x_strides[d];
  }
  return view;
}

/// Trilu's (and TriluGrad's) reading of X's shape, the attribute upper and the optional k
/// operand (`k`: null when absent; an int64 scalar). X needs two dims.
inline TriluShape trilu_shape(const KernelArgs& a, const Shape& x, const Tensor* k) {
  if (x.size() < 2)
    fail(ErrorKind::kShape, "{} '{}': X {} needs at least two dims", a.op_type, a.name,
         shape_string(x));
  TriluShape s;
  s.rows = x[x.size() - 2];
  s.cols = x.back();
  s.upper = a.attrs.i("upper", 1) != 0;
  if (k != nullptr) {
    const std::vector<int64_t> values = read_ints(a, *k, 1);
    if (values.size() != 1)
      fail(ErrorKind::kModel, "{} '{}': k has {} values, expected one", a.op_type, a.name,
           values.size());
    s.k = values[0];
  }
  return s;
}

}  // namespace stagecraft::rt::ops
