// Autodiff (passes/autodiff.cpp): the structure of backward programs on graphs built in code and
// on the samples, the per-op rules of ops.def, and refused specs.
#include <doctest/doctest.h>
#include <onnx/checker.h>

#include <algorithm>
#include <map>
#include <set>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "passes/autodiff.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "tests/autodiff/autodiff_util.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using namespace autodiff_test;
using passes::BackwardSpec;
using passes::build_backward;
using testing::add_node;

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

TEST_CASE("an Add input of the output's shape takes dy itself: no AddGrad copies it") {
  // A residual block with a bias Add: h = x @ W + b (b broadcast), r = Relu(h), y = h + r.
  onnx::ModelProto model = empty_model();
  auto* gp = model.mutable_graph();
  testing::add_tensor_info(gp->add_input(), "x", kFloat, {2, 4});
  testing::add_float_initializer(gp, "W", {4, 4});
  testing::add_float_initializer(gp, "b", {4});
  add_node(gp, "MatMul", {"x", "W"}, {"m"}, "mm");
  add_node(gp, "Add", {"m", "b"}, {"h"}, "bias");
  add_node(gp, "Relu", {"h"}, {"r"}, "relu");
  add_node(gp, "Add", {"h", "r"}, {"y"}, "residual");
  testing::add_tensor_info(gp->add_output(), "y", kFloat, {2, 4});
  ir::Graph g = import_proto(model);
  BackwardSpec spec = whole_graph_spec(g);
  spec.wanted.push_back(value(g, "x"));
  spec.output_grads = {value(g, "y")};
  std::vector<ir::ValueId> missing;
  onnx::ModelProto m = build_backward(g, spec, &missing);
  check_structure(g, spec, m, missing);
  // The residual Add: both inputs take y@grad; no node.
  CHECK(find_node(m, "residual@grad") == nullptr);
  CHECK(find_node(m, "residual@grad_w") == nullptr);
  const auto* relu = find_node(m, "relu@grad");
  REQUIRE(relu);
  CHECK(std::find(relu->input().begin(), relu->input().end(), "y@grad") != relu->input().end());
  // h's gradient: y@grad (the residual's) plus Relu's, summed into h@grad.
  const onnx::NodeProto* sum = nullptr;
  for (const auto* n : nodes_of(m, "Add"))
    if (n->output(0) == "h@grad") sum = n;
  REQUIRE(sum);
  std::vector<std::string> parts = names(sum->input());
  std::sort(parts.begin(), parts.end());
  CHECK(parts == std::vector<std::string>{"h@grad.1", "y@grad"});
  // The bias Add: the activation side passes h@grad on (MatMul's gradient reads it); the bias
  // side is broadcast, so it keeps its node, which sums over the rows into b@grad.
  CHECK(find_node(m, "bias@grad") == nullptr);
  const auto* bias_w = find_node(m, "bias@grad_w");
  REQUIRE(bias_w);
  CHECK(names(bias_w->output()) == std::vector<std::string>{"", "b@grad"});
  const auto* mm = find_node(m, "mm@grad");
  REQUIRE(mm);
  CHECK(std::find(mm->input().begin(), mm->input().end(), "h@grad") != mm->input().end());
  // x is wanted: its gradient is mm@grad's own output, named x@grad.
  CHECK(names(mm->output())[0] == "x@grad");
  CHECK(nodes_of(m, "AddGrad").size() == 1);
}

TEST_CASE("a loss stage: loss@grad seeds SoftmaxCrossEntropyLoss - labels get no gradient") {
  ir::Graph g = import_proto(loss_stage_model());
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

}  // namespace
}  // namespace stagecraft
