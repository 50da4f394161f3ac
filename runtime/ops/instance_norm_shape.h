#pragma once
/// \file
/// InstanceNormalization's operands, shared by the CPU kernels (runtime/cpu/instance_norm.cpp) and
/// the CUDA ones (runtime/cuda/instance_norm.cpp): X [N, C, spatial...] (rank 2 or more), scale [C]
/// and B [C], each (n, c) plane normalised with its own mean and biased variance:
///   y = scale[c] * (x - mean) / sqrt(var + epsilon) + B[c].
/// A refusal is one line naming the node and the shapes.

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::ops {

/// The planes of one InstanceNormalization: `planes` = N * C of `size` elements each.
struct InstanceNormShape {
  int64_t n = 0, c = 0, size = 0;
  int64_t planes() const { return n * c; }
};

/// X, scale and B checked against each other.
inline InstanceNormShape instance_norm_shape(const KernelArgs& a, const Tensor& x,
                                             const Tensor& scale, const Tensor& bias) {
  if (x.rank() < 2)
    fail(ErrorKind::kModel, "{} '{}': the input {} needs rank 2 or more ([N, C, ...])", a.op_type,
         a.name, x.describe());
  InstanceNormShape s{x.shape[0], x.shape[1], 1};
  for (size_t d = 2; d < x.shape.size(); ++d) s.size *= x.shape[d];
  for (const Tensor* t : {&scale, &bias})
    if (t->shape != Shape{s.c})
      fail(ErrorKind::kModel, "{} '{}': {} {} should be [{}], one value per channel of {}",
           a.op_type, a.name, t == &scale ? "scale" : "B", t->describe(), s.c, x.describe());
  return s;
}

/// InstanceNormalizationGrad's operand counts: X, scale, B; Y.
inline constexpr GradArity kInstanceNormGradArity{.n_min = 3, .n_max = 3, .m_min = 1, .m_max = 1};

}  // namespace stagecraft::rt::ops
