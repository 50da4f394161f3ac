// Small structural passes: Constant nodes to initializers, Identity removal, dead code.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "compiler/ir/onnx_bridge.h"
#include "passes/host_tensor.h"
#include "passes/passes.h"
#include "runtime/format/error.h"

namespace stagecraft::passes {
namespace {

/// The tensor a Constant node holds, as an ONNX TensorProto (whichever attribute carries it).
onnx::TensorProto constant_tensor(const ir::Graph& graph, const ir::Node& node) {
  onnx::TensorProto t;
  if (const auto* a = node.attribute("value")) return a->t();
  if (const auto* a = node.attribute("value_float")) {
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_float_data(a->f());
  } else if (const auto* a = node.attribute("value_floats")) {
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_dims(a->floats_size());
    for (float f : a->floats()) t.add_float_data(f);
  } else if (const auto* a = node.attribute("value_int")) {
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_int64_data(a->i());
  } else if (const auto* a = node.attribute("value_ints")) {
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_dims(a->ints_size());
    for (int64_t i : a->ints()) t.add_int64_data(i);
  } else {
    fail(ErrorKind::kUnsupported, "{} holds a string or sparse constant, which is not supported",
         node.describe(graph));
  }
  return t;
}

/// True for a Pad whose pads are constant zeros: an Identity under another name. torch writes one
/// before every AveragePool with count_include_pad, zero-width where the pool pads nothing.
bool pads_nothing(const ir::Graph& graph, const ir::Node& node) {
  if (node.op_type != "Pad" || !node.domain.empty()) return false;
  std::vector<int64_t> pads = node.attr_ints("pads");
  if (node.inputs.size() > 1) {
    if (node.inputs[1] == ir::kNoId) return false;
    auto constant = HostTensor::from_value(graph.value(node.inputs[1]));
    if (!constant || constant->is_real()) return false;
    pads = constant->ints;
  }
  return !pads.empty() && std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; });
}

}  // namespace

bool ConstantToInitializer::run(ir::Graph& graph, PassContext& context) const {
  bool changed = false;
  const std::string model_dir = std::filesystem::path(graph.source_path).parent_path().string();
  for (std::size_t i = 0; i < graph.num_nodes(); ++i) {
    auto id = static_cast<ir::NodeId>(i);
    const ir::Node& node = graph.node(id);
    if (node.dead || node.op_type != "Constant" || !node.domain.empty()) continue;
    if (node.outputs.empty() || node.outputs[0] == ir::kNoId) continue;
    onnx::TensorProto t = constant_tensor(graph, node);
    ir::ValueId out = node.outputs[0];
    with_context(node.describe(graph), ErrorKind::kModel, [&] {
      auto dtype = dtype_from_onnx(t.data_type());
      if (!dtype) fail(ErrorKind::kUnsupported, "constant of element type {}", t.data_type());
      ir::Value& v = graph.value(out);
      v.dtype = *dtype;
      v.shape.assign(t.dims().begin(), t.dims().end());
      v.shape_known = true;
      // External data resolves against the model's folder, with the rules of initializers'
      // (never against the current directory).
      v.initializer = ir::take_tensor_data(t, model_dir);
    });
    graph.remove_node(id);
    context.counters[std::string(name())]++;
    changed = true;
  }
  return changed;
}

bool DropIdentity::run(ir::Graph& graph, PassContext& context) const {
  bool changed = false;
  for (std::size_t i = 0; i < graph.num_nodes(); ++i) {
    auto id = static_cast<ir::NodeId>(i);
    const ir::Node& node = graph.node(id);
    if (node.dead || node.inputs.empty() || node.outputs.empty()) continue;
    if (node.op_type != "Identity" && !pads_nothing(graph, node)) continue;
    ir::ValueId in = node.inputs[0], out = node.outputs[0];
    // A graph output keeps its name: the user's interface does not change under them.
    if (in == ir::kNoId || out == ir::kNoId || graph.value(out).is_graph_output) continue;
    if (context.untie_merged_weights && node.op_type == "Identity" &&
        graph.value(in).is_initializer() && graph.value(in).is_weight) {
      // An exporter's merge: the copy becomes a weight of its own, with the kept one's values.
      const ir::Value& kept = graph.value(in);
      context.untied.push_back(fmt::format("{} (= {})", graph.value(out).name, kept.name));
      const ir::Value source = kept;
      graph.remove_node(id);
      ir::Value& copy = graph.value(out);
      copy.initializer = source.initializer;
      copy.is_weight = true;
      copy.dtype = source.dtype;
      copy.shape = source.shape;
      copy.shape_known = source.shape_known;
      copy.producer = ir::kNoId;
      context.counters["drop-identity: untied"]++;
      changed = true;
      continue;
    }
    graph.remove_node(id);
    graph.replace_all_uses(out, in);
    context.counters[std::string(name())]++;
    changed = true;
  }
  return changed;
}

bool DeadCode::run(ir::Graph& graph, PassContext& context) const {
  bool changed = false;
  auto order = graph.topological_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const ir::Node& node = graph.node(*it);
    bool used = std::any_of(node.outputs.begin(), node.outputs.end(), [&](ir::ValueId v) {
      return v != ir::kNoId &&
             (!graph.value(v).consumers.empty() || graph.value(v).is_graph_output);
    });
    if (used) continue;
    graph.remove_node(*it);
    context.counters[std::string(name())]++;
    changed = true;
  }
  return changed;
}

}  // namespace stagecraft::passes
