#pragma once
/// \file
/// The pass pipelines the compiler runs.

#include "passes/pass.h"

namespace stagecraft::passes {

/// After import with every dim bound: fold the shape subgraphs exporters emit into constants
/// and infer every shape that follows from them.
void run_import_pipeline(ir::Graph& graph, PassContext& context);

/// Throws `Error(kShape)` naming the first tensor whose shape or dtype is still unknown, or
/// whose element count overflows int64.
void require_static_shapes(const ir::Graph& graph);

/// With every shape static: throws `Error(kModel)` naming the node and the numbers for what
/// ONNX's shape inference lets through but no kernel can run: a Conv group that does not divide
/// the channels (or a weight whose channels do not match it), an axis out of range (Gather,
/// Concat, Split, Softmax, LayerNormalization, Flatten, Squeeze, Unsqueeze, reductions) or
/// listed twice, a Reshape (or other view) that changes the element count, and a constant Gather
/// index outside its dim.
void check_node_shapes(const ir::Graph& graph);

}  // namespace stagecraft::passes
