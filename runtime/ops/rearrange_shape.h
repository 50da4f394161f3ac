#pragma once
/// \file
/// The host-side rules of DepthToSpace, SpaceToDepth and TopK, shared by the CPU kernels
/// (runtime/cpu/rearrange.cpp), the CUDA ones and the compiler's node checks
/// (passes/check_nodes.cpp): attributes and operands read and checked, one line naming the node and
/// the numbers for a model error, and the plain shapes of rearrange_element.h built from them.

#include <fmt/format.h>

#include <string>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/rearrange_element.h"

namespace stagecraft::rt::ops {

/// DepthToSpace (`to_space`) or SpaceToDepth of X (shape `x_shape`, [N, C, H, W]) with the
/// node's blocksize and mode.
inline SpaceDepthShape space_depth_shape(const KernelArgs& a, const Shape& x_shape, bool to_space) {
  if (x_shape.size() != 4)
    fail(ErrorKind::kModel, "{} '{}': X is {}, expected rank 4 [N, C, H, W]", a.op_type, a.name,
         shape_string(x_shape));
  if (!a.attrs.has("blocksize"))
    fail(ErrorKind::kModel, "{} '{}' has no blocksize attribute", a.op_type, a.name);
  const int64_t b = a.attrs.i("blocksize", 0);
  if (b < 1) fail(ErrorKind::kModel, "{} '{}': blocksize {} is not positive", a.op_type, a.name, b);
  SpaceDepthShape s;
  s.b = b;
  s.n = x_shape[0];
  if (to_space) {
    const std::string mode = a.attrs.s("mode", "DCR");
    if (mode != "DCR" && mode != "CRD")
      fail(ErrorKind::kModel, "DepthToSpace '{}': mode '{}' is neither DCR nor CRD", a.name, mode);
    s.crd = mode == "CRD";
    if (x_shape[1] % (b * b) != 0)
      fail(ErrorKind::kModel,
           "DepthToSpace '{}': {} channels of X {} are not a multiple of blocksize^2 = {}", a.name,
           x_shape[1], shape_string(x_shape), b * b);
    s.c = x_shape[1] / (b * b);
    s.h = x_shape[2];
    s.w = x_shape[3];
  } else {
    if (x_shape[2] % b != 0 || x_shape[3] % b != 0)
      fail(ErrorKind::kModel,
           "SpaceToDepth '{}': height {} and width {} of X {} are not both multiples of "
           "blocksize {}",
           a.name, x_shape[2], x_shape[3], shape_string(x_shape), b);
    s.c = x_shape[1];
    s.h = x_shape[2] / b;
    s.w = x_shape[3] / b;
  }
  return s;
}

/// The spatial tensor's shape [N, C, H*b, W*b] (DepthToSpace's Y, SpaceToDepth's X).
inline Shape space_shape(const SpaceDepthShape& s) { return {s.n, s.c, s.h * s.b, s.w * s.b}; }

/// The deep tensor's shape [N, C*b*b, H, W] (DepthToSpace's X, SpaceToDepth's Y).
inline Shape deep_shape(const SpaceDepthShape& s) { return {s.n, s.c * s.b * s.b, s.h, s.w}; }

/// TopK of X (shape `x_shape`) with K from `k_operand` (host memory, one int64 element; null at
/// opset 1, where k is an attribute) and the node's axis, largest and sorted.
inline TopKShape topk_shape(const KernelArgs& a, const Shape& x_shape, const Tensor* k_operand) {
  const auto rank = static_cast<int64_t>(x_shape.size());
  if (rank == 0) fail(ErrorKind::kModel, "TopK '{}' of a scalar: X needs a dim", a.name);
  int64_t k = 0;
  if (k_operand != nullptr) {
    const std::vector<int64_t> values = read_ints(a, *k_operand, 1);
    if (values.size() != 1)
      fail(ErrorKind::kModel, "TopK '{}': K has {} elements, expected one", a.name, values.size());
    k = values[0];
  } else {
    if (!a.attrs.has("k")) fail(ErrorKind::kModel, "TopK '{}' has neither K nor k", a.name);
    k = a.attrs.i("k", 0);
  }
  const int64_t axis = a.attrs.i("axis", -1);
  if (axis < -rank || axis >= rank)
    fail(ErrorKind::kModel, "TopK '{}': axis {} is out of range for rank {}", a.name, axis, rank);
  const int64_t d = axis < 0 ? axis + rank : axis;
  TopKShape s;
  for (int64_t i = 0; i < d; ++i) s.outer *= x_shape[i];
  s.length = x_shape[d];
  for (int64_t i = d + 1; i < rank; ++i) s.inner *= x_shape[i];
  if (k < 0) fail(ErrorKind::kModel, "TopK '{}': K = {} is negative", a.name, k);
  if (k > s.length)
    fail(ErrorKind::kModel, "TopK '{}': K = {} is larger than axis {} of X {} ({} elements)",
         a.name, k, d, shape_string(x_shape), s.length);
  s.k = k;
  s.axis = d;
  s.largest = a.attrs.i("largest", 1) != 0;
  s.sorted = a.attrs.i("sorted", 1) != 0;
  return s;
}

/// ArgMax or ArgMin of X as a TopK of one element per line (attribute axis, default 0); an
/// empty axis is refused (no index to give).
inline TopKShape arg_shape(const KernelArgs& a, const Shape& x_shape) {
  const auto rank = static_cast<int64_t>(x_shape.size());
  if (rank == 0) fail(ErrorKind::kModel, "{} '{}' of a scalar: X needs a dim", a.op_type, a.name);
  const int64_t axis = a.attrs.i("axis", 0);
  if (axis < -rank || axis >= rank)
    fail(ErrorKind::kModel, "{} '{}': axis {} is out of range for rank {}", a.op_type, a.name, axis,
         rank);
  TopKShape s;
  s.axis = axis < 0 ? axis + rank : axis;
  for (int64_t i = 0; i < s.axis; ++i) s.outer *= x_shape[i];
  s.length = x_shape[s.axis];
  for (int64_t i = s.axis + 1; i < rank; ++i) s.inner *= x_shape[i];
  if (s.length == 0 && s.outer * s.inner > 0)
    fail(ErrorKind::kModel, "{} '{}' over an empty axis {} of {}", a.op_type, a.name, s.axis,
         shape_string(x_shape));
  s.k = 1;
  s.largest = a.op_type == "ArgMax";
  return s;
}

/// ArgMax's and ArgMin's output shape: X's with the axis 1 (keepdims, the default) or dropped.
inline Shape arg_output_shape(const KernelArgs& a, const Shape& x_shape, const TopKShape& s) {
  Shape y = x_shape;
  if (a.attrs.i("keepdims", 1) != 0)
    y[static_cast<size_t>(s.axis)] = 1;
  else
    y.erase(y.begin() + s.axis);
  return y;
}

/// TopK's outputs' shape: X's with K along the axis.
inline Shape topk_output_shape(const Shape& x_shape, const TopKShape& s) {
  Shape y = x_shape;
  y[static_cast<size_t>(s.axis)] = s.k;
  return y;
}

}  // namespace stagecraft::rt::ops
