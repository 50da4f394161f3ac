#pragma once
/// \file
/// Device kernels of the CUDA elementwise gradients (grad_eltwise_kernels.cu), float32, with
/// the formulas of the CPU backend's grad_eltwise, activations, leaky_relu, unary_math and
/// compare_logic families. A binary op's gradient is computed per output element here;
/// grad_eltwise_common.h sums it back to a broadcast input's shape. Every launch is queued on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/cuda/elementwise_kernels.h"

namespace stagecraft::rt::cuda {

enum class UnaryGradOp : int32_t {
  kRelu,
  kSigmoid,  // uses y (recomputed from x when null), as do kTanh and kSqrt
  kTanh,
  kSqrt,
  kErf,
  kHardSigmoid,  // alpha, beta
  kHardSwish,
  kClip,        // passes where lo < x < hi
  kLeakyRelu,   // alpha
  kExp,         // dy * y (y recomputed from x when null)
  kLog,         // dy / x
  kReciprocal,  // -dy * y * y (y recomputed from x when null)
  kNeg,         // -dy
  kAbs,         // dy * sign(x), 0 at 0
  kZero,        // 0 (Ceil, Floor, Sign, Round)
  kElu,         // x > 0 ? dy : dy * alpha * e^x
  kSelu,        // gamma times Elu's
  kSoftplus,    // dy * sigmoid(x)
  kGelu,        // dy * (Phi(x) + x * phi(x)), from x alone
  kGeluTanh,    // dy times the tanh approximation's derivative, from x alone
  kCelu,        // x > 0 ? dy : dy * e^(x / alpha)
  kSin,         // dy * cos(x)
  kCos,         // -dy * sin(x)
};

/// A unary gradient's attributes. Clip's lower bound is `lo` when `lo_attr`, else `*lo_ptr`
/// (a device float) when not null, else -inf (likewise `hi`, +inf).
struct UnaryGradParams {
  float alpha = 0, beta = 0, gamma = 0;
  bool lo_attr = false, hi_attr = false;
  float lo = 0, hi = 0;
  const float* lo_ptr = nullptr;
  const float* hi_ptr = nullptr;
};

/// dx[i] = g(x[i], y[i], dy[i]) for n elements; `y` (the forward output) may be null.
void launch_unary_grad(UnaryGradOp op, const float* x, const float* y, const float* dy, float* dx,
                       int64_t n, const UnaryGradParams& params, cudaStream_t stream);

/// The same on 16-bit floats: x, y (may be null) and dy of `dtype` (bfloat16 or float16), each
/// widened exactly, the float32 formula, dx rounded to nearest even into `dtype`, as the widened
/// fallback computes. Relu, Sigmoid, Tanh, HardSigmoid, HardSwish, Elu, Selu, Gelu and
/// GeluTanh; false (nothing launched) for another op or dtype.
bool launch_unary_grad(UnaryGradOp op, DType dtype, const void* x, const void* y, const void* dy,
                       void* dx, int64_t n, const UnaryGradParams& params, cudaStream_t stream);

enum class BinaryGradOp : int32_t {
  kPass,     // dy (Add's and Sub's lhs, Add's rhs)
  kNegate,   // -dy (Sub's rhs)
  kMulLhs,   // dy * rhs
  kMulRhs,   // dy * lhs
  kDivLhs,   // dy / rhs
  kDivRhs,   // -dy * lhs / rhs^2
  kPowBase,  // dy * e * base^(e - 1)
  kPowExp,   // base > 0 ? dy * y * ln(base) : 0, y recomputed as base^e when null
  kPReluX,      // x > 0 ? dy : dy * slope (lhs x, rhs slope)
  kPReluSlope,  // x > 0 ? 0 : dy * x
  kFmodRhs,     // -dy * trunc(lhs / rhs) (Mod's divisor; its dividend is kPass)
};

/// out[i] = g(lhs, rhs, y[i], dy[i]) for the n output elements, lhs read as input 0 of `map`
/// and rhs as input 1; `y` and `dy` are dense over the output (`y` may be null).
void launch_binary_grad(BinaryGradOp op, const float* lhs, const float* rhs, const float* y,
                        const float* dy, float* out, int64_t n, const BroadcastMap& map,
                        cudaStream_t stream);

/// Min and Max: ties[i] = (accumulate ? ties[i] : 0) + (x[at] == y[i] ? 1 : 0) over the n output
/// elements, x read as input 0 of `map` and y dense.
void launch_tie_count(const float* x, const float* y, float* ties, int64_t n,
                      const BroadcastMap& map, bool accumulate, cudaStream_t stream);

/// Min and Max: out[i] = x[at] == y[i] ? dy[i] / ties[i] : 0 over the n output elements, x read as
/// input 0 of `map` and y, dy, ties dense.
void launch_min_max_grad(const float* x, const float* y, const float* dy, const float* ties,
                         float* out, int64_t n, const BroadcastMap& map, cudaStream_t stream);

/// out[i] = (condition != 0) == take_true ? dy[i] : 0 for the n output elements, the condition
/// read as input 0 of `map`.
void launch_where_grad(const uint8_t* condition, const float* dy, float* out, int64_t n,
                       const BroadcastMap& map, bool take_true, cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
