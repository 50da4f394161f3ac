#pragma once
/// \file
/// The ordered comparisons Greater, Less, GreaterOrEqual and LessOrEqual one element at a time,
/// one template that the host compiler builds for the CPU backend (runtime/cpu/compare_logic.cpp)
/// and nvcc for the CUDA one (runtime/cuda/elementwise_kernels.cu). Each is its own IEEE
/// comparison: with a NaN operand all four are false (so x >= y is not !(x < y)), as ONNX and
/// numpy say. Nothing here includes a CUDA header.

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::ops {

enum class Comparison { kGreater, kLess, kGreaterOrEqual, kLessOrEqual };

/// u OP v for the comparison kWhich.
template <Comparison kWhich, class T>
STAGECRAFT_HOST_DEVICE bool compare(T u, T v) {
  if constexpr (kWhich == Comparison::kGreater) return u > v;
  if constexpr (kWhich == Comparison::kLess) return u < v;
  if constexpr (kWhich == Comparison::kGreaterOrEqual) return u >= v;
  return u <= v;
}

}  // namespace stagecraft::rt::ops
