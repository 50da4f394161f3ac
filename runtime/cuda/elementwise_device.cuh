#pragma once
// Device-side pieces the CUDA elementwise kernels share (elementwise_kernels.cu,
// grad_eltwise_kernels.cu; device code only): element types as stored, the CPU's conversions
// (runtime/cpu/elementwise.cpp's `convert`, bit for bit), dtype dispatch and the broadcast walk.
#include <cuda_runtime_api.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "runtime/cuda/elementwise_kernels.h"
#include "runtime/format/dtype.h"
#include "runtime/ops/pow_element.h"

namespace stagecraft::rt::cuda::eltwise {

// A bool element as stored: one byte, nonzero for true.
struct BoolByte {
  uint8_t value;
};
// 16-bit floats as stored (IEEE half, and bfloat16: the top half of a float32).
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <class T>
struct Tag {
  using type = T;
};

// The lowest and highest values of a numeric type (numeric_limits is host-only without
// --expt-relaxed-constexpr).
template <class T>
struct Limits;
#define STAGECRAFT_LIMITS(T, LO, HI)                                 \
  template <>                                                        \
  struct Limits<T> {                                                 \
    __host__ __device__ static constexpr T lowest() { return (LO); } \
    __host__ __device__ static constexpr T max() { return (HI); }    \
  };
STAGECRAFT_LIMITS(float, -FLT_MAX, FLT_MAX)
STAGECRAFT_LIMITS(double, -DBL_MAX, DBL_MAX)
STAGECRAFT_LIMITS(int8_t, INT8_MIN, INT8_MAX)
STAGECRAFT_LIMITS(int16_t, INT16_MIN, INT16_MAX)
STAGECRAFT_LIMITS(int32_t, INT32_MIN, INT32_MAX)
STAGECRAFT_LIMITS(int64_t, INT64_MIN, INT64_MAX)
STAGECRAFT_LIMITS(uint8_t, 0, UINT8_MAX)
STAGECRAFT_LIMITS(uint16_t, 0, UINT16_MAX)
STAGECRAFT_LIMITS(uint32_t, 0, UINT32_MAX)
STAGECRAFT_LIMITS(uint64_t, 0, UINT64_MAX)
#undef STAGECRAFT_LIMITS

using ops::Wrap;  // integer arithmetic that wraps (runtime/ops/pow_element.h)

__device__ __forceinline__ float to_float(Half h) {
  const uint32_t sign = uint32_t{h.bits & 0x8000u} << 16, exponent = (h.bits >> 10) & 0x1fu,
                 mantissa = h.bits & 0x3ffu;
  if (exponent == 0x1f) return __uint_as_float(sign | 0x7f800000u | mantissa << 13);
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float v = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -v : v;
  }
  return __uint_as_float(sign | (exponent + 112) << 23 | mantissa << 13);
}

__device__ __forceinline__ float to_float(BFloat16 b) {
  return __uint_as_float(uint32_t{b.bits} << 16);
}

// float32 to half, rounding to nearest even (beyond the largest half gives inf, NaN stays NaN).
__device__ __forceinline__ Half to_half(float f) {
  const uint32_t x = __float_as_uint(f), magnitude = x & 0x7fffffffu;
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  if (magnitude > 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7e00u)};
  if (magnitude >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};
  if (magnitude < 0x38800000u) {  // a subnormal half, in units of 2^-24
    const float units = rintf(__uint_as_float(magnitude) * 0x1p24f);
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(units))};
  }
  const uint32_t rebiased = magnitude - (112u << 23);
  return {static_cast<uint16_t>(sign | ((rebiased + 0xfffu + ((rebiased >> 13) & 1u)) >> 13))};
}

// float32 to bfloat16, rounding to nearest even (NaN stays NaN).
__device__ __forceinline__ BFloat16 to_bfloat16(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((x >> 16) | 0x40u)};
  return {static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

// double to float rounding to odd, so a later rounding to a 16-bit float is the direct one.
__device__ __forceinline__ float to_float_odd(double d) {
  const float f = static_cast<float>(d);
  if (isnan(d) || isinf(f) || static_cast<double>(f) == d) return f;
  uint32_t bits = __float_as_uint(f);
  if (fabs(static_cast<double>(f)) > fabs(d)) --bits;
  return __uint_as_float(bits | 1u);
}

template <class T>
constexpr bool kIs16BitFloat = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// One element converted as the CPU's Cast converts it.
template <class To, class From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<From, BoolByte>) {
    return convert<To>(static_cast<uint8_t>(v.value != 0));
  } else if constexpr (kIs16BitFloat<From>) {
    return convert<To>(to_float(v));
  } else if constexpr (std::is_same_v<To, BoolByte>) {
    return BoolByte{static_cast<uint8_t>(v != From(0))};
  } else if constexpr (kIs16BitFloat<To>) {
    const float f =
        std::is_same_v<From, float> ? static_cast<float>(v) : to_float_odd(static_cast<double>(v));
    if constexpr (std::is_same_v<To, Half>)
      return to_half(f);
    else
      return to_bfloat16(f);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    if (isnan(v)) return To(0);
    if (v <= static_cast<From>(Limits<To>::lowest())) return Limits<To>::lowest();
    if (v >= static_cast<From>(Limits<To>::max())) return Limits<To>::max();
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

__device__ __forceinline__ int64_t first_index() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() { return int64_t{blockDim.x} * gridDim.x; }

/// 16 bytes of T (8 16-bit floats, 4 float32): one load or store of a vector path.
template <class T>
struct alignas(16) Bytes16 {
  static constexpr int kLanes = 16 / static_cast<int>(sizeof(T));
  T v[kLanes];
};

/// Whether `p` is 16-byte aligned (a vector path's condition).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// body(i) for i in [0, n) where each thread takes 16 bytes at a time: vector(g) for each whole
/// group g of Bytes16<T>::kLanes elements (grid-stride), then one(i) for the tail's elements.
template <class T, class Vector, class One>
__device__ __forceinline__ void for_vectors(int64_t n, Vector vector, One one) {
  constexpr int L = Bytes16<T>::kLanes;
  const int64_t groups = n / L;
  for (int64_t g = first_index(); g < groups; g += grid_stride()) vector(g);
  for (int64_t i = groups * L + first_index(); i < n; i += grid_stride()) one(i);
}

// The offsets of output element i in the first N inputs of `map`.
template <int N>
__device__ __forceinline__ void broadcast_offsets(const BroadcastMap& map, int64_t i,
                                                  int64_t (&at)[N]) {
  if (map.rank == 1) {
    for (int k = 0; k < N; ++k) at[k] = i * map.strides[k][0];
    return;
  }
  for (int k = 0; k < N; ++k) at[k] = 0;
  for (int d = map.rank - 1; d >= 0; --d) {
    const int64_t c = i % map.dims[d];
    i /= map.dims[d];
    for (int k = 0; k < N; ++k) at[k] += c * map.strides[k][d];
  }
}

// Calls body(Tag<H>{}) for a 16-bit float dtype; false for any other.
template <class Body>
bool visit16(DType dtype, Body&& body) {
  if (dtype == DType::kBFloat16) return body(Tag<BFloat16>{}), true;
  if (dtype == DType::kFloat16) return body(Tag<Half>{}), true;
  return false;
}

// Calls body(Tag<T>{}) with the C++ type of a numeric dtype; with kAll also of bool, float16
// and bfloat16. False (nothing called) for any other dtype.
template <bool kAll, class Body>
bool visit(DType dtype, Body&& body) {
  switch (dtype) {
    case DType::kFloat32:
      return body(Tag<float>{}), true;
    case DType::kFloat64:
      return body(Tag<double>{}), true;
    case DType::kInt8:
      return body(Tag<int8_t>{}), true;
    case DType::kInt16:
      return body(Tag<int16_t>{}), true;
    case DType::kInt32:
      return body(Tag<int32_t>{}), true;
    case DType::kInt64:
      return body(Tag<int64_t>{}), true;
    case DType::kUInt8:
      return body(Tag<uint8_t>{}), true;
    case DType::kUInt16:
      return body(Tag<uint16_t>{}), true;
    case DType::kUInt32:
      return body(Tag<uint32_t>{}), true;
    case DType::kUInt64:
      return body(Tag<uint64_t>{}), true;
    default:
      break;
  }
  if constexpr (kAll) {
    switch (dtype) {
      case DType::kBool:
        return body(Tag<BoolByte>{}), true;
      case DType::kFloat16:
        return body(Tag<Half>{}), true;
      case DType::kBFloat16:
        return body(Tag<BFloat16>{}), true;
      default:
        break;
    }
  }
  return false;
}

// Calls body(Tag<W>{}) with an unsigned word of `bytes` bytes (1, 2, 4 or 8); false otherwise.
template <class Body>
bool by_size(int64_t bytes, Body&& body) {
  switch (bytes) {
    case 1:
      return body(Tag<uint8_t>{}), true;
    case 2:
      return body(Tag<uint16_t>{}), true;
    case 4:
      return body(Tag<uint32_t>{}), true;
    case 8:
      return body(Tag<uint64_t>{}), true;
    default:
      return false;
  }
}

}  // namespace stagecraft::rt::cuda::eltwise
