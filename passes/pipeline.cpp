#include "passes/pipeline.h"

#include "passes/passes.h"
#include "runtime/format/error.h"

#include <algorithm>
#include <set>
#include <string>

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

bool has_static_shape(const ir::Value& v) { return v.shape_known && v.dtype != DType::kUndefined; }

/// The graph inputs `from` is computed from (itself when it is one), in name order.
std::set<std::string> graph_inputs_behind(const ir::Graph& graph, ir::ValueId from) {
  std::set<std::string> found;
  std::set<ir::ValueId> seen;
  std::vector<ir::ValueId> stack{from};
  while (!stack.empty()) {
    ir::ValueId id = stack.back();
    stack.pop_back();
    if (id == ir::kNoId || !seen.insert(id).second) continue;
    const ir::Value& v = graph.value(id);
    if (v.is_graph_input) found.insert(v.name);
    if (v.producer != ir::kNoId)
      for (ir::ValueId in : graph.node(v.producer).inputs) stack.push_back(in);
  }
  return found;
}

/// Why `node`'s output has no static shape although every input of `node` has one: the
/// graph inputs whose values (not shapes) reach its shape-giving inputs, as "input 'a', 'b'".
std::string data_dependence(const ir::Graph& graph, const ir::Node& node) {
  // Reshape, Expand, Slice, Tile, Pad, Resize, TopK...: input 0 is the data, the others say
  // the shape. ConstantOfShape, Range, NonZero and their kind read shape from every input.
  std::set<std::string> inputs;
  for (std::size_t k = 0; k < node.inputs.size(); ++k) {
    ir::ValueId in = node.inputs[k];
    if (in == ir::kNoId || graph.value(in).is_initializer()) continue;
    if (k == 0 && node.inputs.size() > 1) continue;
    for (auto& name : graph_inputs_behind(graph, in)) inputs.insert(name);
  }
  if (inputs.empty())
    for (ir::ValueId in : node.inputs)
      if (in != ir::kNoId)
        for (auto& name : graph_inputs_behind(graph, in)) inputs.insert(name);
  std::string list;
  for (const auto& name : inputs) list += (list.empty() ? "'" : ", '") + name + "'";
  return list.empty() ? "no graph input (a value the shape rules cannot follow)"
                      : (inputs.size() == 1 ? "the values of input " : "the values of inputs ") + list;
}

}  // namespace

void require_static_shapes(const ir::Graph& graph) {
  for (ir::NodeId id : graph.topological_order()) {
    const ir::Node& node = graph.node(id);
    for (ir::ValueId out : node.outputs) {
      if (out == ir::kNoId) continue;
      const ir::Value& v = graph.value(out);
      if (!has_static_shape(v)) {
        // In topological order the first such tensor is where the unknown shape starts: every
        // input of its node is static, so what is missing is a value only data can give.
        bool inputs_static = std::all_of(node.inputs.begin(), node.inputs.end(), [&](ir::ValueId in) {
          return in == ir::kNoId || has_static_shape(graph.value(in));
        });
        fail(ErrorKind::kShape,
             "tensor '{}' written by {} has no static shape after every dim was bound: {}; a static plan "
             "needs shapes that follow from the bound dims alone",
             v.name, node.describe(graph),
             inputs_static ? "its shape depends on " + data_dependence(graph, node)
                           : std::string("an input of the node has no static shape either"));
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
  const LowerEinsum lower_einsum;
  const DeadCode dead_code;

  // Constant nodes are weights in disguise: as initializers, folding can see through them.
  constant_to_initializer.run(graph, context);
  // Identity only renames; removing it exposes constants and shortens chains.
  drop_identity.run(graph, context);
  // Folding makes Reshape/Expand/Slice targets constant, which lets shape inference fill in
  // shapes, which lets more Shape nodes fold: repeat to a fixed point. Most exports settle in
  // 2-3 rounds, but a chain of blocks whose every reshape reads the shape of the one before
  // (ShuffleNet's channel shuffles) needs a round per block. A round that changes anything
  // folds a node away or learns a value's type or shape, so nodes + values bound the rounds.
  // Einsum becomes Transpose, Reshape and MatMul once its operands' shapes are known.
  run_until_fixed_point(graph, context, {&fold_constants, &infer_shapes, &lower_einsum},
                        static_cast<int>(graph.live_nodes() + graph.num_values()) + 1);
  // Shape subgraphs whose results were folded are now unread.
  dead_code.run(graph, context);
  graph.compact();
}

}  // namespace stagecraft::passes
