#pragma once
/// \file
/// Pow on integers, one element at a time, as a plain inline function that the host compiler
/// builds for the CPU backend (runtime/cpu/elementwise.cpp) and nvcc for the CUDA one
/// (runtime/cuda/elementwise_kernels.cu), so both backends raise integers alike: wrapping, and
/// a negative exponent truncated. Nothing here includes a CUDA header.

#include <type_traits>

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::ops {

/// Integer arithmetic in an unsigned type at least as wide as int, so it wraps instead of
/// overflowing (also for 8- and 16-bit types, which C++ would promote to a signed int).
template <class T>
using Wrap = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

/// x to the power e for integers, by repeated squaring (wrapping). A negative exponent gives
/// the truncated 1 / x^-e: 1 or -1 for a base of 1 or -1, else 0.
template <class T, class E>
STAGECRAFT_HOST_DEVICE T int_pow(T x, E e) {
  using U = Wrap<T>;
  if constexpr (std::is_signed_v<E>) {
    if (e < 0) {
      if (x == T(1)) return T(1);
      if constexpr (std::is_signed_v<T>)
        if (x == T(-1)) return (e & 1) ? T(-1) : T(1);
      return T(0);
    }
  }
  U result = 1, base = U(x);
  for (auto n = static_cast<std::make_unsigned_t<E>>(e); n != 0; n >>= 1) {
    if (n & 1) result *= base;
    base *= base;
  }
  return static_cast<T>(result);
}

}  // namespace stagecraft::rt::ops
