#include "compiler/plan/stage_files.h"

#include <algorithm>
#include <set>

#include "compiler/ir/onnx_bridge.h"

namespace stagecraft::plan {

StageInterfaces stage_interfaces(const ir::Graph& graph, const std::vector<int>& stage_of) {
  StageInterfaces out;
  for (const ir::Value& v : graph.values()) {
    if (v.producer == ir::kNoId || v.is_initializer()) continue;
    int from = stage_of[v.producer];
    std::set<int> readers;
    for (ir::NodeId u : v.consumers) {
      if (stage_of[u] != from) readers.insert(stage_of[u]);
    }
    if (readers.empty()) continue;
    out.cut_tensors.push_back(
        CutTensor{v.name, v.dtype, v.shape, from, std::vector<int>(readers.begin(), readers.end()), v.bytes()});
  }
  for (ir::ValueId in : graph.inputs) {
    std::set<int> readers;
    for (ir::NodeId u : graph.value(in).consumers) readers.insert(stage_of[u]);
    out.input_stages.emplace_back(readers.begin(), readers.end());
  }
  return out;
}

onnx::ModelProto stage_model(const ir::Graph& graph, const std::vector<int>& stage_of, int stage) {
  ir::ExportOptions options;
  std::vector<ir::NodeId> nodes;
  for (std::size_t i = 0; i < graph.num_nodes(); ++i) {
    if (!graph.node(static_cast<ir::NodeId>(i)).dead && stage_of[i] == stage) {
      nodes.push_back(static_cast<ir::NodeId>(i));
    }
  }
  options.nodes = std::move(nodes);
  options.weights = ir::WeightMode::kEmbed;
  onnx::ModelProto model = ir::model_from_graph(graph, options);
  model.mutable_graph()->set_name(graph.name.empty() ? "stage_" + std::to_string(stage)
                                                     : graph.name + "_stage_" + std::to_string(stage));
  return model;
}

}  // namespace stagecraft::plan
