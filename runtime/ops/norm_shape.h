#pragma once
/// \file
/// LayerNormalization's operands and its gradient's, read by one set of rules for the CPU kernels
/// (runtime/cpu/norm.cpp, grad_norm.cpp) and the CUDA ones (runtime/cuda/norm.cpp, grad_norm.cpp):
/// X normalised over its dims from `axis` on, as `outer` rows of `inner` elements; Scale and the
/// optional B of the normalised shape; the optional Mean and InvStdDev outputs [dims before axis,
/// 1, ...]. A refusal is one line naming the op and the shapes.

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string_view>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::ops {

/// The `axis` attribute (default -1) made non-negative for X; out of range is refused.
inline int64_t layer_norm_axis(const KernelArgs& a, std::string_view op, const Tensor& x) {
  int64_t axis = a.attrs.i("axis", -1);
  if (axis < -x.rank() || axis >= x.rank())
    fail(ErrorKind::kModel, "{}: axis {} is out of range for {}", op, axis, x.describe());
  return axis < 0 ? axis + x.rank() : axis;
}

/// Drops leading unit dims ([1, 1, 5] -> [5]).
inline Shape without_leading_ones(const Shape& shape) {
  size_t k = 0;
  while (k < shape.size() && shape[k] == 1) ++k;
  return Shape(shape.begin() + static_cast<std::ptrdiff_t>(k), shape.end());
}

/// A forward node's operands.
struct LayerNormOperands {
  int64_t axis = 0, outer = 0, inner = 0;
  const Tensor* scale = nullptr;
  const Tensor* bias = nullptr;  ///< Null without B.
  Tensor* mean = nullptr;        ///< The optional outputs, null where not asked for.
  Tensor* inv_std = nullptr;
};

/// The operands of LayerNormalization node `a`, its outputs' shapes checked. `outer` 0: there
/// is nothing to compute; a non-empty X over an empty normalised shape is refused.
inline LayerNormOperands layer_norm_operands(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  LayerNormOperands o;
  o.axis = layer_norm_axis(a, "LayerNormalization", x);
  const Shape normalized(x.shape.begin() + o.axis, x.shape.end());
  o.inner = shape_numel(normalized);
  o.outer = x.numel() / std::max<int64_t>(o.inner, 1);
  auto per_row = [&](size_t k, const char* what) {
    const Tensor& t = a.input(k);
    if (without_leading_ones(t.shape) != without_leading_ones(normalized))
      fail(ErrorKind::kUnsupported,
           "LayerNormalization: {} is {}, expected the normalised shape {}", what, t.describe(),
           shape_string(normalized));
    return &t;
  };
  o.scale = per_row(1, "Scale");
  o.bias = a.has_input(2) ? per_row(2, "B") : nullptr;
  expect_shape(a, 0, x.shape);
  o.mean = a.out.size() > 1 ? a.out[1] : nullptr;
  o.inv_std = a.out.size() > 2 ? a.out[2] : nullptr;
  Shape stat_shape(x.shape.begin(), x.shape.begin() + o.axis);
  stat_shape.resize(x.shape.size(), 1);
  if (o.mean) expect_shape(a, 1, stat_shape);
  if (o.inv_std) expect_shape(a, 2, stat_shape);
  if (o.outer != 0 && o.inner == 0)
    fail(ErrorKind::kShape, "LayerNormalization of {} over an empty normalised shape",
         x.describe());
  return o;
}

/// A gradient node's operands (runtime/format/grad_ops.h's contract: X, Scale and the optional
/// B; the gradients of Y, Mean and InvStdDev, each optional).
struct LayerNormGradOperands {
  int64_t outer = 0, inner = 0;
  const Tensor* x = nullptr;
  const Tensor* scale = nullptr;
  const Tensor* bias = nullptr;
  const Tensor* dy = nullptr;
  const Tensor* dmean = nullptr;
  const Tensor* dinv = nullptr;
};

/// The operands of LayerNormalizationGrad node `a` (read through `io`), the gradients it is
/// asked for checked against them. `outer` or `inner` 0: every gradient is zeros.
inline LayerNormGradOperands layer_norm_grad_operands(const KernelArgs& a, const GradIo& io) {
  LayerNormGradOperands o;
  o.x = &io.need_x(0);
  const Tensor& x = *o.x;
  const int64_t axis = layer_norm_axis(a, "LayerNormalizationGrad", x);
  o.inner = 1;
  for (int64_t i = axis; i < x.rank(); ++i) o.inner *= x.shape[i];
  o.outer = o.inner == 0 ? 0 : x.numel() / o.inner;
  o.scale = &io.need_x(1);
  o.bias = io.x(2);
  if (o.scale->numel() != o.inner || (o.bias && o.bias->numel() != o.inner))
    fail(ErrorKind::kShape,
         "LayerNormalizationGrad: Scale {} and B must have the normalised size {}",
         o.scale->describe(), o.inner);
  if (io.wants(0)) expect_shape(a, 0, x.shape);
  if (io.wants(1)) expect_shape(a, 1, o.scale->shape);
  if (io.wants(2)) {
    if (!o.bias) fail(ErrorKind::kModel, "LayerNormalizationGrad: a B gradient without a B input");
    expect_shape(a, 2, o.bias->shape);
  }
  o.dy = io.dy(0);
  o.dmean = io.dy(1);
  o.dinv = io.dy(2);
  if (o.dy && o.dy->shape != x.shape)
    fail(ErrorKind::kShape, "LayerNormalizationGrad: dY {} should be {}", o.dy->describe(),
         shape_string(x.shape));
  if ((o.dmean && o.dmean->numel() != o.outer) || (o.dinv && o.dinv->numel() != o.outer))
    fail(ErrorKind::kShape,
         "LayerNormalizationGrad: Mean and InvStdDev gradients must have {} values", o.outer);
  return o;
}

/// Softmax's X seen as [outer, len, inner] around its one axis (opset 13's semantics: attribute
/// `axis`, default -1; opsets < 13 coerce X to 2-D at `axis` instead, which agrees when the axis
/// is the last dim or X is 2-D), the output checked to have X's shape.
struct SoftmaxView {
  int64_t outer = 1, len = 1, inner = 1;
};

inline SoftmaxView softmax_view(const KernelArgs& a, const Tensor& x) {
  int64_t axis = a.attrs.i("axis", -1);
  if (x.rank() == 0 || axis < -x.rank() || axis >= x.rank())
    fail(ErrorKind::kModel, "{}: axis {} is out of range for {}", a.op_type, axis, x.describe());
  if (axis < 0) axis += x.rank();
  expect_shape(a, 0, x.shape);
  SoftmaxView v;
  for (int64_t i = 0; i < axis; ++i) v.outer *= x.shape[i];
  v.len = x.shape[axis];
  for (int64_t i = axis + 1; i < x.rank(); ++i) v.inner *= x.shape[i];
  return v;
}

/// SoftmaxGrad's operand contract (X, Y, dY) and its view: Y and dY must have X's shape.
inline constexpr GradArity kSoftmaxGradArity{.n_min = 1, .n_max = 1, .m_min = 1, .m_max = 1};

inline SoftmaxView softmax_grad_view(const KernelArgs& a, const Tensor& x, const Tensor& y,
                                     const Tensor& dy) {
  const SoftmaxView v = softmax_view(a, x);
  if (y.shape != x.shape || dy.shape != x.shape)
    fail(ErrorKind::kShape, "SoftmaxGrad: Y {} and dY {} should be {}", y.describe(),
         dy.describe(), shape_string(x.shape));
  return v;
}

/// SoftmaxGrad's and LogSoftmaxGrad's operands, read and checked: Y, dY, dX and the view.
struct SoftmaxGradOperands {
  SoftmaxView view;
  const Tensor* y = nullptr;
  const Tensor* dy = nullptr;
  Tensor* dx = nullptr;
};

/// The operands, or nullopt when there is nothing left to compute: dX not wanted, or no dY
/// (then `zero` has cleared dX, the backend's way).
template <class Zero>
std::optional<SoftmaxGradOperands> softmax_grad_operands(const KernelArgs& a, const GradIo& io,
                                                         Zero zero) {
  const Tensor& x = io.need_x(0);
  const Tensor& y = io.need_y(0);
  const Tensor* dy = io.dy(0);
  if (!io.wants(0)) return std::nullopt;
  if (dy == nullptr) {
    zero(*io.dx(0));
    return std::nullopt;
  }
  return SoftmaxGradOperands{softmax_grad_view(a, x, y, *dy), &y, dy, io.dx(0)};
}

}  // namespace stagecraft::rt::ops
