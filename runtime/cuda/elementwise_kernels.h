#pragma once
/// \file
/// Device kernels of the CUDA elementwise families (elementwise_kernels.cu), mirroring the CPU
/// backend's elementwise, activations, leaky_relu, unary_math and compare_logic families
/// element for element: unary maths,
/// Clip, LeakyRelu, Cast between every pair of numeric, bool, float16 and bfloat16 types, the
/// binary ops with numpy broadcasting (Add, Sub, Mul, Div, Pow, Equal), Where and a fill. Every
/// launch is a grid-stride loop with int64 indices queued on `stream`; the host side
/// (elementwise_common.h and each family's .cpp) validates shapes and dtypes and builds the broadcast
/// maps. A launcher returns false (launching nothing) for a dtype it has no kernel for.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/format/dtype.h"

namespace stagecraft::rt::cuda {

/// The highest rank a broadcast map handles (after size-1 dims are dropped and dims that every
/// input reads alike are merged).
inline constexpr int kMaxBroadcastRank = 8;

/// How up to three inputs are read along a dense row-major output over `dims`: the output
/// element with coordinate c reads input k at `sum(c[d] * strides[k][d])` (a stride is 0 along
/// a dim the input repeats). Passed to kernels by value.
struct BroadcastMap {
  int32_t rank = 0;
  int64_t dims[kMaxBroadcastRank] = {};
  int64_t strides[3][kMaxBroadcastRank] = {};
};

enum class UnaryOp : int32_t {
  kRelu,     // float32, float64, signed integers
  kSigmoid,  // float32, float64 (as the rest down to kHardSwish)
  kTanh,
  kSqrt,
  kErf,
  kHardSigmoid,  // alpha, beta
  kHardSwish,
  kLeakyRelu,  // alpha
  kClip,       // every numeric type; the bounds below
  kExp,        // float32, float64 (as kLog, kCeil, kFloor)
  kLog,
  kNeg,  // float32, float64, signed integers (wrapping)
  kAbs,  // every numeric type (signed integers wrapping)
  kCeil,
  kFloor,
  kReciprocal,  // float32, float64
  kElu,         // float32, float64 (as kSelu, kSoftplus); alpha
  kSelu,        // alpha, gamma
  kSoftplus,    // log(1 + e^x)
  kGelu,        // x * Phi(x) (the fused Gelu of passes/fuse_gelu.cpp, approximate "none")
  kGeluTanh,    // its tanh approximation (approximate "tanh")
  kCelu,        // float32, float64: x > 0 ? x : alpha (e^(x / alpha) - 1)
  kSin,         // float32, float64 (as kCos, kSign, kRound)
  kCos,
  kSign,   // -1, 0 or 1; NaN stays NaN
  kRound,  // to the nearest integer, halves to even
};

/// A unary op's attributes. Clip's lower bound is `lo` when `lo_attr`, else `*lo_ptr` (a device
/// element of the input's type) when not null, else the type's lowest value (likewise `hi`).
struct UnaryParams {
  float alpha = 0, beta = 0, gamma = 0;
  bool lo_attr = false, hi_attr = false;
  float lo = 0, hi = 0;
  const void* lo_ptr = nullptr;
  const void* hi_ptr = nullptr;
};

/// y[i] = op(x[i]) for n elements of `dtype` (y of the same type).
bool launch_unary(UnaryOp op, DType dtype, const void* x, void* y, int64_t n,
                  const UnaryParams& params, cudaStream_t stream);

/// y[i] = x[i] converted as the CPU's Cast converts (to bool is "nonzero", float to integer
/// truncates and saturates with NaN giving 0, 16-bit floats round to nearest even, integers
/// wrap). `from` and `to` are numeric types, bool, float16 or bfloat16.
bool launch_cast(DType from, DType to, const void* x, void* y, int64_t n, cudaStream_t stream);

enum class BinaryOp : int32_t {
  kAdd,  // numeric, both inputs and the output of one type; integers wrap
  kSub,
  kMul,
  kDiv,      // integer Div truncates (the host refuses zero divisors)
  kPow,      // base float32, float64, int32 or int64; exponent any numeric type; output the base's
  kEqual,    // numeric or bool inputs of one type; a bool (one byte) output
  kPRelu,    // x > 0 ? x : slope * x, float32 and float64 (the slope is input 1)
  kGreater,  // numeric inputs of one type; a bool output (as kLess and the two below)
  kLess,
  kGreaterOrEqual,
  kLessOrEqual,
  kAnd,  // bool inputs and output (as kOr)
  kOr,
  kMin,  // numeric, both inputs and the output of one type; NaN propagates (as kMax)
  kMax,
  kMod,   // numeric; floored (the divisor's sign); integers only (the host refuses zero divisors)
  kFmod,  // numeric; truncated (the dividend's sign, C's fmod)
};

/// z = op(x, y) over n output elements, x (of `x_dtype`) read as input 0 of `map` and y (of
/// `y_dtype`) as input 1.
bool launch_binary(BinaryOp op, DType x_dtype, DType y_dtype, const void* x, const void* y, void* z,
                   int64_t n, const BroadcastMap& map, cudaStream_t stream);

/// y[i] = !x[i] for n bools.
bool launch_not(const uint8_t* x, uint8_t* y, int64_t n, cudaStream_t stream);

/// y[i] = whether x[i] (float32 or float64) is NaN (`nan`), else +inf (`pos`) or -inf (`neg`):
/// IsNaN and IsInf. False for another dtype.
bool launch_is_special(DType dtype, const void* x, uint8_t* y, int64_t n, bool nan, bool pos,
                       bool neg, cudaStream_t stream);

/// z = condition ? x : y over n output elements of `element_bytes` (1, 2, 4 or 8) bytes, the
/// condition (bools) read as input 0 of `map`, x as input 1 and y as input 2.
bool launch_where(int64_t element_bytes, const uint8_t* condition, const void* x, const void* y,
                  void* z, int64_t n, const BroadcastMap& map, cudaStream_t stream);

/// Every one of n elements of `element_bytes` (1, 2, 4 or 8) bytes set to the low bytes of
/// `bits`.
bool launch_fill(void* dst, int64_t element_bytes, uint64_t bits, int64_t n, cudaStream_t stream);

/// Dropout in training mode on float32: y = x / (1 - ratio) where runtime/ops/dropout_mask.h's
/// `dropout_keeps(node_key, i, ratio)`, else 0; `mask` (bool, may be null) says which.
void launch_dropout_training(const float* x, float* y, uint8_t* mask, int64_t n, uint64_t node_key,
                             float ratio, cudaStream_t stream);

/// Its gradient: dx = dy / (1 - ratio) where the forward's mask kept the element, else 0.
void launch_dropout_grad(const float* dy, const uint8_t* mask, float* dx, int64_t n, float ratio,
                         cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
