#pragma once
/// \file
/// The reductions both backends name, in one place for host and device code (plain enums with
/// an int32 representation, so a kernel takes them by value): the Reduce* ops' reduction
/// (reduce_shape.h reads it off the op type) and a loss's `reduction` attribute
/// (SoftmaxCrossEntropyLoss: `loss_reduction_of`).

#include <cstdint>

namespace stagecraft::rt::ops {

/// ReduceSum, Max, Min, Prod, L1, L2, SumSquare, LogSum, LogSumExp (and their gradients).
enum class Reduction : int32_t { kSum, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };

/// A loss's reduction over its positions: ONNX's "none", "sum", "mean".
enum class LossReduction : int32_t { kNone, kSum, kMean };

}  // namespace stagecraft::rt::ops
