// Kernels of the shape_ops family (see families.h): Shape, Constant, ConstantOfShape and Range,
// their values computed by the rules the CUDA backend shares (runtime/ops/shape_ops.h) and written
// in place. The compiler folds them into constants when their inputs are known at import, so
// these run only on graph inputs or in graphs that were not folded.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "runtime/core/tensor_io.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/shape_ops.h"

namespace stagecraft::rt::cpu {

namespace {

// Shape: the input's dims [start, end) as int64.
void shape(const KernelArgs& a) {
  const Tensor value = ops::shape_value(a, a.input(0).shape);
  if (value.bytes() > 0) std::memcpy(a.out[0]->data, value.data, static_cast<size_t>(value.bytes()));
}

void constant(const KernelArgs& a) {
  const Tensor value = ops::constant_value(a);
  if (value.bytes() > 0) std::memcpy(a.out[0]->data, value.data, static_cast<size_t>(value.bytes()));
}

// ConstantOfShape: an output of the shape in input 0, filled with the one element of `value`.
void constant_of_shape(const KernelArgs& a) {
  const Tensor& dims = a.input(0);
  const Tensor element =
      ops::constant_of_shape_element(a, Shape(dims.as<int64_t>(), dims.as<int64_t>() + dims.numel()));
  ops::fill_with(*a.out[0], element.data);
}

void range(const KernelArgs& a) {
  ops::check_range_inputs(a);
  ops::by_range_type(a, [&](auto zero) {
    using T = decltype(zero);
    ops::range_into<T>(a, *a.input(0).as<T>(), *a.input(1).as<T>(), *a.input(2).as<T>(), *a.out[0]);
  });
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

std::span<const KernelEntry> shape_ops_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
