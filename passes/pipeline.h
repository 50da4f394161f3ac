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

}  // namespace stagecraft::passes
