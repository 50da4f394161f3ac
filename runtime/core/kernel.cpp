#include "runtime/core/kernel.h"

#include <fmt/format.h>

#include "runtime/format/error.h"

namespace stagecraft::rt {

const onnx::AttributeProto* Attrs::find(std::string_view name) const {
  if (node_ == nullptr) return nullptr;
  for (const onnx::AttributeProto& a : node_->attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

const onnx::AttributeProto& Attrs::typed(std::string_view name,
                                         onnx::AttributeProto::AttributeType type) const {
  const onnx::AttributeProto* a = find(name);
  if (a == nullptr) fail(ErrorKind::kModel, "attribute '{}' is missing", name);
  // Old exporters leave `type` unset; accept the field that is present then.
  if (a->type() != type && a->type() != onnx::AttributeProto::UNDEFINED)
    fail(ErrorKind::kModel, "attribute '{}' has type {}, expected {}", name,
         onnx::AttributeProto::AttributeType_Name(a->type()),
         onnx::AttributeProto::AttributeType_Name(type));
  return *a;
}

int64_t Attrs::i(std::string_view name, int64_t fallback) const {
  return has(name) ? typed(name, onnx::AttributeProto::INT).i() : fallback;
}

int64_t Attrs::required_i(std::string_view name) const {
  return typed(name, onnx::AttributeProto::INT).i();
}

float Attrs::f(std::string_view name, float fallback) const {
  return has(name) ? typed(name, onnx::AttributeProto::FLOAT).f() : fallback;
}

std::string Attrs::s(std::string_view name, std::string_view fallback) const {
  return has(name) ? typed(name, onnx::AttributeProto::STRING).s() : std::string(fallback);
}

std::vector<int64_t> Attrs::ints(std::string_view name) const {
  if (!has(name)) return {};
  const auto& a = typed(name, onnx::AttributeProto::INTS);
  return {a.ints().begin(), a.ints().end()};
}

std::vector<float> Attrs::floats(std::string_view name) const {
  if (!has(name)) return {};
  const auto& a = typed(name, onnx::AttributeProto::FLOATS);
  return {a.floats().begin(), a.floats().end()};
}

const onnx::TensorProto* Attrs::t(std::string_view name) const {
  return has(name) ? &typed(name, onnx::AttributeProto::TENSOR).t() : nullptr;
}

const Tensor& KernelArgs::input(size_t k) const {
  if (!has_input(k)) fail(ErrorKind::kModel, "{} needs input {} and it is missing", op_type, k);
  return *in[k];
}

std::string all_float32(const OpSignature& signature) {
  for (DType d : signature.inputs)
    if (d != DType::kUndefined && d != DType::kFloat32)
      return fmt::format("{} on {} is not supported (float32 only)", signature.op_type,
                         dtype_name(d));
  for (DType d : signature.outputs)
    if (d != DType::kUndefined && d != DType::kFloat32)
      return fmt::format("{} producing {} is not supported (float32 only)", signature.op_type,
                         dtype_name(d));
  return "";
}

void expect_shape(const KernelArgs& args, size_t output, const Shape& expected) {
  const Tensor& out = *args.out[output];
  if (out.shape != expected)
    fail(ErrorKind::kShape, "{} output {} should have shape {} but the program gives it {}",
         args.op_type, output, shape_string(expected), shape_string(out.shape));
}

}  // namespace stagecraft::rt
