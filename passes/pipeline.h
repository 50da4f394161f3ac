#pragma once
/// \file
/// The pass pipelines the compiler runs.

#include "passes/pass.h"

namespace stagecraft::passes {

/// After import with every dim bound: fold the shape subgraphs exporters emit into constants,
/// and make every tensor's shape static. Throws `Error(kShape)` naming a tensor whose shape
/// stays unknown.
void run_import_pipeline(ir::Graph& graph, PassContext& context);

}  // namespace stagecraft::passes
