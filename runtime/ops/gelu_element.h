#pragma once
/// \file
/// The fused Gelu (domain ai.stagecraft, written by passes/fuse_gelu.cpp) one element at a
/// time, as plain inline functions that the host compiler builds for the CPU backend
/// (runtime/cpu/activations.cpp) and nvcc for the CUDA one (runtime/cuda/elementwise_kernels.cu,
/// grad_eltwise_kernels.cu), so both backends compute it alike. Nothing here includes a CUDA
/// header.
///
/// Attribute `approximate` as ONNX opset 20's Gelu:
///   "none": y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2));
///   "tanh": y = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
/// The gradients read x alone (no intermediate of the forward is kept):
///   "none": dy * (Phi(x) + x phi(x)), phi(x) = e^(-x^2 / 2) / sqrt(2 pi);
///   "tanh": dy * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2)).

#include <cmath>
#include <type_traits>

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::ops {

inline constexpr double kGeluSqrtHalf = 0.70710678118654752440;     // 1 / sqrt(2)
inline constexpr double kGeluSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
inline constexpr double kGeluInvSqrt2Pi = 0.39894228040143267794;   // 1 / sqrt(2 pi)
inline constexpr double kGeluKappa = 0.044715;

// The float overloads by their C names, which nvcc's device code and the host both have.
STAGECRAFT_HOST_DEVICE inline float gelu_erf_of(float v) { return erff(v); }
STAGECRAFT_HOST_DEVICE inline double gelu_erf_of(double v) { return erf(v); }
STAGECRAFT_HOST_DEVICE inline float gelu_tanh_of(float v) { return tanhf(v); }
STAGECRAFT_HOST_DEVICE inline double gelu_tanh_of(double v) { return tanh(v); }
STAGECRAFT_HOST_DEVICE inline float gelu_exp_of(float v) { return expf(v); }
STAGECRAFT_HOST_DEVICE inline double gelu_exp_of(double v) { return exp(v); }

/// y for approximate "none".
template <class T>
STAGECRAFT_HOST_DEVICE T gelu(T x) {
  return T(0.5) * x * (T(1) + gelu_erf_of(x * T(kGeluSqrtHalf)));
}

/// y for approximate "tanh".
template <class T>
STAGECRAFT_HOST_DEVICE T gelu_tanh(T x) {
  const T inner = T(kGeluSqrt2OverPi) * (x + T(kGeluKappa) * x * x * x);
  return T(0.5) * x * (T(1) + gelu_tanh_of(inner));
}

/// dy/dx for approximate "none".
template <class T>
STAGECRAFT_HOST_DEVICE T gelu_derivative(T x) {
  const T cdf = T(0.5) * (T(1) + gelu_erf_of(x * T(kGeluSqrtHalf)));
  const T pdf = T(kGeluInvSqrt2Pi) * gelu_exp_of(T(-0.5) * x * x);
  return cdf + x * pdf;
}

/// dy/dx for approximate "tanh".
template <class T>
STAGECRAFT_HOST_DEVICE T gelu_tanh_derivative(T x) {
  const T x2 = x * x;
  const T t = gelu_tanh_of(T(kGeluSqrt2OverPi) * (x + T(kGeluKappa) * x2 * x));
  const T dinner = T(kGeluSqrt2OverPi) * (T(1) + T(3 * kGeluKappa) * x2);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner;
}

}  // namespace stagecraft::rt::ops
