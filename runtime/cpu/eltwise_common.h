#pragma once
/// \file
/// What the CPU backend's elementwise kernel files share (elementwise.cpp, unary_math.cpp,
/// activations.cpp, compare_logic.cpp): element types as stored, dtype dispatch, the unary map
/// and the broadcasting binary loop, oneDNN's eltwise primitive on a flat float32 tensor, and
/// the signature checks every elementwise op starts with.

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/format/error.h"
#include "runtime/ops/pow_element.h"

namespace stagecraft::rt::cpu::eltwise {

/// Add, Sub, Mul and Div: the element-wise arithmetic (elementwise.cpp) and its gradients
/// (grad_eltwise.cpp).
enum class Arith { kAdd, kSub, kMul, kDiv };

/// Unary loops over at least this many elements use all of the worker's threads.
inline constexpr int64_t kParallelElements = int64_t{1} << 15;

/// A bool element as stored: one byte, nonzero for true.
struct BoolByte {
  uint8_t value;
};

/// 16-bit floats as stored (IEEE half, and bfloat16: the top half of a float32). Only Cast and
/// the 16-bit gradient sums (device_ops.cpp) compute with them, through float32.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

/// float16 and bfloat16 to float32, exactly.
inline float to_float(Half h) {
  const uint32_t sign = uint32_t{h.bits & 0x8000u} << 16, exponent = (h.bits >> 10) & 0x1fu,
                 mantissa = h.bits & 0x3ffu;
  if (exponent == 0x1f)
    return std::bit_cast<float>(sign | 0x7f800000u | mantissa << 13);  // inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    float v = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | (exponent + 112) << 23 | mantissa << 13);
}

inline float to_float(BFloat16 b) { return std::bit_cast<float>(uint32_t{b.bits} << 16); }

// float32 to half, rounding to nearest even (beyond the largest half gives inf, NaN stays NaN).
inline Half to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f), magnitude = x & 0x7fffffffu;
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  if (magnitude > 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7e00u)};
  if (magnitude >= 0x477ff000u)
    return {static_cast<uint16_t>(sign | 0x7c00u)};  // 65520 and up round to inf
  if (magnitude <
      0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24 (1024 is 2^-14)
    float units = std::nearbyint(std::bit_cast<float>(magnitude) * 0x1p24f);
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(units))};
  }
  const uint32_t rebiased = magnitude - (112u << 23);  // exponent bias 127 to 15
  return {static_cast<uint16_t>(sign | ((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13))};
}

// float32 to bfloat16, rounding to nearest even (NaN stays NaN).
inline BFloat16 to_bfloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((x >> 16) | 0x40u)};
  return {static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

// double to float rounding to odd (truncate, then set the last bit when inexact): a later
// round-to-nearest to a 16-bit float then gives the same result as rounding the double directly.
inline float to_float_odd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || std::isinf(f) || static_cast<double>(f) == d) return f;
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d))
    --bits;  // rounded away from zero: step back
  return std::bit_cast<float>(bits | 1u);
}

template <class T>
constexpr bool kIs16BitFloat = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Converts one element as Cast does: to bool is "nonzero", floating to integer truncates and
// saturates (NaN gives 0), 16-bit floats round to nearest even, everything else is C++'s
// conversion (integers wrap).
template <class To, class From>
To convert(From v) {
  if constexpr (std::is_same_v<From, BoolByte>) {
    return convert<To>(static_cast<uint8_t>(v.value != 0));
  } else if constexpr (kIs16BitFloat<From>) {
    return convert<To>(to_float(v));
  } else if constexpr (std::is_same_v<To, BoolByte>) {
    return BoolByte{static_cast<uint8_t>(v != From(0))};
  } else if constexpr (kIs16BitFloat<To>) {
    // Through float32, exactly (float32 and small integers) or rounded to odd (the rest).
    float f =
        std::is_same_v<From, float> ? static_cast<float>(v) : to_float_odd(static_cast<double>(v));
    if constexpr (std::is_same_v<To, Half>)
      return to_half(f);
    else
      return to_bfloat16(f);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    if (std::isnan(v)) return 0;
    if (v <= static_cast<From>(std::numeric_limits<To>::lowest()))
      return std::numeric_limits<To>::lowest();
    if (v >= static_cast<From>(std::numeric_limits<To>::max()))
      return std::numeric_limits<To>::max();
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

template <class T>
struct Type {};

/// Calls `body(Type<T>{})` with the C++ type of a numeric dtype (float32, float64 and the
/// signed and unsigned integers of 8 to 64 bits); with `kAll` also of bool, float16 and
/// bfloat16. Throws `Error(kInternal)` for any other dtype (the kernel's check refuses it).
template <bool kAll = false, class Body>
void visit(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::kFloat32:
      return body(Type<float>{});
    case DType::kFloat64:
      return body(Type<double>{});
    case DType::kInt8:
      return body(Type<int8_t>{});
    case DType::kInt16:
      return body(Type<int16_t>{});
    case DType::kInt32:
      return body(Type<int32_t>{});
    case DType::kInt64:
      return body(Type<int64_t>{});
    case DType::kUInt8:
      return body(Type<uint8_t>{});
    case DType::kUInt16:
      return body(Type<uint16_t>{});
    case DType::kUInt32:
      return body(Type<uint32_t>{});
    case DType::kUInt64:
      return body(Type<uint64_t>{});
    default:
      break;
  }
  if constexpr (kAll) {
    switch (dtype) {
      case DType::kBool:
        return body(Type<BoolByte>{});
      case DType::kFloat16:
        return body(Type<Half>{});
      case DType::kBFloat16:
        return body(Type<BFloat16>{});
      default:
        break;
    }
  }
  fail(ErrorKind::kInternal, "an elementwise kernel was called on {}, which its check refuses",
       dtype_name(dtype));
}

/// float32, float64 and the signed and unsigned integers of 8 to 64 bits.
inline bool is_numeric(DType d) {
  switch (d) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
      return true;
    default:
      return false;
  }
}

inline bool is_float(DType d) { return d == DType::kFloat32 || d == DType::kFloat64; }

inline bool is_signed_integer(DType d) {
  return d == DType::kInt8 || d == DType::kInt16 || d == DType::kInt32 || d == DType::kInt64;
}

using ops::Wrap;  // integer arithmetic that wraps (runtime/ops/pow_element.h)

/// y[i] = f(x[i]) for n elements.
template <class In, class Out, class F>
void map(const In* x, Out* y, int64_t n, F f) {
#pragma omp parallel for simd if (parallel : n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

/// The unary op's input, with the output checked to have its shape.
inline const Tensor& unary_input(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  expect_shape(a, 0, x.shape);
  return x;
}

/// A float32 tensor through a oneDNN eltwise primitive (viewed as one flat dim) into output 0;
/// `alpha` and `beta` are the algorithm's parameters (oneDNN's eltwise documentation).
inline void dnnl_eltwise(const KernelArgs& a, const Tensor& x, dnnl::algorithm algorithm,
                         float alpha = 0, float beta = 0) {
  int64_t n = x.numel();
  if (n == 0) return;
  CpuContext& ctx = context(a);
  dnnl::memory::desc md = plain_desc({n});
  dnnl::eltwise_forward::primitive_desc pd(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, algorithm, md, alpha, beta),
      ctx.engine);
  dnnl::memory src(md, ctx.engine, const_cast<std::byte*>(x.data));
  dnnl::memory dst(md, ctx.engine, a.out[0]->data);
  dnnl::eltwise_forward(pd).execute(ctx.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
  ctx.stream.wait();
}

/// A unary float op: float32 through oneDNN's `algorithm` (with `alpha`, `beta`), float64
/// through `f`.
template <dnnl::algorithm algorithm, class F>
void float_unary(const KernelArgs& a, F f, float alpha = 0, float beta = 0) {
  const Tensor& x = unary_input(a);
  if (x.dtype == DType::kFloat32) return dnnl_eltwise(a, x, algorithm, alpha, beta);
  map(x.as<double>(), a.out[0]->as<double>(), x.numel(), f);
}

/// The output of a broadcasting op over its first N inputs, checked to have their broadcast
/// shape.
template <size_t N>
Broadcast<N> broadcast_output(const KernelArgs& a) {
  std::array<Shape, N> shapes;
  Shape out;
  for (size_t k = 0; k < N; ++k) {
    shapes[k] = a.input(k).shape;
    out = k == 0 ? shapes[k] : ops::broadcast_shape(out, shapes[k]);
  }
  expect_shape(a, 0, out);
  return Broadcast<N>(shapes, out);
}

/// z = f(x, y) elementwise with broadcasting; runs are specialised on which side repeats so the
/// inner loops vectorise. z may be x itself when x has the output's shape (each element is read
/// before it is written, by the same iteration).
template <class A, class B, class Out, class F>
void binary_loop(const Broadcast<2>& plan, const A* x, const B* y, Out* z, F f) {
  const bool along_x = plan.step(0) != 0, along_y = plan.step(1) != 0;
  plan.for_each_run([&](int64_t o, const std::array<int64_t, 2>& in, int64_t n) {
    const A* xs = x + in[0];
    const B* ys = y + in[1];
    Out* zs = z + o;
    if (along_x && along_y) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) zs[i] = f(xs[i], ys[i]);
    } else if (along_x) {
      const B v = *ys;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) zs[i] = f(xs[i], v);
    } else if (along_y) {
      const A u = *xs;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) zs[i] = f(u, ys[i]);
    } else {
      std::fill_n(zs, n, f(*xs, *ys));
    }
  });
}

/// "" when the signature has `inputs` inputs (at least `required`) and `outputs` outputs.
inline std::string arity(const OpSignature& s, size_t required, size_t inputs, size_t outputs) {
  if (s.inputs.size() < required || s.inputs.size() > inputs || s.outputs.size() != outputs)
    return fmt::format("{} with {} inputs and {} outputs is not a valid signature", s.op_type,
                       s.inputs.size(), s.outputs.size());
  for (size_t k = 0; k < required; ++k)
    if (s.inputs[k] == DType::kUndefined) return fmt::format("{} needs input {}", s.op_type, k);
  if (s.outputs[0] == DType::kUndefined) return fmt::format("{} needs its output", s.op_type);
  return "";
}

/// "" when the output has the type of input 0.
inline std::string same_output(const OpSignature& s) {
  if (s.outputs[0] != s.inputs[0])
    return fmt::format("{} from {} to {} is not a valid signature", s.op_type,
                       dtype_name(s.inputs[0]), dtype_name(s.outputs[0]));
  return "";
}

/// A unary op on float32 and float64 only, its output of the input's type.
inline std::string check_float_unary(const OpSignature& s) {
  if (auto why = arity(s, 1, 1, 1); !why.empty()) return why;
  if (!is_float(s.inputs[0]))
    return fmt::format("{} on {} is not supported (float32 and float64 only)", s.op_type,
                       dtype_name(s.inputs[0]));
  return same_output(s);
}

}  // namespace stagecraft::rt::cpu::eltwise
