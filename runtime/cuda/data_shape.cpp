// The CUDA backend's shape ops (data_shape.h), as the CPU backend's shape_ops.cpp computes
// them: each value is made on the host (they are small: shapes, scalars, constants the compiler
// did not fold) and written to the device output with one copy.
#include "runtime/cuda/data_shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/core/tensor_io.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::cuda {
namespace {

// Writes the host tensor `value` (same bytes as output k) to output k.
void write_output(const KernelArgs& a, size_t k, const Tensor& value) {
  Tensor& out = *a.out[k];
  if (value.bytes() != out.bytes())
    fail(ErrorKind::kInternal, "{} '{}': {} bytes computed for {}", a.op_type, a.name,
         value.bytes(), out.describe());
  context(a).write(out, value.data, out.bytes());
}

// Shape: the input's dims [start, end) as int64 (opset 15 start/end, negative from the end,
// clamped to the rank).
void shape(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  const int64_t rank = in.rank();
  auto bound = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
  const int64_t start = bound(a.attrs.i("start", 0)), end = bound(a.attrs.i("end", rank));
  const Shape dims(in.shape.begin() + start, in.shape.begin() + std::max(start, end));
  expect_shape(a, 0, {static_cast<int64_t>(dims.size())});
  Tensor value = Tensor::owned(DType::kInt64, {static_cast<int64_t>(dims.size())});
  std::copy(dims.begin(), dims.end(), value.as<int64_t>());
  write_output(a, 0, value);
}

// The tensor a Constant node holds, from whichever value attribute it has.
Tensor constant_value(const Attrs& attrs) {
  if (const onnx::TensorProto* t = attrs.t("value")) return tensor_from_proto(*t, "Constant value");
  if (attrs.has("value_float")) {
    Tensor t = Tensor::owned(DType::kFloat32, {});
    *t.as<float>() = attrs.f("value_float", 0);
    return t;
  }
  if (attrs.has("value_int")) {
    Tensor t = Tensor::owned(DType::kInt64, {});
    *t.as<int64_t>() = attrs.i("value_int", 0);
    return t;
  }
  if (attrs.has("value_floats")) {
    const std::vector<float> v = attrs.floats("value_floats");
    Tensor t = Tensor::owned(DType::kFloat32, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), t.as<float>());
    return t;
  }
  if (attrs.has("value_ints")) {
    const std::vector<int64_t> v = attrs.ints("value_ints");
    Tensor t = Tensor::owned(DType::kInt64, {static_cast<int64_t>(v.size())});
    std::copy(v.begin(), v.end(), t.as<int64_t>());
    return t;
  }
  fail(ErrorKind::kUnsupported, "Constant has none of value, value_float(s), value_int(s)");
}

void constant(const KernelArgs& a) {
  const Tensor value = constant_value(a.attrs);
  const Tensor& out = *a.out[0];
  if (value.dtype != out.dtype)
    fail(ErrorKind::kShape, "Constant holds {} but the program gives its output {}",
         value.describe(), out.describe());
  expect_shape(a, 0, value.shape);
  write_output(a, 0, value);
}

// ConstantOfShape: an output of the shape in input 0, filled with the one element of `value`
// (default float32 0).
void constant_of_shape(const KernelArgs& a) {
  const Shape expected = read_ints(context(a), a.input(0));
  expect_shape(a, 0, expected);
  const Tensor& out = *a.out[0];
  const onnx::TensorProto* proto = a.attrs.t("value");
  const Tensor value = proto ? tensor_from_proto(*proto, "ConstantOfShape value")
                             : Tensor::owned(DType::kFloat32, {1});
  if (value.numel() != 1 || value.dtype != out.dtype)
    fail(ErrorKind::kModel, "ConstantOfShape value is {}; expected one {} element",
         value.describe(), dtype_name(out.dtype));
  Tensor filled = Tensor::uninitialized(out.dtype, out.shape);
  const int64_t total = filled.bytes(), size = dtype_size(out.dtype);
  if (total == 0) return;
  std::memcpy(filled.data, value.data, static_cast<size_t>(size));
  for (int64_t done = size; done < total; done *= 2)
    std::memcpy(filled.data + done, filled.data, static_cast<size_t>(std::min(done, total - done)));
  write_output(a, 0, filled);
}

// Range of T: out[i] = start + i * delta, ceil((limit - start) / delta) elements.
template <class T>
void range_of(const KernelArgs& a) {
  CudaContext& ctx = context(a);
  T scalars[3];
  for (size_t k = 0; k < 3; ++k) ctx.read(a.input(k), &scalars[k], sizeof(T));
  const T start = scalars[0], limit = scalars[1], delta = scalars[2];
  if (delta == 0) fail(ErrorKind::kModel, "Range delta is 0");
  // As ONNX computes it: the difference in T, the division in double.
  const double count =
      std::ceil(static_cast<double>(static_cast<T>(limit - start)) / static_cast<double>(delta));
  expect_shape(a, 0, {std::max<int64_t>(0, static_cast<int64_t>(count))});
  Tensor value = Tensor::uninitialized(a.out[0]->dtype, a.out[0]->shape);
  T* out = value.as<T>();
  const int64_t n = value.numel();
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(start + static_cast<T>(i) * delta);
  write_output(a, 0, value);
}

void range(const KernelArgs& a) {
  for (size_t k = 0; k < 3; ++k) {
    if (a.input(k).numel() != 1)
      fail(ErrorKind::kModel, "Range input {} is {}, not a scalar", k, a.input(k).describe());
    if (a.input(k).dtype != a.out[0]->dtype)
      fail(ErrorKind::kModel, "Range input {} is {} but its output is {}", k, a.input(k).describe(),
           a.out[0]->describe());
  }
  switch (a.out[0]->dtype) {
    case DType::kFloat32:
      range_of<float>(a);
      return;
    case DType::kFloat64:
      range_of<double>(a);
      return;
    case DType::kInt16:
      range_of<int16_t>(a);
      return;
    case DType::kInt32:
      range_of<int32_t>(a);
      return;
    case DType::kInt64:
      range_of<int64_t>(a);
      return;
    default:
      fail(ErrorKind::kUnsupported, "Range on {} is not supported", dtype_name(a.out[0]->dtype));
  }
}

// The CPU backend's checks decide: these compute what the CPU's kernels compute.
constexpr KernelEntry kKernels[] = {
    {"Shape", shape, same_as_cpu},
    {"Constant", constant, same_as_cpu},
    {"ConstantOfShape", constant_of_shape, same_as_cpu},
    {"Range", range, same_as_cpu},
};

}  // namespace

std::span<const KernelEntry> data_shape_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
