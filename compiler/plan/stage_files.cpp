#include "compiler/plan/stage_files.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include <map>

#include "compiler/ir/onnx_bridge.h"
#include "passes/autodiff.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/format/memory_plan.h"

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
  out.shared_weights = shared_weights(graph, stage_of);
  return out;
}

std::vector<SharedWeight> shared_weights(const ir::Graph& graph,
                                         const std::vector<int>& stage_of) {
  std::set<ir::ValueId> trainable;
  for (ir::ValueId w : passes::trainable_weights(graph, graph.topological_order()))
    trainable.insert(w);
  std::vector<SharedWeight> out;
  for (ir::ValueId w : trainable) {
    const ir::Value& v = graph.value(w);
    std::set<int> holders;
    for (ir::NodeId u : v.consumers)
      if (!graph.node(u).dead) holders.insert(stage_of[u]);
    if (holders.size() < 2) continue;
    out.push_back(SharedWeight{v.name, std::string(dtype_name(v.dtype)), v.shape,
                               std::vector<int>(holders.begin(), holders.end())});
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

namespace {

/// Bytes of every value the graph records a type and static shape for (value_info).
std::map<std::string, int64_t, std::less<>> value_info_bytes(const onnx::GraphProto& graph) {
  std::map<std::string, int64_t, std::less<>> bytes_of;
  for (const auto& vi : graph.value_info()) {
    const auto& tt = vi.type().tensor_type();
    auto dtype = dtype_from_onnx(tt.elem_type());
    int64_t n = dtype ? dtype_size(*dtype) : 0;
    for (const auto& d : tt.shape().dim()) n *= d.has_dim_value() ? d.dim_value() : 0;
    bytes_of[vi.name()] = n;
  }
  return bytes_of;
}

}  // namespace

onnx::ModelProto backward_stage_model(const ir::Graph& graph, const std::vector<int>& stage_of,
                                      const Stage& stage, const std::string& loss_output) {
  passes::BackwardSpec spec;
  for (ir::NodeId n : graph.topological_order())
    if (stage_of[n] == stage.index) spec.nodes.push_back(n);
  for (const StageTensor& out : stage.outputs) {
    ir::ValueId v = *graph.find_value(out.name);
    if (out.name == loss_output)
      spec.loss = v;
    else if (!out.peer_stages.empty() && is_floating(graph.value(v).dtype))
      spec.output_grads.push_back(v);
  }
  for (const StageTensor& in : stage.inputs) {
    ir::ValueId v = *graph.find_value(in.name);
    if (in.peer_stage >= 0 && is_floating(graph.value(v).dtype)) spec.wanted.push_back(v);
  }
  for (ir::ValueId w : passes::trainable_weights(graph, spec.nodes)) spec.wanted.push_back(w);
  return with_context(fmt::format("stage {} backward", stage.index), ErrorKind::kInternal,
                      [&] { return passes::build_backward(graph, spec); });
}

int64_t program_arena_bytes(const onnx::ModelProto& model) {
  const onnx::GraphProto& graph = model.graph();
  const auto bytes_of = value_info_bytes(graph);
  std::set<std::string, std::less<>> outputs;
  for (const auto& vi : graph.output()) outputs.insert(vi.name());
  std::vector<Lifetime> lifetimes;
  std::map<std::string, size_t, std::less<>> index;
  for (int n = 0; n < graph.node_size(); ++n) {
    const onnx::NodeProto& node = graph.node(n);
    for (const std::string& in : node.input())
      if (auto it = index.find(in); it != index.end()) lifetimes[it->second].last = n;
    for (const std::string& out : node.output()) {
      if (out.empty() || outputs.count(out)) continue;
      auto b = bytes_of.find(out);
      if (b == bytes_of.end())
        fail(ErrorKind::kInternal, "backward value '{}' has no recorded type and shape", out);
      index[out] = lifetimes.size();
      lifetimes.push_back({b->second, n, n});
    }
  }
  return plan_memory(lifetimes).arena_bytes;
}

int64_t deferred_bytes(const onnx::ModelProto& model) {
  const onnx::GraphProto& graph = model.graph();
  std::map<std::string, int, std::less<>> producer;  // value -> node index
  for (int n = 0; n < graph.node_size(); ++n)
    for (const std::string& out : graph.node(n).output())
      if (!out.empty()) producer[out] = n;
  std::vector<bool> w(graph.node_size(), false);
  for (int n = 0; n < graph.node_size(); ++n) {
    const onnx::NodeProto& node = graph.node(n);
    for (const auto& attr : node.attribute())
      if (attr.name() == grad::kWeightGradAttr && attr.i() != 0) w[n] = true;
    if (w[n] || node.op_type() != "Add") continue;
    bool any = false, all = true;
    for (const std::string& in : node.input()) {
      auto p = producer.find(in);
      bool from_w = p != producer.end() && w[p->second];
      any |= from_w;
      all &= from_w || p == producer.end();
    }
    w[n] = any && all;
  }
  const auto bytes_of = value_info_bytes(graph);
  std::set<std::string, std::less<>> crossing;
  for (int n = 0; n < graph.node_size(); ++n)
    for (const std::string& in : graph.node(n).input()) {
      auto p = producer.find(in);
      if (p == producer.end()) continue;
      if (!w[n] && w[p->second]) return 0;  // B reads a W result: no split
      if (w[n] && !w[p->second]) crossing.insert(in);
    }
  int64_t total = 0;
  for (const std::string& v : crossing)
    if (auto b = bytes_of.find(v); b != bytes_of.end()) total += b->second;
  return total;
}

}  // namespace stagecraft::plan
