// inference-mode: an inference plan runs the nodes a training-mode export left in training mode
// as PyTorch's eval() would. torch.onnx.export(..., training=TrainingMode.TRAINING), which a user
// writes to train, gives every Dropout a constant training_mode input of true and every
// BatchNormalization training_mode=1; planned for inference as they stand, Dropout would drop
// and scale at random and BatchNormalization would normalise each batch by its own statistics,
// a different function from the trained model's, silently.
//
// Dropout: the training_mode input is dropped (ONNX's default is false: the identity; a mask
// output, if read, is all true). BatchNormalization: training_mode becomes 0 (the running
// statistics), when nothing reads its running-statistics outputs, which inference mode does not
// have; a node whose outputs are read stays as it is. Planned by stagec for inference unless
// --keep-training-mode; counted in the context under "inference-mode: Dropout" and
// "inference-mode: BatchNormalization" (and "...: BatchNormalization kept" for the ones left).
#include <algorithm>

#include "passes/host_tensor.h"
#include "passes/passes.h"

namespace stagecraft::passes {
namespace {

/// Whether a Dropout's training_mode input is a constant true (a non-constant one is the
/// caller's to set at run time and stays).
bool constant_true(const ir::Graph& graph, ir::ValueId mode) {
  if (mode == ir::kNoId) return false;
  auto value = HostTensor::from_value(graph.value(mode));
  if (!value || value->numel() != 1) return false;
  return value->is_real() ? value->real_at(0) != 0 : value->int_at(0) != 0;
}

/// Whether output k of `node` is present and read (by a node or as a graph output).
bool output_read(const ir::Graph& graph, const ir::Node& node, std::size_t k) {
  if (k >= node.outputs.size() || node.outputs[k] == ir::kNoId) return false;
  const ir::Value& v = graph.value(node.outputs[k]);
  return !v.consumers.empty() || v.is_graph_output;
}

}  // namespace

bool InferenceMode::run(ir::Graph& graph, PassContext& context) const {
  bool changed = false;
  for (std::size_t i = 0; i < graph.num_nodes(); ++i) {
    const auto id = static_cast<ir::NodeId>(i);
    ir::Node& node = graph.node(id);
    if (node.dead || !node.domain.empty()) continue;
    if (node.op_type == "Dropout" && node.inputs.size() > 2 &&
        constant_true(graph, node.inputs[2])) {
      graph.drop_input(id, 2);
      ++context.counters["inference-mode: Dropout"];
      changed = true;
    } else if (node.op_type == "BatchNormalization" && node.attr_int("training_mode", 0) != 0) {
      if (output_read(graph, node, 1) || output_read(graph, node, 2)) {
        ++context.counters["inference-mode: BatchNormalization kept"];
        continue;
      }
      for (onnx::AttributeProto& a : node.attributes)
        if (a.name() == "training_mode") a.set_i(0);
      node.outputs.resize(1);  // the running statistics are unread: inference mode has none
      ++context.counters["inference-mode: BatchNormalization"];
      changed = true;
    }
  }
  return changed;
}

}  // namespace stagecraft::passes
