// Kernels of the shape family (see families.h): Shape, Constant, ConstantOfShape and Range. The
// compiler folds them into constants when their inputs are known at import, so these run only
// on graph inputs or in graphs that were not folded. Each recomputes its output shape and checks
// it against the recorded one.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "runtime/core/tensor_io.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::cpu {

namespace {

// Fills every element of `out` with the `dtype_size` bytes at `value`, doubling the filled
// prefix with each copy.
void fill(Tensor& out, const std::byte* value) {
  const int64_t total = out.bytes(), size = dtype_size(out.dtype);
  if (total == 0) return;
  std::memcpy(out.data, value, static_cast<size_t>(size));
  for (int64_t done = size; done < total; done *= 2)
    std::memcpy(out.data + done, out.data, static_cast<size_t>(std::min(done, total - done)));
}

// Shape: the input's dims [start, end) as int64 (opset 15 start/end, negative from the end,
// clamped to the rank).
void shape(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  const int64_t rank = in.rank();
  auto bound = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
  int64_t start = bound(a.attrs.i("start", 0)), end = bound(a.attrs.i("end", rank));
  Shape dims(in.shape.begin() + start, in.shape.begin() + std::max(start, end));
  expect_shape(a, 0, {static_cast<int64_t>(dims.size())});
  if (!dims.empty()) std::memcpy(a.out[0]->data, dims.data(), dims.size() * sizeof(int64_t));
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
    std::vector<float> v = attrs.floats("value_floats");
    Tensor t = Tensor::owned(DType::kFloat32, {static_cast<int64_t>(v.size())});
    if (!v.empty()) std::memcpy(t.data, v.data(), v.size() * sizeof(float));
    return t;
  }
  if (attrs.has("value_ints")) {
    std::vector<int64_t> v = attrs.ints("value_ints");
    Tensor t = Tensor::owned(DType::kInt64, {static_cast<int64_t>(v.size())});
    if (!v.empty()) std::memcpy(t.data, v.data(), v.size() * sizeof(int64_t));
    return t;
  }
  fail(ErrorKind::kUnsupported, "Constant has none of value, value_float(s), value_int(s)");
}

void constant(const KernelArgs& a) {
  Tensor value = constant_value(a.attrs);
  Tensor& out = *a.out[0];
  if (value.dtype != out.dtype)
    fail(ErrorKind::kShape, "Constant holds {} but the program gives its output {}", value.describe(), out.describe());
  expect_shape(a, 0, value.shape);
  if (out.bytes() > 0) std::memcpy(out.data, value.data, static_cast<size_t>(out.bytes()));
}

// ConstantOfShape: an output of the shape in input 0, filled with the one element of `value`
// (default float32 0).
void constant_of_shape(const KernelArgs& a) {
  const Tensor& dims = a.input(0);
  Shape expected(dims.as<int64_t>(), dims.as<int64_t>() + dims.numel());
  expect_shape(a, 0, expected);
  Tensor& out = *a.out[0];
  const onnx::TensorProto* proto = a.attrs.t("value");
  Tensor value = proto ? tensor_from_proto(*proto, "ConstantOfShape value") : Tensor::owned(DType::kFloat32, {1});
  if (value.numel() != 1 || value.dtype != out.dtype)
    fail(ErrorKind::kModel, "ConstantOfShape value is {}; expected one {} element", value.describe(),
         dtype_name(out.dtype));
  fill(out, value.data);
}

// Range of T: out[i] = start + i * delta, ceil((limit - start) / delta) elements.
template <class T>
void range_of(const KernelArgs& a) {
  const T start = *a.input(0).as<T>(), limit = *a.input(1).as<T>(), delta = *a.input(2).as<T>();
  if (delta == 0) fail(ErrorKind::kModel, "Range delta is 0");
  // As ONNX computes it: the difference in T, the division in double.
  double count = std::ceil(static_cast<double>(static_cast<T>(limit - start)) / static_cast<double>(delta));
  expect_shape(a, 0, {std::max<int64_t>(0, static_cast<int64_t>(count))});
  T* out = a.out[0]->as<T>();
  const int64_t n = a.out[0]->numel();
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(start + static_cast<T>(i) * delta);
}

void range(const KernelArgs& a) {
  for (size_t k = 0; k < 3; ++k)
    if (a.input(k).numel() != 1) fail(ErrorKind::kModel, "Range input {} is {}, not a scalar", k, a.input(k).describe());
  switch (a.out[0]->dtype) {
    case DType::kFloat32: range_of<float>(a); return;
    case DType::kFloat64: range_of<double>(a); return;
    case DType::kInt16: range_of<int16_t>(a); return;
    case DType::kInt32: range_of<int32_t>(a); return;
    case DType::kInt64: range_of<int64_t>(a); return;
    default: fail(ErrorKind::kUnsupported, "Range on {} is not supported", dtype_name(a.out[0]->dtype));
  }
}

// --- Checks -----------------------------------------------------------------------------------

std::string check_shape(const OpSignature& s) {
  if (s.outputs.size() != 1 || s.outputs[0] != DType::kInt64) return "Shape must produce int64";
  return "";
}

// The dtype of a TensorProto, or kUndefined when it is not one the runtime stores.
DType proto_dtype(const onnx::TensorProto& proto) {
  auto dtype = dtype_from_onnx(proto.data_type());
  return dtype && dtype_size(*dtype) > 0 ? *dtype : DType::kUndefined;
}

std::string check_constant(const OpSignature& s) {
  DType held = DType::kUndefined;
  if (const onnx::TensorProto* t = s.attrs.t("value")) held = proto_dtype(*t);
  else if (s.attrs.has("value_float") || s.attrs.has("value_floats")) held = DType::kFloat32;
  else if (s.attrs.has("value_int") || s.attrs.has("value_ints")) held = DType::kInt64;
  else return "Constant with a sparse or string value is not supported";
  if (held == DType::kUndefined) return "Constant value has an element type the runtime does not handle";
  if (s.outputs.size() != 1) return "Constant must have exactly one output";
  if (s.outputs[0] != held)
    return fmt::format("Constant holds {} but its output is {}", dtype_name(held), dtype_name(s.outputs[0]));
  return "";
}

std::string check_constant_of_shape(const OpSignature& s) {
  if (s.inputs.empty() || s.inputs[0] != DType::kInt64) return "ConstantOfShape input must be int64";
  const onnx::TensorProto* t = s.attrs.t("value");
  DType held = t ? proto_dtype(*t) : DType::kFloat32;
  if (held == DType::kUndefined) return "ConstantOfShape value has an element type the runtime does not handle";
  if (s.outputs.size() != 1) return "ConstantOfShape must have exactly one output";
  if (s.outputs[0] != held)
    return fmt::format("ConstantOfShape value is {} but its output is {}", dtype_name(held), dtype_name(s.outputs[0]));
  return "";
}

std::string check_range(const OpSignature& s) {
  if (s.inputs.size() != 3 || s.outputs.size() != 1) return "Range takes three inputs and one output";
  DType d = s.outputs[0];
  if (d != DType::kFloat32 && d != DType::kFloat64 && d != DType::kInt16 && d != DType::kInt32 && d != DType::kInt64)
    return fmt::format("Range on {} is not supported (float32, float64, int16, int32, int64)", dtype_name(d));
  for (DType in : s.inputs)
    if (in != d) return fmt::format("Range mixes {} inputs with a {} output", dtype_name(in), dtype_name(d));
  return "";
}

constexpr KernelEntry kKernels[] = {
    {"Shape", shape, check_shape},
    {"Constant", constant, check_constant},
    {"ConstantOfShape", constant_of_shape, check_constant_of_shape},
    {"Range", range, check_range},
};

}  // namespace

std::span<const KernelEntry> shape_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
