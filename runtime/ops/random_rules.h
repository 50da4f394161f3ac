#pragma once
/// \file
/// The random ops' host-side rules both backends read a node with (runtime/cpu/random.cpp,
/// runtime/cuda/random.cpp): the distribution from the attributes, the output's shape, and the
/// one check both answer with.

#include <fmt/format.h>

#include <string>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/random_element.h"

namespace stagecraft::rt::ops {

/// Whether `op` draws from a normal distribution (RandomNormal, RandomNormalLike) rather than a
/// uniform one.
inline bool random_is_normal(std::string_view op) { return op.starts_with("RandomNormal"); }

/// Whether `op` takes its shape (and by default its type) from an input (the *Like ops).
inline bool random_is_like(std::string_view op) { return op.ends_with("Like"); }

/// The node's distribution: mean and scale (defaults 0, 1), or low and high (0, 1).
inline RandomParams random_params(const KernelArgs& a) {
  RandomParams p;
  p.normal = random_is_normal(a.op_type);
  if (p.normal) {
    p.a = a.attrs.f("mean", 0.0f);
    p.b = a.attrs.f("scale", 1.0f);
  } else {
    p.a = a.attrs.f("low", 0.0f);
    p.b = static_cast<double>(a.attrs.f("high", 1.0f)) - p.a;
  }
  return p;
}

/// The output's shape, checked against the node's: the input's (the *Like ops) or the `shape`
/// attribute's; `Error(kShape)` naming the op otherwise.
inline void expect_random_shape(const KernelArgs& a) {
  const Shape want = random_is_like(a.op_type) ? a.input(0).shape : Shape(a.attrs.ints("shape"));
  expect_shape(a, 0, want);
}

/// The node's key in this run.
inline uint64_t random_key_of(const KernelArgs& a) {
  return random_node_key(a.random_key, a.attrs.f("seed", 0.0f));
}

/// Both backends' check: one input for the *Like ops (of any type: only its shape is read),
/// none for the others; a float32 or float64 output.
inline std::string check_random(const OpSignature& s) {
  const size_t inputs = random_is_like(s.op_type) ? 1 : 0;
  if (s.inputs.size() != inputs || s.outputs.size() != 1)
    return fmt::format("{} with {} inputs and {} outputs is not a valid signature", s.op_type,
                       s.inputs.size(), s.outputs.size());
  if (s.outputs[0] != DType::kFloat32 && s.outputs[0] != DType::kFloat64)
    return fmt::format("{} drawing {} is not supported (float32 and float64 only)", s.op_type,
                       dtype_name(s.outputs[0]));
  return "";
}

}  // namespace stagecraft::rt::ops
