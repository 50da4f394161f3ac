#pragma once
/// \file
/// The shape_ops family's values, computed on the host by one set of rules for the CPU kernels
/// (runtime/cpu/shape_ops.cpp, which write them in place) and the CUDA ones
/// (runtime/cuda/shape_ops.cpp, which copy them to the device): Shape, Constant,
/// ConstantOfShape and Range. The compiler folds these ops when their inputs are known at
/// import, so they run only on graph inputs or in graphs that were not folded; each value is
/// small but ConstantOfShape's, which is filled where it lies. Each function checks the output
/// shape the compiler recorded (`expect_shape`).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/core/tensor_io.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::ops {

/// Shape: the dims [start, end) of an input of `shape` as an int64 host tensor (opset 15's
/// start and end, negative from the end, clamped to the rank).
inline Tensor shape_value(const KernelArgs& a, const Shape& shape) {
  const auto rank = static_cast<int64_t>(shape.size());
  auto bound = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
  const int64_t start = bound(a.attrs.i("start", 0)), end = bound(a.attrs.i("end", rank));
  const Shape dims(shape.begin() + start, shape.begin() + std::max(start, end));
  expect_shape(a, 0, {static_cast<int64_t>(dims.size())});
  Tensor value = Tensor::owned(DType::kInt64, {static_cast<int64_t>(dims.size())});
  std::copy(dims.begin(), dims.end(), value.as<int64_t>());
  return value;
}

/// The host tensor a Constant node holds, from whichever value attribute it has, checked
/// against the output's dtype and shape.
inline Tensor constant_value(const KernelArgs& a) {
  const Attrs& attrs = a.attrs;
  Tensor value;
  if (const onnx::TensorProto* t = attrs.t("value")) {
    value = tensor_from_proto(*t, "Constant value");
  } else if (attrs.has("value_float")) {
    value = Tensor::owned(DType::kFloat32, {});
    *value.as<float>() = attrs.f("value_float", 0);
  } else if (attrs.has("value_int")) {
    value = Tensor::owned(DType::kInt64, {});
    *value.as<int64_t>() = attrs.i("value_int", 0);
  } else if (attrs.has("value_floats")) {
    const std::vector<float> v = attrs.floats("value_floats");
    value = Tensor::owned(DType::kFloat32, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), value.as<float>());
  } else if (attrs.has("value_ints")) {
    const std::vector<int64_t> v = attrs.ints("value_ints");
    value = Tensor::owned(DType::kInt64, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), value.as<int64_t>());
  } else {
    fail(ErrorKind::kUnsupported, "Constant has none of value, value_float(s), value_int(s)");
  }
  if (value.dtype != a.out[0]->dtype)
    fail(ErrorKind::kShape, "Constant holds {} but the program gives its output {}",
         value.describe(), a.out[0]->describe());
  expect_shape(a, 0, value.shape);
  return value;
}

/// ConstantOfShape's one element (attribute `value`, default float32 0) for an output of shape
/// `dims` (its int64 input, on the host), checked against the output.
inline Tensor constant_of_shape_element(const KernelArgs& a, const Shape& dims) {
  expect_shape(a, 0, dims);
  const Tensor& out = *a.out[0];
  const onnx::TensorProto* proto = a.attrs.t("value");
  Tensor value = proto ? tensor_from_proto(*proto, "ConstantOfShape value")
                       : Tensor::owned(DType::kFloat32, {1});
  if (value.numel() != 1 || value.dtype != out.dtype)
    fail(ErrorKind::kModel, "ConstantOfShape value is {}; expected one {} element",
         value.describe(), dtype_name(out.dtype));
  return value;
}

/// Fills every element of the host tensor `out` with the `dtype_size` bytes at `element`,
/// doubling the filled prefix with each copy.
inline void fill_with(Tensor& out, const std::byte* element) {
  const int64_t total = out.bytes(), size = dtype_size(out.dtype);
  if (total == 0) return;
  std::memcpy(out.data, element, static_cast<size_t>(size));
  for (int64_t done = size; done < total; done *= 2)
    std::memcpy(out.data + done, out.data, static_cast<size_t>(std::min(done, total - done)));
}

/// Range's scalars checked: each of the three inputs one element of the output's dtype.
inline void check_range_inputs(const KernelArgs& a) {
  for (size_t k = 0; k < 3; ++k) {
    if (a.input(k).numel() != 1)
      fail(ErrorKind::kModel, "Range input {} is {}, not a scalar", k, a.input(k).describe());
    if (a.input(k).dtype != a.out[0]->dtype)
      fail(ErrorKind::kModel, "Range input {} is {} but its output is {}", k,
           a.input(k).describe(), a.out[0]->describe());
  }
}

/// Range of T into the host tensor `out` (the output's dtype and recorded shape): out[i] =
/// start + i * delta, ceil((limit - start) / delta) elements, as ONNX computes them: the
/// difference in T, the division in double.
template <class T>
void range_into(const KernelArgs& a, T start, T limit, T delta, Tensor& out) {
  if (delta == 0) fail(ErrorKind::kModel, "Range delta is 0");
  const double count =
      std::ceil(static_cast<double>(static_cast<T>(limit - start)) / static_cast<double>(delta));
  expect_shape(a, 0, {std::max<int64_t>(0, static_cast<int64_t>(count))});
  T* values = out.as<T>();
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<T>(start + static_cast<T>(i) * delta);
}

/// Calls `run(T{})` with T the output's element type (float32, float64, int16, int32, int64).
template <class Fn>
void by_range_type(const KernelArgs& a, Fn&& run) {
  switch (a.out[0]->dtype) {
    case DType::kFloat32:
      return run(float{});
    case DType::kFloat64:
      return run(double{});
    case DType::kInt16:
      return run(int16_t{});
    case DType::kInt32:
      return run(int32_t{});
    case DType::kInt64:
      return run(int64_t{});
    default:
      fail(ErrorKind::kUnsupported, "Range on {} is not supported", dtype_name(a.out[0]->dtype));
  }
}

}  // namespace stagecraft::rt::ops
