// Autodiff (passes/autodiff.cpp): the structure of backward programs on graphs built in code and
// on the samples, and weight gradients of toy.onnx against finite differences.
#include "passes/autodiff.h"

#include <doctest/doctest.h>
#include <onnx/checker.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using passes::BackwardSpec;
using passes::build_backward;
using testing::add_node;
constexpr int32_t kFloat = onnx::TensorProto::FLOAT;
constexpr int32_t kInt64 = onnx::TensorProto::INT64;

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
  for (const auto& node : graph.node()) {
    for (const auto& out : node.output()) producer[out] = &node;
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
      CHECK_MESSAGE((!w_results.count(in) || marked || all_w),
                    "'" << node.name() << "' reads the W result '" << in << "'");
    }
    if (marked || all_w) {
      for (const auto& out : node.output()) w_results.insert(out);
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

TEST_CASE("toy.onnx: one stage, weights wanted - every gradient node is a weight-gradient node") {
  ImportOptions options;
  options.batch = 4;
  ir::Graph g = import_model(sample("toy.onnx"), options).graph;
  BackwardSpec spec = whole_graph_spec(g);
  std::vector<std::string> weights;
  for (ir::ValueId w : spec.wanted) weights.push_back(g.value(w).name);
  CHECK(weights == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  spec.output_grads = {value(g, "y")};
  std::vector<ir::ValueId> missing;
  onnx::ModelProto m = build_backward(g, spec, &missing);
  CHECK(missing.empty());
  check_structure(g, spec, m, missing);

  CHECK(names(m.graph().input())[0] == "y@grad");
  bool has_domain = false;
  for (const auto& imp : m.opset_import())
    has_domain |= imp.domain() == grad::kGradDomain && imp.version() == 1;
  CHECK(has_domain);
  // Reverse order; no activation is wanted, so everything belongs to W.
  REQUIRE(m.graph().node_size() == 3);
  CHECK(m.graph().node(0).name() == "/fc2/Gemm@grad_w");
  CHECK(m.graph().node(1).name() == "/relu/Relu@grad_w");
  CHECK(m.graph().node(2).name() == "/fc1/Gemm@grad_w");
  for (const auto& n : m.graph().node()) CHECK(int_attr(n, grad::kWeightGradAttr, 0) == 1);
  const auto& fc1 = m.graph().node(2);
  CHECK(fc1.op_type() == "GemmGrad");
  CHECK(fc1.domain() == grad::kGradDomain);
  CHECK(int_attr(fc1, grad::kForwardInputsAttr, 0) == 3);
  CHECK(int_attr(fc1, "transB", 0) == 1);  // the forward attributes travel along
  CHECK(names(fc1.input()) == std::vector<std::string>{"x", "fc1.weight", "fc1.bias",
                                                       "/fc1/Gemm_output_0",
                                                       "/fc1/Gemm_output_0@grad"});
  CHECK(names(fc1.output()) == std::vector<std::string>{"", "fc1.weight@grad", "fc1.bias@grad"});
}

TEST_CASE(
    "toy.onnx with its input wanted: nodes with both kinds of gradient are split into B and W") {
  ImportOptions options;
  options.batch = 4;
  ir::Graph g = import_model(sample("toy.onnx"), options).graph;
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.insert(spec.wanted.begin(), value(g, "x"));
  spec.output_grads = {value(g, "y")};
  std::vector<ir::ValueId> missing;
  onnx::ModelProto m = build_backward(g, spec, &missing);
  check_structure(g, spec, m, missing);
  std::vector<std::string> order;
  for (const auto& n : m.graph().node()) order.push_back(n.name());
  CHECK(order == std::vector<std::string>{"/fc2/Gemm@grad", "/fc2/Gemm@grad_w", "/relu/Relu@grad",
                                          "/fc1/Gemm@grad", "/fc1/Gemm@grad_w"});
  const auto* b = find_node(m, "/fc1/Gemm@grad");
  const auto* w = find_node(m, "/fc1/Gemm@grad_w");
  REQUIRE(b);
  REQUIRE(w);
  CHECK(int_attr(*b, grad::kWeightGradAttr, 0) == 0);
  CHECK(int_attr(*w, grad::kWeightGradAttr, 0) == 1);
  CHECK(names(b->output()) == std::vector<std::string>{"x@grad", "", ""});
  CHECK(names(w->output()) == std::vector<std::string>{"", "fc1.weight@grad", "fc1.bias@grad"});
  CHECK(names(b->input()) == names(w->input()));
  CHECK(int_attr(*find_node(m, "/relu/Relu@grad"), grad::kWeightGradAttr, 0) == 0);
  CHECK(names(m.graph().output())[0] == "x@grad");
  // The runtime finds the same W part.
  try {
    auto program = rt::Program::from_model(m, rt::cpu_backend(), "toy_backward.onnx");
    std::vector<bool> expected;
    for (const auto& n : m.graph().node())
      expected.push_back(int_attr(n, grad::kWeightGradAttr, 0) == 1);
    CHECK(program.weight_gradient_nodes() == expected);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUnsupported) throw;
    MESSAGE("W-part check skipped: " << std::string(e.what()));
  }
}

/// h = x W; y1 = Relu(h); y2 = Sigmoid(h); y3 = x * V.
onnx::ModelProto branchy_model() {
  onnx::ModelProto m = empty_model();
  auto* g = m.mutable_graph();
  testing::add_tensor_info(g->add_input(), "x", kFloat, {2, 4});
  testing::add_float_initializer(g, "W", {4, 4});
  testing::add_float_initializer(g, "V", {2, 4});
  add_node(g, "MatMul", {"x", "W"}, {"h"}, "mm");
  add_node(g, "Relu", {"h"}, {"y1"}, "relu");
  add_node(g, "Sigmoid", {"h"}, {"y2"}, "sigmoid");
  add_node(g, "Mul", {"x", "V"}, {"y3"}, "mul");
  for (const char* y : {"y1", "y2", "y3"})
    testing::add_tensor_info(g->add_output(), y, kFloat, {2, 4});
  return m;
}

TEST_CASE(
    "pruning: branches that reach no seed get no gradient nodes - unreachable wanted values are "
    "reported") {
  ir::Graph g = import_proto(branchy_model());
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.push_back(value(g, "x"));
  spec.output_grads = {value(g, "y1")};
  std::vector<ir::ValueId> missing;
  onnx::ModelProto m = build_backward(g, spec, &missing);
  check_structure(g, spec, m, missing);
  CHECK(missing == std::vector<ir::ValueId>{value(g, "V")});
  std::vector<std::string> order;
  for (const auto& n : m.graph().node()) order.push_back(n.name());
  CHECK(order == std::vector<std::string>{"relu@grad", "mm@grad", "mm@grad_w"});
  CHECK(names(m.graph().output()) == std::vector<std::string>{"W@grad", "x@grad"});
  // x is read twice but only the MatMul contributes: no Add.
  CHECK(nodes_of(m, "Add").empty());
  // The seed of y2 is not an input: only output_grads are.
  auto inputs = names(m.graph().input());
  CHECK(std::find(inputs.begin(), inputs.end(), "y2@grad") == inputs.end());

  SUBCASE("seeding y2 too brings the Sigmoid in and sums the two gradients of h") {
    spec.output_grads.push_back(value(g, "y2"));
    missing.clear();
    m = build_backward(g, spec, &missing);
    check_structure(g, spec, m, missing);
    CHECK(find_node(m, "sigmoid@grad"));
    auto adds = nodes_of(m, "Add");
    REQUIRE(adds.size() == 1);
    CHECK(names(adds[0]->output()) == std::vector<std::string>{"h@grad"});
  }
  SUBCASE("no path at all: nothing to compute") {
    spec.output_grads.clear();
    missing.clear();
    m = build_backward(g, spec, &missing);
    CHECK(m.graph().node_size() == 0);
    CHECK(m.graph().output_size() == 0);
    CHECK(missing.size() == spec.wanted.size());
  }
}

TEST_CASE("accumulation: a value read several times gets its partial gradients summed with Add") {
  onnx::ModelProto model = empty_model();
  auto* gp = model.mutable_graph();
  testing::add_tensor_info(gp->add_input(), "x", kFloat, {2, 4});
  testing::add_float_initializer(gp, "W", {4, 4});
  add_node(gp, "Relu", {"x"}, {"a"}, "relu");
  add_node(gp, "Mul", {"x", "x"}, {"b"}, "square");  // one node reading x twice
  add_node(gp, "Add", {"a", "b"}, {"c"}, "sum");
  add_node(gp, "MatMul", {"c", "W"}, {"d"}, "mm1");
  add_node(gp, "MatMul", {"d", "W"}, {"y"}, "mm2");  // a tied weight
  testing::add_tensor_info(gp->add_output(), "y", kFloat, {2, 4});
  ir::Graph g = import_proto(model);
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.push_back(value(g, "x"));
  spec.output_grads = {value(g, "y")};
  std::vector<ir::ValueId> missing;
  onnx::ModelProto m = build_backward(g, spec, &missing);
  check_structure(g, spec, m, missing);

  std::map<std::string, std::vector<std::string>> add_inputs;
  std::map<std::string, int> position;
  for (int i = 0; i < m.graph().node_size(); ++i) {
    const auto& n = m.graph().node(i);
    for (const auto& out : n.output()) position[out] = i;
    if (n.op_type() == "Add") add_inputs[n.output(0)] = names(n.input());
  }
  // x: Relu's, and the two of Mul(x, x): two Adds, the last named x@grad.
  REQUIRE(add_inputs.count("x@grad"));
  CHECK(add_inputs.count("x@grad.sum1"));
  const auto* square = find_node(m, "square@grad");
  REQUIRE(square);
  CHECK(names(square->output()) == std::vector<std::string>{"x@grad.0", "x@grad.1"});
  CHECK(find_node(m, "square@grad_w") == nullptr);
  // W: both MatMuls; the sum is fed only by W-side nodes.
  REQUIRE(add_inputs.count("W@grad"));
  for (const auto& part : add_inputs["W@grad"]) {
    const auto& producer = m.graph().node(position.at(part));
    CHECK(int_attr(producer, grad::kWeightGradAttr, 0) == 1);
  }
  CHECK(names(find_node(m, "mm2@grad_w")->output()) == std::vector<std::string>{"", "W@grad.0"});
  CHECK(names(find_node(m, "mm1@grad_w")->output()) == std::vector<std::string>{"", "W@grad.1"});
  // x and W have no producer in the stage: their sums come last, in wanted order (W, x).
  CHECK(position.at("W@grad") == m.graph().node_size() - 3);
  CHECK(position.at("x@grad") == m.graph().node_size() - 1);
}

TEST_CASE("a loss stage: loss@grad seeds SoftmaxCrossEntropyLoss - labels get no gradient") {
  onnx::ModelProto model = empty_model();
  auto* gp = model.mutable_graph();
  testing::add_tensor_info(gp->add_input(), "x", kFloat, {4, 6});
  testing::add_tensor_info(gp->add_input(), "labels", kInt64, {4});
  testing::add_float_initializer(gp, "W", {6, 5});
  testing::add_float_initializer(gp, "b", {5});
  add_node(gp, "Gemm", {"x", "W", "b"}, {"scores"}, "fc");
  add_node(gp, "SoftmaxCrossEntropyLoss", {"scores", "labels"}, {"loss"}, "sce");
  testing::add_tensor_info(gp->add_output(), "loss", kFloat, {});
  ir::Graph g = import_proto(model);
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.push_back(value(g, "x"));
  spec.loss = value(g, "loss");
  std::vector<ir::ValueId> missing;
  onnx::ModelProto m = build_backward(g, spec, &missing);
  check_structure(g, spec, m, missing);
  REQUIRE(m.graph().input_size() > 0);
  CHECK(m.graph().input(0).name() == grad::kLossGradName);
  const auto* sce = find_node(m, "sce@grad");
  REQUIRE(sce);
  CHECK(sce->op_type() == "SoftmaxCrossEntropyLossGrad");
  CHECK(names(sce->input()) == std::vector<std::string>{"scores", "labels", "loss", "loss@grad"});
  CHECK(names(sce->output()) == std::vector<std::string>{"scores@grad", ""});
  auto inputs = names(m.graph().input());
  CHECK(std::find(inputs.begin(), inputs.end(), "labels") != inputs.end());
  CHECK(names(m.graph().output()) == std::vector<std::string>{"W@grad", "b@grad", "x@grad"});

  SUBCASE("a loss that is not a float32 scalar is refused") {
    spec.loss = value(g, "scores");
    CHECK_THROWS_AS(build_backward(g, spec), Error);
  }
}

TEST_CASE("per-op rules: shapes, indices, bounds and running statistics are not differentiable") {
  using passes::differentiable_input;
  using passes::has_gradient;
  for (const char* op : {"Shape", "ConstantOfShape", "Range", "Equal", "Constant", "NoSuchOp"})
    CHECK_FALSE(has_gradient(op));
  for (const char* op : {"Gemm", "Relu", "Reshape", "SoftmaxCrossEntropyLoss", "Cast", "Where"})
    CHECK(has_gradient(op));
  CHECK(differentiable_input("BatchNormalization", 2));
  CHECK_FALSE(differentiable_input("BatchNormalization", 3));
  CHECK_FALSE(differentiable_input("BatchNormalization", 4));
  CHECK_FALSE(differentiable_input("Where", 0));
  CHECK(differentiable_input("Where", 1));
  CHECK(differentiable_input("Pow", 1));
  CHECK_FALSE(differentiable_input("Gather", 1));
  CHECK_FALSE(differentiable_input("Slice", 1));
  CHECK(differentiable_input("Concat", 2));

  onnx::ModelProto model = empty_model();
  auto* gp = model.mutable_graph();
  testing::add_tensor_info(gp->add_input(), "ids", kInt64, {2, 3});
  testing::add_tensor_info(gp->add_input(), "img", kFloat, {2, 4, 2, 2});
  testing::add_float_initializer(gp, "E", {10, 4});
  testing::add_int64_initializer(gp, "shape", {6, 4});
  testing::add_float_initializer(gp, "lo", {});
  testing::add_float_initializer(gp, "hi", {});
  for (const char* p : {"s", "b", "mean", "var"}) testing::add_float_initializer(gp, p, {4});
  add_node(gp, "Gather", {"E", "ids"}, {"emb"}, "gather");
  add_node(gp, "Reshape", {"emb", "shape"}, {"flat"}, "reshape");
  add_node(gp, "Clip", {"flat", "lo", "hi"}, {"y1"}, "clip");
  add_node(gp, "BatchNormalization", {"img", "s", "b", "mean", "var"}, {"y2"}, "bn");
  testing::add_tensor_info(gp->add_output(), "y1", kFloat, {6, 4});
  testing::add_tensor_info(gp->add_output(), "y2", kFloat, {2, 4, 2, 2});
  ir::Graph g = import_proto(model);
  BackwardSpec spec = whole_graph_spec(g);
  std::vector<std::string> weights;
  for (ir::ValueId w : spec.wanted) weights.push_back(g.value(w).name);
  CHECK(weights == std::vector<std::string>{"E", "s", "b"});
  spec.output_grads = {value(g, "y1"), value(g, "y2")};
  std::vector<ir::ValueId> missing;
  onnx::ModelProto m = build_backward(g, spec, &missing);
  check_structure(g, spec, m, missing);
  CHECK(missing.empty());
  CHECK(names(find_node(m, "gather@grad_w")->output()) == std::vector<std::string>{"E@grad", ""});
  CHECK(names(find_node(m, "reshape@grad_w")->output()) ==
        std::vector<std::string>{"emb@grad", ""});
  CHECK(names(find_node(m, "clip@grad_w")->output()) ==
        std::vector<std::string>{"flat@grad", "", ""});
  CHECK(names(find_node(m, "bn@grad_w")->output()) ==
        std::vector<std::string>{"", "s@grad", "b@grad", "", ""});
  // The Reshape target is a constant, embedded; the Clip bounds are (frozen) weights, inputs.
  REQUIRE(m.graph().initializer_size() == 1);
  CHECK(m.graph().initializer(0).name() == "shape");
  auto inputs = names(m.graph().input());
  for (const char* name : {"lo", "hi", "mean", "var", "E", "ids", "img"})
    CHECK_MESSAGE(std::find(inputs.begin(), inputs.end(), name) != inputs.end(), name);
}

TEST_CASE("inconsistent specs are refused with the value named") {
  ir::Graph g = import_proto(branchy_model());
  BackwardSpec spec = whole_graph_spec(g);
  spec.output_grads = {value(g, "y1")};
  SUBCASE("a wanted value no stage node reads") {
    spec.wanted.push_back(value(g, "y2"));
    CHECK_THROWS_WITH_AS(build_backward(g, spec), doctest::Contains("'y2' is read by no node"),
                         Error);
  }
  SUBCASE("nodes out of execution order") {
    std::reverse(spec.nodes.begin(), spec.nodes.end());
    CHECK_THROWS_WITH_AS(build_backward(g, spec), doctest::Contains("out of order"), Error);
  }
  SUBCASE("a value both seeded and wanted") {
    spec.wanted.push_back(value(g, "y1"));
    CHECK_THROWS_AS(build_backward(g, spec), Error);
  }
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

TEST_CASE(
    "gpt_tiny.onnx: whole and in two stages, every gradient node reads defined, typed tensors") {
  ImportOptions options;
  options.batch = 2;
  options.dims["seq"] = 8;
  ir::Graph g = import_model(sample("gpt_tiny.onnx"), options).graph;

  SUBCASE("one stage") {
    BackwardSpec spec = whole_graph_spec(g);
    for (ir::ValueId out : g.outputs) {
      if (is_floating(g.value(out).dtype)) spec.output_grads.push_back(out);
    }
    REQUIRE_FALSE(spec.output_grads.empty());
    std::vector<ir::ValueId> missing;
    onnx::ModelProto m = build_backward(g, spec, &missing);
    check_structure(g, spec, m, missing);
    CHECK(missing.empty());
    CHECK(m.graph().output_size() == static_cast<int>(spec.wanted.size()));
  }
  SUBCASE("two stages") {
    std::vector<int> stage_of = two_stages(g);
    for (int s = 0; s < 2; ++s) {
      CAPTURE(s);
      BackwardSpec spec = stage_spec(g, stage_of, s);
      // Stage 1 wants the activations stage 0 sends it; stage 0 only weights (its input is ids).
      CHECK((spec.wanted.size() > passes::trainable_weights(g, spec.nodes).size()) == (s == 1));
      std::vector<ir::ValueId> missing;
      onnx::ModelProto m = build_backward(g, spec, &missing);
      check_structure(g, spec, m, missing);
      CHECK(missing.empty());
    }
  }
}

// ---- Numerical check against finite differences -------------------------------------------------

rt::Tensor to_tensor(const ir::Value& v) {
  rt::Tensor t = rt::Tensor::owned(v.dtype, v.shape);
  auto bytes = v.initializer->bytes();
  REQUIRE(static_cast<int64_t>(bytes.size()) == t.bytes());
  std::memcpy(t.data, bytes.data(), bytes.size());
  return t;
}

rt::Tensor random_tensor(const rt::Shape& shape, unsigned seed) {
  rt::Tensor t = rt::Tensor::owned(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = u(rng);
  return t;
}

/// A tensor for an unbound input: uniform in [-1, 1) for floats; small indices (0..6) for int64.
rt::Tensor any_input(const ir::Value& v, unsigned seed) {
  if (v.dtype == DType::kFloat32) return random_tensor(v.shape, seed);
  REQUIRE_MESSAGE(v.dtype == DType::kInt64,
                  "no test data for '" << v.name << "' of " << dtype_name(v.dtype));
  rt::Tensor t = rt::Tensor::owned(DType::kInt64, v.shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.as<int64_t>()[i] = (5 * i + 2) % 7;
  return t;
}

/// Runs `program` on the tensors named in `bound` (by input name).
std::map<std::string, rt::Tensor> run(const rt::Program& program,
                                      const std::map<std::string, rt::Tensor>& bound) {
  std::vector<rt::Tensor> args;
  for (const rt::ValueInfo& in : program.inputs()) {
    auto it = bound.find(in.name);
    REQUIRE_MESSAGE(it != bound.end(), "nothing bound to input '" << in.name << "'");
    args.push_back(it->second);
  }
  auto device = rt::cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<std::size_t>(program.arena_bytes()) + 64);
  std::vector<rt::Tensor> outs = program.run(*device, args, arena.data());
  std::map<std::string, rt::Tensor> named;
  for (std::size_t k = 0; k < outs.size(); ++k) named[program.outputs()[k].name] = outs[k];
  return named;
}

/// Checks every gradient the backward program of `spec` outputs against central differences of
/// L = loss + sum over the seeded outputs V of 0.5 |V - t_V|^2 (random targets t_V), with the
/// seeds dL/dloss = 1 and dL/dV = V - t_V. `inputs` binds the graph inputs. Returns false (with
/// a MESSAGE) when the cpu backend lacks a kernel the programs need. At most `samples_per_value`
/// elements of each wanted value are perturbed (evenly spread), by +-eps.
bool check_numerically(const ir::Graph& g, const BackwardSpec& spec,
                       std::map<std::string, rt::Tensor> bound, int64_t samples_per_value = 1 << 30,
                       double eps = 1e-3) {
  onnx::ModelProto backward = build_backward(g, spec);
  // The forward program takes the weights as inputs (so they can be perturbed) and returns every
  // forward value the backward program reads.
  ir::ExportOptions fo;
  fo.weights = ir::WeightMode::kAsInputs;
  fo.nodes = spec.nodes;
  onnx::ModelProto forward = ir::model_from_graph(g, fo);
  std::set<std::string> needed;
  for (const auto& in : backward.graph().input()) needed.insert(in.name());
  if (spec.loss) needed.insert(g.value(*spec.loss).name);
  for (ir::ValueId v : spec.output_grads) needed.insert(g.value(v).name);
  auto* fg = forward.mutable_graph();
  std::set<std::string> outputs;
  for (const auto& o : fg->output()) outputs.insert(o.name());
  for (int i = 0; i < fg->value_info_size();) {
    if (needed.count(fg->value_info(i).name()) && !outputs.count(fg->value_info(i).name())) {
      *fg->add_output() = fg->value_info(i);
      fg->mutable_value_info()->DeleteSubrange(i, 1);
    } else {
      ++i;
    }
  }
  std::optional<rt::Program> fp, bp;
  try {
    fp.emplace(rt::Program::from_model(forward, rt::cpu_backend(), "forward.onnx"));
    bp.emplace(rt::Program::from_model(backward, rt::cpu_backend(), "backward.onnx"));
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUnsupported) throw;
    MESSAGE("numerical check skipped: the cpu backend lacks a kernel: " << std::string(e.what()));
    return false;
  }
  unsigned input_seed = 50;
  for (const auto& in : fp->inputs()) {
    if (bound.count(in.name)) continue;
    auto v = g.find_value(in.name);
    REQUIRE(v.has_value());
    bound[in.name] = g.value(*v).is_initializer() ? to_tensor(g.value(*v))
                                                  : any_input(g.value(*v), input_seed++);
  }
  std::map<std::string, rt::Tensor> targets;
  unsigned seed = 100;
  for (ir::ValueId v : spec.output_grads)
    targets[g.value(v).name] = random_tensor(g.value(v).shape, seed++);

  auto loss = [&](const std::map<std::string, rt::Tensor>& in) {
    auto out = run(*fp, in);
    double l = spec.loss ? out.at(g.value(*spec.loss).name).as<float>()[0] : 0.0;
    for (const auto& [name, t] : targets) {
      const rt::Tensor& y = out.at(name);
      for (int64_t i = 0; i < y.numel(); ++i) {
        double d = static_cast<double>(y.as<float>()[i]) - t.as<float>()[i];
        l += 0.5 * d * d;
      }
    }
    return l;
  };

  std::map<std::string, rt::Tensor> bwd_in = bound;
  for (const auto& [name, t] : run(*fp, bound)) bwd_in[name] = t;
  for (const auto& [name, t] : targets) {
    rt::Tensor dy = rt::clone(bwd_in.at(name));
    for (int64_t i = 0; i < dy.numel(); ++i) dy.as<float>()[i] -= t.as<float>()[i];
    bwd_in[grad::grad_name(name)] = dy;
  }
  if (spec.loss) {
    rt::Tensor one = rt::Tensor::owned(DType::kFloat32, {});
    one.as<float>()[0] = 1.0f;
    bwd_in[std::string(grad::kLossGradName)] = one;
  }
  auto grads = run(*bp, bwd_in);

  for (ir::ValueId w : spec.wanted) {
    const std::string& name = g.value(w).name;
    CAPTURE(name);
    REQUIRE(grads.count(name + "@grad"));
    const rt::Tensor& grad = grads.at(name + "@grad");
    rt::Tensor& param = bound.at(name);
    param = rt::clone(param);
    double largest = 0;
    const int64_t stride = std::max<int64_t>(1, param.numel() / samples_per_value);
    for (int64_t i = 0; i < param.numel(); i += stride) {
      float keep = param.as<float>()[i];
      param.as<float>()[i] = keep + static_cast<float>(eps);
      double up = loss(bound);
      param.as<float>()[i] = keep - static_cast<float>(eps);
      double down = loss(bound);
      param.as<float>()[i] = keep;
      double fd = (up - down) / (2 * eps);
      double got = grad.as<float>()[i];
      largest = std::max(largest, std::abs(fd));
      CAPTURE(i);
      CHECK(std::abs(got - fd) <= 2e-3 + 2e-2 * std::abs(fd));
    }
    CHECK(largest > 1e-4);  // the check compares something
  }
  return true;
}

TEST_CASE("numerically: toy.onnx, weights and input, 0.5 |y - t|^2 (Gemm, Relu, B/W split)") {
  ImportOptions options;
  options.batch = 3;
  ir::Graph g = import_model(sample("toy.onnx"), options).graph;
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.push_back(value(g, "x"));
  spec.output_grads = {value(g, "y")};
  check_numerically(g, spec, {{"x", random_tensor(g.value(value(g, "x")).shape, 7)}});
}

TEST_CASE("numerically: accumulation over a value read three times and a tied weight") {
  onnx::ModelProto model = empty_model();
  auto* gp = model.mutable_graph();
  testing::add_tensor_info(gp->add_input(), "x", kFloat, {2, 4});
  testing::add_float_initializer(gp, "W", {4, 4});
  add_node(gp, "Relu", {"x"}, {"a"}, "relu");
  add_node(gp, "Mul", {"x", "x"}, {"b"}, "square");
  add_node(gp, "Add", {"a", "b"}, {"c"}, "sum");
  add_node(gp, "MatMul", {"c", "W"}, {"d"}, "mm1");
  add_node(gp, "MatMul", {"d", "W"}, {"y"}, "mm2");
  testing::add_tensor_info(gp->add_output(), "y", kFloat, {2, 4});
  ir::Graph g = import_proto(model);
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.push_back(value(g, "x"));
  spec.output_grads = {value(g, "y")};
  check_numerically(g, spec, {{"x", random_tensor({2, 4}, 3)}});
}

TEST_CASE("numerically: a loss stage (Gemm, SoftmaxCrossEntropyLoss) seeded with loss@grad") {
  onnx::ModelProto model = empty_model();
  auto* gp = model.mutable_graph();
  testing::add_tensor_info(gp->add_input(), "x", kFloat, {4, 6});
  testing::add_tensor_info(gp->add_input(), "labels", kInt64, {4});
  testing::add_float_initializer(gp, "W", {6, 5});
  testing::add_float_initializer(gp, "b", {5});
  add_node(gp, "Gemm", {"x", "W", "b"}, {"scores"}, "fc");
  add_node(gp, "SoftmaxCrossEntropyLoss", {"scores", "labels"}, {"loss"}, "sce");
  testing::add_tensor_info(gp->add_output(), "loss", kFloat, {});
  ir::Graph g = import_proto(model);
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.push_back(value(g, "x"));
  spec.loss = value(g, "loss");
  rt::Tensor labels = rt::Tensor::owned(DType::kInt64, {4});
  for (int i = 0; i < 4; ++i) labels.as<int64_t>()[i] = (3 * i + 1) % 5;
  check_numerically(g, spec, {{"x", random_tensor({4, 6}, 5)}, {"labels", labels}});
}

TEST_CASE("numerically: gpt_tiny.onnx, sampled elements of every weight, seeded at its outputs") {
  ImportOptions options;
  options.batch = 1;
  options.dims["seq"] = 4;
  ir::Graph g = import_model(sample("gpt_tiny.onnx"), options).graph;
  BackwardSpec spec = whole_graph_spec(g);
  for (ir::ValueId out : g.outputs) {
    if (is_floating(g.value(out).dtype)) spec.output_grads.push_back(out);
  }
  // Float32 rounding over a few thousand outputs swamps differences at eps = 1e-3.
  check_numerically(g, spec, {}, 4, 1e-2);
}

TEST_CASE("numerically: gpt_tiny.onnx in two stages, activations sent back included") {
  ImportOptions options;
  options.batch = 1;
  options.dims["seq"] = 4;
  ir::Graph g = import_model(sample("gpt_tiny.onnx"), options).graph;
  std::vector<int> stage_of = two_stages(g);
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    check_numerically(g, stage_spec(g, stage_of, s), {}, 3, 1e-2);
  }
}

}  // namespace
}  // namespace stagecraft
