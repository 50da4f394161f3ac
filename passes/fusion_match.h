#pragma once
/// \file
/// What the fusion passes (fuse-attention, fuse-gelu) ask of a graph while they match a pattern
/// as exporters spell it: who writes a value, whether the fused node may drop it, and the value
/// of a scalar constant.

#include <cstring>
#include <optional>

#include "compiler/ir/graph.h"

namespace stagecraft::passes::fusion {

/// The node writing `v`, or null for an omitted value, an input or an initializer.
inline const ir::Node* producer(const ir::Graph& g, ir::ValueId v) {
  if (v == ir::kNoId) return nullptr;
  const ir::NodeId p = g.value(v).producer;
  return p == ir::kNoId ? nullptr : &g.node(p);
}

/// Whether `v` is read only by one node and is not a graph output: a fused node may drop it.
inline bool private_value(const ir::Graph& g, ir::ValueId v) {
  const ir::Value& value = g.value(v);
  return value.consumers.size() == 1 && !value.is_graph_output;
}

/// The one element of a float32 or float64 constant, or nullopt.
inline std::optional<double> scalar_constant(const ir::Graph& g, ir::ValueId v) {
  if (v == ir::kNoId) return std::nullopt;
  const ir::Value& value = g.value(v);
  if (!value.is_initializer() || !value.shape_known || value.numel() != 1) return std::nullopt;
  const auto bytes = value.initializer->bytes();
  if (value.dtype == DType::kFloat32 && bytes.size() == sizeof(float)) {
    float f;
    std::memcpy(&f, bytes.data(), sizeof f);
    return f;
  }
  if (value.dtype == DType::kFloat64 && bytes.size() == sizeof(double)) {
    double d;
    std::memcpy(&d, bytes.data(), sizeof d);
    return d;
  }
  return std::nullopt;
}

}  // namespace stagecraft::passes::fusion
