#include "runtime/format/dtype.h"

#include <array>

namespace stagecraft {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int64_t size;
};

constexpr std::array<DTypeInfo, 17> kDTypes{{
    {DType::kUndefined, "undefined", 0}, {DType::kFloat32, "float32", 4},
    {DType::kUInt8, "uint8", 1},         {DType::kInt8, "int8", 1},
    {DType::kUInt16, "uint16", 2},       {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},         {DType::kInt64, "int64", 8},
    {DType::kString, "string", 0},       {DType::kBool, "bool", 1},
    {DType::kFloat16, "float16", 2},     {DType::kFloat64, "float64", 8},
    {DType::kUInt32, "uint32", 4},       {DType::kUInt64, "uint64", 8},
    {DType::kComplex64, "complex64", 8}, {DType::kComplex128, "complex128", 16},
    {DType::kBFloat16, "bfloat16", 2},
}};

const DTypeInfo* find(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

int64_t dtype_size(DType dtype) {
  const auto* info = find(dtype);
  return info ? info->size : 0;
}

bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat64;
}

std::string_view dtype_name(DType dtype) {
  const auto* info = find(dtype);
  return info ? info->name : "unknown";
}

std::optional<DType> dtype_from_onnx(int32_t onnx_type) {
  const auto* info = find(static_cast<DType>(onnx_type));
  if (!info || info->dtype == DType::kUndefined) return std::nullopt;
  return info->dtype;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name && info.dtype != DType::kUndefined) return info.dtype;
  }
  return std::nullopt;
}

}  // namespace stagecraft
