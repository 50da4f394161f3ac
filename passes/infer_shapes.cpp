// Runs ONNX's own shape inference (strict, with data propagation) over the IR. Weights are not
// copied: large initializers are declared as typed inputs, only small constants travel.
#include <cstddef>

#include "compiler/ir/onnx_bridge.h"
#include "passes/passes.h"
#include "runtime/format/error.h"

namespace stagecraft::passes {

namespace {

/// Whether every value a live node writes, and every graph input, has its type and shape: then
/// ONNX's inference has nothing to add (the import ran it on the model before any pass; a
/// static export, or one whose dims --dim bound, is complete from the start), and the round
/// trip through a ModelProto is most of the import's time on a large model.
bool complete(const ir::Graph& graph) {
  auto known = [&](ir::ValueId id) {
    if (id == ir::kNoId) return true;
    const ir::Value& v = graph.value(id);
    return v.dtype != DType::kUndefined && v.shape_known;
  };
  for (ir::ValueId in : graph.inputs)
    if (!known(in)) return false;
  for (std::size_t n = 0; n < graph.num_nodes(); ++n) {
    const ir::Node& node = graph.node(static_cast<ir::NodeId>(n));
    if (node.dead) continue;
    for (ir::ValueId out : node.outputs)
      if (!known(out)) return false;
  }
  return true;
}

}  // namespace

bool InferShapes::run(ir::Graph& graph, PassContext& context) const {
  if (complete(graph)) return false;
  ir::ExportOptions options;
  options.weights = ir::WeightMode::kAsInputs;
  options.small_constant_elements = context.fold_max_elements;
  options.value_info = false;
  onnx::ModelProto model = ir::model_from_graph(graph, options);
  ir::infer_onnx_shapes(model);
  bool changed = false;
  auto absorb = [&](const onnx::ValueInfoProto& info) {
    auto id = graph.find_value(info.name());
    if (!id) return;
    ir::Value& v = graph.value(*id);
    if (v.is_initializer() || v.is_graph_input) return;
    const auto& type = info.type();
    if (!type.has_tensor_type()) return;
    if (v.dtype == DType::kUndefined && type.tensor_type().elem_type() != 0) {
      if (auto dtype = dtype_from_onnx(type.tensor_type().elem_type())) {
        v.dtype = *dtype;
        changed = true;
      }
    }
    if (!type.tensor_type().has_shape()) return;
    std::vector<int64_t> shape;
    for (const auto& d : type.tensor_type().shape().dim()) {
      if (!d.has_dim_value() || d.dim_value() < 0) return;
      shape.push_back(d.dim_value());
    }
    if (!v.shape_known || v.shape != shape) {
      v.shape = std::move(shape);
      v.shape_known = true;
      changed = true;
    }
  };
  for (const auto& info : model.graph().value_info()) absorb(info);
  for (const auto& info : model.graph().output()) absorb(info);
  return changed;
}

}  // namespace stagecraft::passes
