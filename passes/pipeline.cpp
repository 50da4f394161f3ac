#include "passes/pipeline.h"

#include "passes/passes.h"
#include "runtime/format/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

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

/// "'a', 'b'" for a set of names.
std::string quoted_list(const std::set<std::string>& names) {
  std::string list;
  for (const auto& name : names) list += (list.empty() ? "'" : ", '") + name + "'";
  return list;
}

/// How operand `k` of `node` (value `in`) carries data into its shape: "the values of input
/// 'a'" for a graph input, else "the values of 'v' (input k of the node, computed by node 'p'
/// (Op) from input 'a')".
std::string operand_dependence(const ir::Graph& graph, std::size_t k, ir::ValueId in) {
  const ir::Value& v = graph.value(in);
  if (v.is_graph_input) return "the values of input '" + v.name + "'";
  const std::set<std::string> behind = graph_inputs_behind(graph, in);
  std::string from = behind.empty() ? std::string("no graph input")
                                    : (behind.size() == 1 ? "input " : "inputs ") + quoted_list(behind);
  std::string by = v.producer == ir::kNoId ? std::string()
                                           : "computed by " + graph.node(v.producer).describe(graph) + " ";
  return fmt::format("the values of '{}' (input {} of the node, {}from {})", v.name, k, by, from);
}

/// Why `node`'s output has no static shape although every input of `node` has one: the node's
/// shape-giving inputs that are not constants, each with the graph inputs whose values (not
/// shapes) reach it.
std::string data_dependence(const ir::Graph& graph, const ir::Node& node) {
  // Reshape, Expand, Slice, Tile, Pad, Resize, TopK...: input 0 is the data, the others say
  // the shape. ConstantOfShape, Range, NonZero and their kind read shape from every input.
  std::vector<std::string> reasons;
  for (int pass = 0; pass < 2 && reasons.empty(); ++pass) {
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      ir::ValueId in = node.inputs[k];
      if (in == ir::kNoId || graph.value(in).is_initializer()) continue;
      if (pass == 0 && k == 0 && node.inputs.size() > 1) continue;
      reasons.push_back(operand_dependence(graph, k, in));
    }
  }
  if (reasons.empty()) return "no graph input (a value the shape rules cannot follow)";
  std::string text;
  for (std::size_t i = 0; i < reasons.size(); ++i)
    text += (i == 0 ? "" : (i + 1 == reasons.size() ? " and " : ", ")) + reasons[i];
  return text;
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
  const LowerIndexing lower_indexing;
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
  // Einsum becomes Transpose, Reshape and MatMul once its operands' shapes are known;
  // ScatterElements a ScatterND and OneHot an Equal and a Where likewise.
  run_until_fixed_point(graph, context,
                        {&fold_constants, &infer_shapes, &lower_einsum, &lower_indexing},
                        static_cast<int>(graph.live_nodes() + graph.num_values()) + 1);
  // Shape subgraphs whose results were folded are now unread.
  dead_code.run(graph, context);
  graph.compact();
}

}  // namespace stagecraft::passes
