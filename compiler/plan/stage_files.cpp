#include "compiler/plan/stage_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "compiler/ir/onnx_bridge.h"
#include "compiler/partition/graph_problem.h"
#include "passes/autodiff.h"
#include "passes/passes.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/format/lifetimes.h"
#include "runtime/format/memory_plan.h"

namespace stagecraft::plan {

StageInterfaces stage_interfaces(const ir::Graph& graph, const std::vector<int>& stage_of,
                                 const std::vector<ir::ValueId>* trainable) {
  StageInterfaces out;
  for (std::size_t id = 0; id < graph.num_values(); ++id) {
    const ir::Value& v = graph.value(static_cast<ir::ValueId>(id));
    if (v.producer == ir::kNoId || v.is_initializer()) continue;
    int from = stage_of[v.producer];
    std::set<int> readers;
    for (ir::NodeId u : v.consumers) {
      if (stage_of[u] != from) readers.insert(stage_of[u]);
    }
    if (readers.empty()) continue;
    out.cut_tensors.push_back(CutTensor{v.name, v.dtype, v.shape, from,
                                        std::vector<int>(readers.begin(), readers.end()),
                                        v.bytes(), static_cast<ir::ValueId>(id), v.is_graph_output});
  }
  for (ir::ValueId in : graph.inputs) {
    std::set<int> readers;
    for (ir::NodeId u : graph.value(in).consumers) readers.insert(stage_of[u]);
    out.input_stages.emplace_back(readers.begin(), readers.end());
  }
  out.shared_weights = shared_weights(graph, stage_of, trainable);
  return out;
}

std::vector<ir::ValueId> sorted_trainable_weights(const ir::Graph& graph) {
  std::vector<ir::ValueId> found = passes::trainable_weights(graph, graph.topological_order());
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return found;
}

std::vector<SharedWeight> shared_weights(const ir::Graph& graph, const std::vector<int>& stage_of,
                                         const std::vector<ir::ValueId>* trainable) {
  // In value order, each once (sorted ids: no node per weight, as a std::set has). The split
  // search, which calls this for every split it scores, sorts its list once.
  std::vector<ir::ValueId> found;
  if (!trainable) found = sorted_trainable_weights(graph);
  std::vector<SharedWeight> out;
  for (ir::ValueId w : trainable ? *trainable : found) {
    const ir::Value& v = graph.value(w);
    // Most weights have one holder: found without building the set.
    int holder = -1;
    bool several = false;
    for (ir::NodeId u : v.consumers) {
      if (graph.node(u).dead) continue;
      if (holder < 0) holder = stage_of[u];
      several = several || stage_of[u] != holder;
    }
    if (!several) continue;
    std::set<int> holders;
    for (ir::NodeId u : v.consumers)
      if (!graph.node(u).dead) holders.insert(stage_of[u]);
    out.push_back(SharedWeight{v.name, std::string(dtype_name(v.dtype)), v.shape,
                               std::vector<int>(holders.begin(), holders.end())});
  }
  return out;
}

onnx::ModelProto stage_model(const ir::Graph& graph, const std::vector<int>& stage_of, int stage,
                             ir::WeightMode weights, const std::vector<ir::NodeId>* order) {
  ir::ExportOptions options;
  std::vector<ir::NodeId> nodes;
  // In the partition order (a topological order), the one the planner's arena and memory
  // figures were computed on: a node a pass added (a fused Attention, mixed precision's Casts)
  // has a higher id than its neighbours, so id order alone would move the weight-only nodes
  // around it and the arena plan would no longer fit the file.
  const std::vector<ir::NodeId> computed =
      order ? std::vector<ir::NodeId>{} : partition::partition_order(graph);
  for (ir::NodeId n : order ? *order : computed)
    if (stage_of[n] == stage) nodes.push_back(n);
  options.nodes = std::move(nodes);
  options.weights = weights;
  onnx::ModelProto model = ir::model_from_graph(graph, options);
  model.mutable_graph()->set_name(graph.name.empty()
                                      ? "stage_" + std::to_string(stage)
                                      : graph.name + "_stage_" + std::to_string(stage));
  return model;
}

namespace {

/// A stage file's graph as runtime/format/lifetimes.h reads it, with each value's name, its
/// bytes from value_info (0 when it has none recorded) and whether it is a graph output.
struct NamedProgram {
  ProgramGraph graph;
  std::vector<std::string> names;
  std::vector<int64_t> bytes;
  std::vector<bool> recorded, is_output;
};

NamedProgram named_program(const onnx::GraphProto& graph) {
  NamedProgram p;
  std::map<std::string, int, std::less<>> index;
  auto value = [&](const std::string& name) {
    if (name.empty()) return -1;
    auto [it, fresh] = index.emplace(name, static_cast<int>(p.names.size()));
    if (fresh) p.names.push_back(name);
    return it->second;
  };
  for (const onnx::NodeProto& node : graph.node()) {
    ProgramNode n;
    n.op_type = node.op_type();
    for (const std::string& in : node.input()) n.inputs.push_back(value(in));
    for (const std::string& out : node.output()) n.outputs.push_back(value(out));
    for (const auto& attr : node.attribute())
      if (attr.name() == grad::kWeightGradAttr && attr.i() != 0) n.weight_gradients = true;
    p.graph.nodes.push_back(std::move(n));
  }
  p.graph.values = static_cast<int>(p.names.size());
  p.bytes.assign(p.names.size(), 0);
  p.recorded.assign(p.names.size(), false);
  p.is_output.assign(p.names.size(), false);
  for (const auto& vi : graph.value_info()) {
    auto it = index.find(vi.name());
    if (it == index.end()) continue;
    const auto& tt = vi.type().tensor_type();
    auto dtype = dtype_from_onnx(tt.elem_type());
    int64_t n = dtype ? dtype_size(*dtype) : 0;
    for (const auto& d : tt.shape().dim()) n *= d.has_dim_value() ? d.dim_value() : 0;
    p.bytes[it->second] = n;
    p.recorded[it->second] = true;
  }
  for (const auto& vi : graph.output())
    if (auto it = index.find(vi.name()); it != index.end()) p.is_output[it->second] = true;
  return p;
}

}  // namespace

onnx::ModelProto backward_stage_model(const ir::Graph& graph, const std::vector<int>& stage_of,
                                      const Stage& stage, const std::string& loss_output,
                                      const std::vector<ir::NodeId>* order) {
  passes::BackwardSpec spec;
  const std::vector<ir::NodeId> computed =
      order ? std::vector<ir::NodeId>{} : graph.topological_order();
  const std::vector<ir::NodeId>& nodes = order ? *order : computed;
  for (ir::NodeId n : nodes)
    if (stage_of[n] == stage.index) spec.nodes.push_back(n);
  // A stage output's gradient comes back only when a node of a reading stage passes it one:
  // not a mask that only an Attention node reads, nor a value read only as a condition or shape
  // there. Waiting for one that never comes would stop the backward (the runtime refuses it).
  const std::optional<ir::ValueId> loss = graph.find_value(loss_output);
  const std::vector<char> reaches =
      loss ? passes::reaches_loss(graph, *loss, nodes) : std::vector<char>(graph.num_values(), 0);
  auto comes_back = [&](ir::ValueId v) {
    const ir::Value& value = graph.value(v);
    for (ir::NodeId c : value.consumers) {
      if (stage_of[c] == stage.index || stage_of[c] < 0) continue;
      const ir::Node& node = graph.node(c);
      for (std::size_t k = 0; k < node.inputs.size(); ++k)
        if (node.inputs[k] == v && passes::passes_gradient(graph, node, k, reaches)) return true;
    }
    return false;
  };
  for (const StageTensor& out : stage.outputs) {
    ir::ValueId v = *graph.find_value(out.name);
    if (out.name == loss_output)
      spec.loss = v;
    else if (!out.peer_stages.empty() && is_floating(graph.value(v).dtype) && comes_back(v))
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
  const NamedProgram p = named_program(model.graph());
  const Intermediates in = intermediate_lifetimes(p.graph, p.bytes, p.is_output);
  for (int v : in.values)
    if (!p.recorded[v])
      fail(ErrorKind::kInternal, "backward value '{}' has no recorded type and shape", p.names[v]);
  return plan_memory(in.lifetimes).arena_bytes;
}

int64_t deferred_bytes(const onnx::ModelProto& model) {
  const NamedProgram p = named_program(model.graph());
  return plan::deferred_bytes(p.graph, p.bytes);
}

}  // namespace stagecraft::plan

namespace stagecraft::plan {

std::pair<int64_t, std::vector<ArenaTensor>> program_arena(const onnx::ModelProto& model) {
  const NamedProgram p = named_program(model.graph());
  const Intermediates in = intermediate_lifetimes(p.graph, p.bytes, p.is_output);
  const MemoryPlan mp = plan_memory(in.lifetimes);
  std::vector<ArenaTensor> placed;
  for (std::size_t t = 0; t < in.values.size(); ++t)
    placed.push_back({p.names[in.values[t]], mp.offsets[t], in.lifetimes[t].bytes});
  return {mp.arena_bytes, std::move(placed)};
}

MixedStages make_mixed(ir::Graph& graph, std::vector<int>& stage_of, std::vector<Stage>& stages,
                       const std::string& loss_output, bool training, DType sixteen_bit) {
  passes::PassContext context;
  context.stage_of = &stage_of;
  context.sixteen_bit = sixteen_bit;
  passes::MixedPrecision().run(graph, context);
  MixedStages out;
  out.activation_bytes.assign(stages.size(), 0);
  out.weight_copy_bytes.assign(stages.size(), 0);
  for (ir::NodeId n : graph.topological_order()) {
    const int k = stage_of[n];
    if (k < 0 || static_cast<std::size_t>(k) >= stages.size()) continue;
    // A weight's or constant's 16-bit copy is counted apart: the runtime keeps one per stage
    // for the whole step when the backward reads it (runtime/exec/device_worker.cpp
    // share_step_copies); otherwise it lives in the arena.
    const ir::Node& node = graph.node(n);
    if (node.op_type == "Cast" && graph.value(node.inputs[0]).is_initializer()) {
      if (training && passes::backward_reads_bytes(graph, node.outputs[0]))
        out.weight_copy_bytes[k] += graph.value(node.outputs[0]).bytes();
      continue;
    }
    for (ir::ValueId v : node.outputs)
      if (v != ir::kNoId && dtype_size(graph.value(v).dtype) > 0 &&
          passes::backward_reads_bytes(graph, v))
        out.activation_bytes[k] += graph.value(v).bytes();
  }
  // The graph no longer changes below: its orders serve every stage.
  const std::vector<ir::NodeId> partition = partition::partition_order(graph);
  const std::vector<ir::NodeId> topological = graph.topological_order();
  for (Stage& st : stages) {
    // The tensors crossing stages keep their names; their dtype is now the graph's (bfloat16
    // for activations, float32 for graph inputs and outputs).
    int64_t comm_delta = 0, input_delta = 0;
    for (StageTensor& t : st.inputs) {
      const ir::Value& v = graph.value(*graph.find_value(t.name));
      const int64_t delta = v.bytes() - t.bytes;
      if (t.peer_stage >= 0) comm_delta += (training ? 1 : 2) * delta;
      input_delta += delta;
      t.dtype = std::string(dtype_name(v.dtype));
      t.bytes = v.bytes();
    }
    for (StageTensor& t : st.outputs) {
      const ir::Value& v = graph.value(*graph.find_value(t.name));
      if (!(t.peer_stages.empty() && !t.graph_output)) comm_delta += v.bytes() - t.bytes;
      t.dtype = std::string(dtype_name(v.dtype));
      t.bytes = v.bytes();
    }
    // The arenas of the programs the writer will write, as the runtime plans them.
    // The arena needs the graph and its value types, not the weights' bytes: weights go in as
    // typed inputs, so planning a model bigger than memory reads none of them here.
    auto [arena_bytes, arena] =
        program_arena(stage_model(graph, stage_of, st.index, ir::WeightMode::kAsInputs, &partition));
    st.arena_bytes = arena_bytes;
    st.arena = std::move(arena);
    if (training && !loss_output.empty())
      st.backward_arena_bytes =
          program_arena_bytes(backward_stage_model(graph, stage_of, st, loss_output, &topological));
    // Training's forward puts the values the backward does not read in the forward's arena,
    // and the backward runs in its own: one arena serves both.
    int64_t temporary = st.arena_bytes;
    if (training) temporary = std::max(temporary, st.backward_arena_bytes);
    st.memory.temporary = temporary;
    st.memory.communication += comm_delta;
    if (st.recompute) st.memory.activations += st.in_flight * input_delta;
    out.input_bytes_delta.push_back(input_delta);
  }
  return out;
}

}  // namespace stagecraft::plan
