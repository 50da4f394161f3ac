#include "passes/pipeline.h"

#include "passes/passes.h"
#include "runtime/format/error.h"

namespace stagecraft::passes {
namespace {

/// Runs `steps` in turn until none changes the graph, at most `max_rounds` times.
void run_until_fixed_point(ir::Graph& graph, PassContext& context,
                           const std::vector<const Pass*>& steps, int max_rounds) {
  for (int round = 0; round < max_rounds; ++round) {
    bool changed = false;
    for (const Pass* p : steps) changed |= p->run(graph, context);
    if (!changed) return;
  }
}

}  // namespace

void require_static_shapes(const ir::Graph& graph) {
  for (ir::NodeId id : graph.topological_order()) {
    const ir::Node& node = graph.node(id);
    for (ir::ValueId out : node.outputs) {
      if (out == ir::kNoId) continue;
      const ir::Value& v = graph.value(out);
      if (!v.shape_known || v.dtype == DType::kUndefined) {
        fail(ErrorKind::kShape,
             "tensor '{}' written by {} has no static shape after every dim was bound "
             "(its shape depends on data, or an input dim is still unknown)",
             v.name, node.describe(graph));
      }
      v.numel();  // throws on overflow
    }
  }
}

void run_import_pipeline(ir::Graph& graph, PassContext& context) {
  const ConstantToInitializer constant_to_initializer;
  const DropIdentity drop_identity;
  const FoldConstants fold_constants;
  const InferShapes infer_shapes;
  const DeadCode dead_code;

  // Constant nodes are weights in disguise: as initializers, folding can see through them.
  constant_to_initializer.run(graph, context);
  // Identity only renames; removing it exposes constants and shortens chains.
  drop_identity.run(graph, context);
  // Folding makes Reshape/Expand/Slice targets constant, which lets shape inference fill in
  // shapes, which lets more Shape nodes fold: repeat, bounded (real exports settle in 2-3).
  run_until_fixed_point(graph, context, {&fold_constants, &infer_shapes}, 8);
  // Shape subgraphs whose results were folded are now unread.
  dead_code.run(graph, context);
  graph.compact();
}

}  // namespace stagecraft::passes
