#pragma once
/// \file
/// The compiler asks the backend before it writes a plan: every op of the graph, with its
/// dtypes and attributes, must have a kernel there. Lives in tools/ because it joins the
/// compiler's IR and the runtime's backend table, which never link each other.

#include <string_view>

#include "compiler/ir/graph.h"
#include "runtime/core/backend.h"

namespace stagecraft {

/// Throws `Error(kUnsupported)` naming the first node the backend cannot run and why:
/// "node '/conv1/Conv' (Conv): Conv on float64 is not supported (float32 only) (cpu backend)".
void check_backend_supports(const ir::Graph& graph, const rt::Backend& backend);

}  // namespace stagecraft
