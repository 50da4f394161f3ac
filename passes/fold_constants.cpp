// Folds the shape arithmetic that exporters emit into constants once every dim is bound.
#include "compiler/ir/ops.h"
#include "passes/host_tensor.h"
#include "passes/passes.h"
#include "runtime/format/error.h"

namespace stagecraft::passes {

bool FoldConstants::run(ir::Graph& graph, PassContext& context) const {
  bool changed = false;
  for (ir::NodeId id : graph.topological_order()) {
    const ir::Node& node = graph.node(id);
    const OpInfo* info = op_info(node.op_type);
    if (!node.domain.empty() || info == nullptr || !info->host_folds()) continue;
    // Identity is left to drop-identity; folding it would copy a weight.
    if (node.op_type == "Identity") continue;

    std::vector<std::optional<HostTensor>> inputs;
    std::vector<int64_t> shape_input;
    bool foldable = !node.inputs.empty();
    if (node.op_type == "Shape") {
      const ir::Value& x = graph.value(node.inputs[0]);
      foldable = x.shape_known;
      shape_input = x.shape;
    } else {
      for (ir::ValueId in : node.inputs) {
        if (in == ir::kNoId) {
          inputs.emplace_back();
          continue;
        }
        const ir::Value& v = graph.value(in);
        if (!v.is_initializer() || v.is_weight || !v.shape_known ||
            v.numel() > context.fold_max_elements) {
          foldable = false;
          break;
        }
        inputs.push_back(HostTensor::from_value(v));
        if (!inputs.back()) {
          foldable = false;
          break;
        }
      }
    }
    if (!foldable) continue;
    // The evaluator's errors already name the node.
    auto result =
        evaluate_on_host(node, inputs, shape_input, graph.opset, context.fold_max_elements);
    if (!result || result->size() != node.outputs.size()) continue;
    bool small = true;
    int64_t bytes = 0;
    for (const auto& t : *result) {
      small &= t.numel() <= context.fold_max_elements;
      bytes += t.numel() * dtype_size(t.dtype);
    }
    if (!small) continue;
    if (bytes > context.fold_max_total_bytes - context.folded_bytes) {
      fail(ErrorKind::kUnsupported,
           "node '{}' ({}): folding its {} bytes would bring the model's folded constants to {} "
           "bytes, past the cap of {}; stagecraft folds shape arithmetic, not data",
           node.name, node.op_type, bytes, context.folded_bytes + bytes,
           context.fold_max_total_bytes);
    }
    context.folded_bytes += bytes;
    std::vector<ir::ValueId> outputs = node.outputs;
    graph.remove_node(id);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      if (outputs[k] == ir::kNoId) continue;
      ir::Value& v = graph.value(outputs[k]);
      const HostTensor& t = (*result)[k];
      v.dtype = t.dtype;
      v.shape = t.shape;
      v.shape_known = true;
      v.initializer = ir::WeightData::owned(t.to_bytes());
    }
    context.counters[std::string(name())]++;
    changed = true;
  }
  return changed;
}

}  // namespace stagecraft::passes
