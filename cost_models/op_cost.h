#pragma once
/// \file
/// Analytic work of one op at its bound shapes: floating-point operations and bytes moved.
/// The roofline time model (and, later, measured profiles) build on these counts.

#include <cstdint>

#include "compiler/ir/graph.h"

namespace stagecraft::cost {

/// Forward work of one node.
struct OpWork {
  double flops = 0;       ///< Floating-point operations (a multiply-add counts as 2).
  double bytes_read = 0;  ///< Bytes of every input (weights included).
  double bytes_written = 0;
};

/// The forward work of `node` (shapes must be static), by the FLOP rule of its ops.def line.
/// Conventions: MatMul, Gemm and Conv count 2 per multiply-add plus bias adds; element-wise ops
/// a small constant per output element (1 for arithmetic, more for transcendental ones); norms
/// and softmax a small constant per element; layout ops (Reshape, Transpose, Gather...) 0 FLOPs.
/// An op outside the table has 0 FLOPs.
OpWork forward_work(const ir::Graph& graph, const ir::Node& node);

}  // namespace stagecraft::cost
