// Helpers shared by the autodiff tests (autodiff_util.h).
#include "tests/autodiff/autodiff_util.h"

#include <doctest/doctest.h>
#include <onnx/checker.h>

#include <algorithm>
#include <map>
#include <set>

#include "compiler/import.h"
#include "runtime/format/grad_ops.h"
#include "tests/test_util.h"

namespace stagecraft::autodiff_test {

using passes::BackwardSpec;
using passes::build_backward;

std::string sample(const std::string& name) { return std::string(STAGECRAFT_SAMPLES) + "/" + name; }

/// An empty opset-17 model to build graphs in.
onnx::ModelProto empty_model() {
  onnx::ModelProto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->set_name("m");
  g->clear_node();
  g->clear_input();
  g->clear_output();
  return m;
}

onnx::ModelProto loss_stage_model() {
  onnx::ModelProto model = empty_model();
  auto* gp = model.mutable_graph();
  testing::add_tensor_info(gp->add_input(), "x", kFloat, {4, 6});
  testing::add_tensor_info(gp->add_input(), "labels", kInt64, {4});
  testing::add_float_initializer(gp, "W", {6, 5});
  testing::add_float_initializer(gp, "b", {5});
  testing::add_node(gp, "Gemm", {"x", "W", "b"}, {"scores"}, "fc");
  testing::add_node(gp, "SoftmaxCrossEntropyLoss", {"scores", "labels"}, {"loss"}, "sce");
  testing::add_tensor_info(gp->add_output(), "loss", kFloat, {});
  return model;
}

ir::Graph import_proto(const onnx::ModelProto& model) {
  testing::TempDir dir;
  testing::write_model(model, dir.file("m.onnx"));
  return import_model(dir.file("m.onnx"), ImportOptions{}).graph;
}

ir::ValueId value(const ir::Graph& g, const std::string& name) {
  auto v = g.find_value(name);
  REQUIRE_MESSAGE(v.has_value(), "no value '" << name << "'");
  return *v;
}

/// The whole graph as one stage: every live node, in topological order.
BackwardSpec whole_graph_spec(const ir::Graph& g) {
  BackwardSpec spec;
  spec.nodes = g.topological_order();
  spec.wanted = passes::trainable_weights(g, spec.nodes);
  return spec;
}

const onnx::NodeProto* find_node(const onnx::ModelProto& m, const std::string& name) {
  for (const auto& n : m.graph().node()) {
    if (n.name() == name) return &n;
  }
  return nullptr;
}

int64_t int_attr(const onnx::NodeProto& n, std::string_view name, int64_t fallback) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return a.i();
  }
  return fallback;
}

std::vector<std::string> names(const google::protobuf::RepeatedPtrField<std::string>& list) {
  return {list.begin(), list.end()};
}

std::vector<std::string> names(
    const google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>& list) {
  std::vector<std::string> out;
  for (const auto& v : list) out.push_back(v.name());
  return out;
}

std::vector<int64_t> dims(const onnx::ValueInfoProto& info) {
  std::vector<int64_t> out;
  for (const auto& d : info.type().tensor_type().shape().dim()) {
    REQUIRE_MESSAGE(d.has_dim_value(), "'" << info.name() << "' has a dim without a value");
    out.push_back(d.dim_value());
  }
  return out;
}

/// The forward value a backward tensor is the gradient of ("h@grad.1" -> h), or the value itself.
std::string forward_name(const std::string& name) {
  if (name == grad::kLossGradName) return "";
  auto at = name.find("@grad");
  return at == std::string::npos ? name : name.substr(0, at);
}

/// Checks the invariants every backward program holds: it passes the ONNX checker; every node
/// input is a graph input, an initializer or an earlier node's output; every tensor is typed with
/// a static shape equal to its forward value's; gradient nodes follow the grad_ops.h arity; the
/// outputs are "W@grad" for the wanted values that get a gradient.
void check_structure(const ir::Graph& g, const BackwardSpec& spec, const onnx::ModelProto& m,
                     const std::vector<ir::ValueId>& no_gradient) {
  CHECK_NOTHROW(onnx::checker::check_model(m));
  const auto& graph = m.graph();
  std::map<std::string, const onnx::ValueInfoProto*> typed;
  for (const auto* list : {&graph.input(), &graph.output(), &graph.value_info()}) {
    for (const auto& v : *list) {
      CHECK_MESSAGE(typed.emplace(v.name(), &v).second, "'" << v.name() << "' is typed twice");
    }
  }
  for (const auto& [name, info] : typed) {
    CAPTURE(name);
    std::string fwd = forward_name(name);
    if (fwd.empty()) {
      CHECK(info->type().tensor_type().elem_type() == kFloat);
      CHECK(dims(*info).empty());
      continue;
    }
    auto v = g.find_value(fwd);
    REQUIRE(v.has_value());
    CHECK(info->type().tensor_type().elem_type() == static_cast<int32_t>(g.value(*v).dtype));
    CHECK(dims(*info) == g.value(*v).shape);
  }
  std::set<std::string> defined;
  for (const auto& in : graph.input()) defined.insert(in.name());
  for (const auto& init : graph.initializer()) {
    defined.insert(init.name());
    auto v = g.find_value(init.name());
    REQUIRE(v.has_value());
    CHECK_FALSE(g.value(*v).is_weight);  // weights are inputs, bound from the forward program
  }
  for (const auto& node : graph.node()) {
    CAPTURE(node.name());
    for (const auto& in : node.input()) {
      if (!in.empty())
        CHECK_MESSAGE(defined.count(in), "input '" << in << "' is not defined before use");
    }
    for (const auto& out : node.output()) {
      if (out.empty()) continue;
      CHECK_MESSAGE(defined.insert(out).second, "'" << out << "' is written twice");
      CHECK_MESSAGE(typed.count(out), "'" << out << "' has no type");
      CHECK(forward_name(out) != out);  // only gradients are computed
    }
    if (node.domain() == grad::kGradDomain) {
      int64_t n = int_attr(node, grad::kForwardInputsAttr, -1);
      REQUIRE(n >= 0);
      CHECK(node.output_size() == n);
      CHECK((node.input_size() - n) % 2 == 0);
      CHECK(node.op_type().ends_with("Grad"));
    } else {
      CHECK(node.op_type() == "Add");
    }
  }
  std::vector<std::string> want_outputs;
  for (ir::ValueId w : spec.wanted) {
    if (std::find(no_gradient.begin(), no_gradient.end(), w) == no_gradient.end())
      want_outputs.push_back(grad::grad_name(g.value(w).name));
  }
  CHECK(names(graph.output()) == want_outputs);
  for (const auto& out : graph.output()) CHECK(defined.count(out.name()));
  // Zero-bubble: the gradients of wanted activations (sent to earlier stages by the B part)
  // depend on no node marked weight_gradients = 1.
  std::map<std::string, const onnx::NodeProto*> producer;
  // An omitted input or output is "" (a gradient node's unused dlse, an unwanted dx): no value.
  for (const auto& node : graph.node()) {
    for (const auto& out : node.output())
      if (!out.empty()) producer[out] = &node;
  }
  // ... and W results are read only by W nodes and by Adds that sum W results (with, where a
  // stage output is also read inside the stage, its incoming gradient, a backward input), so the
  // runtime can defer the whole W part.
  std::set<std::string> w_results, backward_inputs;
  for (const auto& in : graph.input()) backward_inputs.insert(in.name());
  for (const auto& node : graph.node()) {
    bool all_w = node.op_type() == "Add", any_w = false;
    for (const auto& in : node.input()) {
      any_w |= w_results.count(in) > 0;
      all_w &= w_results.count(in) > 0 || backward_inputs.count(in) > 0;
    }
    all_w &= any_w;
    bool marked = int_attr(node, grad::kWeightGradAttr, 0) == 1;
    for (const auto& in : node.input()) {
      if (in.empty()) continue;
      CHECK_MESSAGE((!w_results.count(in) || marked || all_w),
                    "'" << node.name() << "' reads the W result '" << in << "'");
    }
    if (marked || all_w) {
      for (const auto& out : node.output())
        if (!out.empty()) w_results.insert(out);
    }
  }
  for (ir::ValueId w : spec.wanted) {
    if (g.value(w).is_initializer()) continue;
    std::vector<std::string> todo{grad::grad_name(g.value(w).name)};
    std::set<std::string> visited;
    while (!todo.empty()) {
      std::string name = todo.back();
      todo.pop_back();
      if (!visited.insert(name).second || !producer.count(name)) continue;
      const onnx::NodeProto& node = *producer[name];
      CHECK_MESSAGE(int_attr(node, grad::kWeightGradAttr, 0) == 0,
                    "'" << g.value(w).name << "@grad' depends on W node '" << node.name() << "'");
      for (const auto& in : node.input()) todo.push_back(in);
    }
  }
  // Deterministic.
  std::vector<ir::ValueId> again_missing;
  CHECK(build_backward(g, spec, &again_missing).SerializeAsString() == m.SerializeAsString());
}

std::vector<const onnx::NodeProto*> nodes_of(const onnx::ModelProto& m,
                                             const std::string& op_type) {
  std::vector<const onnx::NodeProto*> out;
  for (const auto& n : m.graph().node()) {
    if (n.op_type() == op_type) out.push_back(&n);
  }
  return out;
}

/// Stage `s` of `stage_of` as the planner would describe it: seeds at the float values a later
/// stage (or the graph's outputs) reads; wanted: float values from other stages, then weights.
BackwardSpec stage_spec(const ir::Graph& g, const std::vector<int>& stage_of, int s) {
  BackwardSpec spec;
  for (ir::NodeId n : g.topological_order()) {
    if (stage_of[n] == s) spec.nodes.push_back(n);
  }
  std::set<ir::ValueId> seen;
  for (ir::NodeId n : spec.nodes) {
    for (ir::ValueId in : g.node(n).inputs) {
      if (in == ir::kNoId || !seen.insert(in).second) continue;
      const ir::Value& v = g.value(in);
      if (v.producer != ir::kNoId && stage_of[v.producer] != s && is_floating(v.dtype))
        spec.wanted.push_back(in);
    }
    for (ir::ValueId out : g.node(n).outputs) {
      if (out == ir::kNoId || !is_floating(g.value(out).dtype)) continue;
      bool later = g.value(out).is_graph_output;
      for (ir::NodeId u : g.value(out).consumers) later |= stage_of[u] != s;
      if (later) spec.output_grads.push_back(out);
    }
  }
  for (ir::ValueId w : passes::trainable_weights(g, spec.nodes)) spec.wanted.push_back(w);
  return spec;
}

/// Node i of the topological order goes to stage 0 in the first half, stage 1 after.
std::vector<int> two_stages(const ir::Graph& g) {
  std::vector<ir::NodeId> order = g.topological_order();
  std::vector<int> stage_of(g.num_nodes(), -1);
  for (std::size_t i = 0; i < order.size(); ++i) stage_of[order[i]] = i < order.size() / 2 ? 0 : 1;
  return stage_of;
}

}  // namespace stagecraft::autodiff_test
