#pragma once
/// \file
/// Element types. The numeric values are ONNX's `TensorProto.DataType`, so a dtype read from a
/// model or written into a plan needs no translation table.

#include <cstdint>
#include <optional>
#include <string_view>

namespace stagecraft {

enum class DType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
};

/// Bytes per element; 0 for types without a fixed size (string, undefined).
int64_t dtype_size(DType dtype);

/// True for the floating-point element types (float16, bfloat16, float32, float64).
bool is_floating(DType dtype);

/// True for the two 16-bit float types (bfloat16, float16): the storage of mixed and fp16
/// plans, which kernels widen to float32 where they have no 16-bit path.
constexpr bool is_16bit_float(DType dtype) {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

/// Lower-case name as in ONNX ("float32", "int64", "bfloat16").
std::string_view dtype_name(DType dtype);

/// The dtype of an ONNX `TensorProto.DataType` number, or nullopt when it is none we know.
std::optional<DType> dtype_from_onnx(int32_t onnx_type);

/// The dtype named as `dtype_name` prints it, or nullopt.
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace stagecraft
