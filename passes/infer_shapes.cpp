// Runs ONNX's own shape inference (strict, with data propagation) over the IR. Weights are not
// copied: large initializers are declared as typed inputs, only small constants travel.
#include "compiler/ir/onnx_bridge.h"
#include "passes/passes.h"
#include "runtime/format/error.h"

namespace stagecraft::passes {

bool InferShapes::run(ir::Graph& graph, PassContext& context) const {
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
