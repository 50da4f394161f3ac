// The loss pass on tiny graphs built in code: cross-entropy's class axis (from the labels'
// shape, --loss-axis, labels the pass adds), how each axis is lowered to plain ONNX, the ignore
// index, and the one-line refusals.
#include <doctest/doctest.h>
#include <onnx/checker.h>

#include <algorithm>
#include <optional>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "passes/loss.h"
#include "passes/passes.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

/// y = Relu(x), x float32 `scores`; with `labels`, an int64 graph input "labels" of that shape.
ImportedModel scores_model(const testing::TempDir& dir, const std::vector<int64_t>& scores,
                           std::optional<std::vector<int64_t>> labels) {
  onnx::ModelProto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_input();
  g->clear_output();
  testing::add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, scores);
  if (labels) testing::add_tensor_info(g->add_input(), "labels", onnx::TensorProto::INT64, *labels);
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, scores);
  testing::add_node(g, "Relu", {"x"}, {"y"});
  testing::write_model(m, dir.file("m.onnx"));
  return import_model(dir.file("m.onnx"), {});
}

passes::LossOptions cross_entropy(std::optional<int64_t> axis = {}) {
  passes::LossOptions o;
  o.kind = "cross-entropy";
  o.axis = axis;
  return o;
}

/// The op types of the graph's live nodes in topological order.
std::vector<std::string> ops(const ir::Graph& g) {
  std::vector<std::string> out;
  for (ir::NodeId n : g.topological_order()) out.push_back(g.node(n).op_type);
  return out;
}

const ir::Node& node_of(const ir::Graph& g, const std::string& op) {
  for (ir::NodeId n : g.topological_order())
    if (g.node(n).op_type == op) return g.node(n);
  FAIL("no ", op, " node");
  throw;
}

std::vector<int64_t> shape_of(const ir::Graph& g, const std::string& value) {
  return g.value(*g.find_value(value)).shape;
}

/// "<kind> error: message" of the Error `f` throws, as stagec prints it after "stagec: " ("" when
/// it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(to_string(e.kind())) + " error: " + e.what();
  }
  return "";
}

TEST_CASE("labels shaped like the output without its last axis: classes on the last axis") {
  testing::TempDir dir;
  ImportedModel model = scores_model(dir, {2, 3, 4}, std::vector<int64_t>{2, 3});
  passes::AppendedLoss loss = passes::append_loss(model.graph, cross_entropy());
  const ir::Graph& g = model.graph;
  CHECK(ops(g) ==
        std::vector<std::string>{"Relu", "Reshape", "Reshape", "SoftmaxCrossEntropyLoss"});
  // [B,T,V] -> [B*T, V] and [B,T] -> [B*T]: ONNX's [N, C] form, each row's scores contiguous.
  CHECK(shape_of(g, "loss/scores") == std::vector<int64_t>{6, 4});
  CHECK(shape_of(g, "loss/labels") == std::vector<int64_t>{6});
  const ir::Node& sce = node_of(g, "SoftmaxCrossEntropyLoss");
  CHECK(g.value(sce.inputs[0]).name == "loss/scores");
  CHECK(g.value(sce.inputs[1]).name == "loss/labels");
  CHECK(sce.attr_int("ignore_index", 0) == passes::kDefaultIgnoreIndex);
  CHECK(sce.attr_string("reduction", "") == "mean");
  CHECK(loss.summary.find("over axis 2 of 'y' float32[2,3,4] (4 classes; the labels' shape") !=
        std::string::npos);
  // Still a model ONNX itself checks and infers: the loss is a float scalar.
  onnx::ModelProto exported = ir::model_from_graph(g);
  CHECK_NOTHROW(onnx::checker::check_model(exported));
  CHECK_NOTHROW(ir::infer_onnx_shapes(exported));
}

TEST_CASE("labels shaped like the output without axis 1: classes on axis 1") {
  testing::TempDir dir;
  ImportedModel model = scores_model(dir, {2, 3, 4}, std::vector<int64_t>{2, 4});
  passes::append_loss(model.graph, cross_entropy());
  CHECK(ops(model.graph) == std::vector<std::string>{"Relu", "SoftmaxCrossEntropyLoss"});
  CHECK(model.graph.value(node_of(model.graph, "SoftmaxCrossEntropyLoss").inputs[0]).name == "y");
}

TEST_CASE("labels that fit both class axes, or neither, are refused naming both shapes") {
  testing::TempDir dir;
  ImportedModel square = scores_model(dir, {2, 3, 3}, std::vector<int64_t>{2, 3});
  CHECK(error_of([&] { passes::append_loss(square.graph, cross_entropy()); }) ==
        "shape error: --loss cross-entropy: labels 'labels' [2,3] fit both classes on the last "
        "axis of 'y' "
        "[2,3,3] (labels [2,3]) and on axis 1 (labels [2,3]); give --loss-axis 2 or --loss-axis 1");
  testing::TempDir dir2;
  ImportedModel other = scores_model(dir2, {2, 3, 4}, std::vector<int64_t>{2, 5});
  CHECK(error_of([&] { passes::append_loss(other.graph, cross_entropy()); }) ==
        "shape error: --loss cross-entropy: labels 'labels' [2,5] fit neither classes on the last "
        "axis of 'y' "
        "[2,3,4] (labels [2,3]) nor on axis 1 (labels [2,4]); give --loss-axis 2 or --loss-axis 1");
}

TEST_CASE("--loss-axis wins over the labels' shape") {
  testing::TempDir dir;
  ImportedModel square = scores_model(dir, {2, 3, 3}, std::vector<int64_t>{2, 3});
  passes::append_loss(square.graph, cross_entropy(-1));  // settles the ambiguity
  CHECK(ops(square.graph) ==
        std::vector<std::string>{"Relu", "Reshape", "Reshape", "SoftmaxCrossEntropyLoss"});

  testing::TempDir dir2;
  ImportedModel lm = scores_model(dir2, {2, 3, 4}, std::vector<int64_t>{2, 3});
  CHECK(error_of([&] { passes::append_loss(lm.graph, cross_entropy(1)); }) ==
        "shape error: --labels labels: the model's input is int64[2,3] but --loss cross-entropy "
        "with classes on "
        "axis 1 (--loss-axis) needs int64[2,4]");

  // A middle axis moves to axis 1 by a Transpose; the labels keep their shape.
  testing::TempDir dir3;
  ImportedModel map = scores_model(dir3, {2, 3, 4, 5}, std::nullopt);
  passes::append_loss(map.graph, cross_entropy(2));
  CHECK(ops(map.graph) == std::vector<std::string>{"Relu", "Transpose", "SoftmaxCrossEntropyLoss"});
  CHECK(node_of(map.graph, "Transpose").attr_ints("perm") == std::vector<int64_t>{0, 2, 1, 3});
  CHECK(shape_of(map.graph, "loss/scores") == std::vector<int64_t>{2, 4, 3, 5});
  CHECK(shape_of(map.graph, "labels") == std::vector<int64_t>{2, 3, 5});
  onnx::ModelProto exported = ir::model_from_graph(map.graph);
  CHECK_NOTHROW(onnx::checker::check_model(exported));
  CHECK_NOTHROW(ir::infer_onnx_shapes(exported));

  testing::TempDir dir4;
  ImportedModel batch = scores_model(dir4, {2, 3, 4}, std::nullopt);
  CHECK(error_of([&] { passes::append_loss(batch.graph, cross_entropy(0)); }) ==
        "usage error: --loss-axis 0: the model's output 'y' is [2,3,4]; its class axis is one of "
        "1..2 or -2..-1 "
        "(axis 0 is the batch)");
}

TEST_CASE("labels the pass adds: axis 1 for [N, C] and rank 4+, the last axis for rank 3") {
  testing::TempDir dir;
  ImportedModel lm = scores_model(dir, {2, 3, 4}, std::nullopt);
  passes::AppendedLoss loss = passes::append_loss(lm.graph, cross_entropy());
  CHECK(shape_of(lm.graph, "labels") == std::vector<int64_t>{2, 3});
  CHECK(lm.graph.value(*lm.graph.find_value("labels")).is_graph_input);
  CHECK(loss.summary.find("labels 'labels' int64[2,3] per microbatch (added), ignore index -100") !=
        std::string::npos);

  testing::TempDir dir2;
  ImportedModel classifier = scores_model(dir2, {2, 10}, std::nullopt);
  passes::LossOptions o = cross_entropy();
  o.ignore_index = 0;
  passes::append_loss(classifier.graph, o);
  CHECK(shape_of(classifier.graph, "labels") == std::vector<int64_t>{2});
  CHECK(ops(classifier.graph) == std::vector<std::string>{"Relu", "SoftmaxCrossEntropyLoss"});
  CHECK(node_of(classifier.graph, "SoftmaxCrossEntropyLoss").attr_int("ignore_index", -1) == 0);

  // A segmentation map [N, C, H, W]: PyTorch's cross_entropy takes the classes on axis 1, and
  // so does stagec (before, the last axis: "5 classes" of what were W positions).
  testing::TempDir dir3;
  ImportedModel segmenter = scores_model(dir3, {2, 3, 4, 5}, std::nullopt);
  const passes::AppendedLoss seg = passes::append_loss(segmenter.graph, cross_entropy());
  CHECK(shape_of(segmenter.graph, "labels") == std::vector<int64_t>{2, 4, 5});
  CHECK(seg.summary.find("cross-entropy over axis 1 of") != std::string::npos);
  CHECK(seg.summary.find("--loss-axis -1 for classes on the last axis") != std::string::npos);
}

TEST_CASE("cross-entropy's flags are refused for another loss") {
  testing::TempDir dir;
  ImportedModel model = scores_model(dir, {2, 10}, std::nullopt);
  passes::LossOptions o;
  o.kind = "mse";
  o.ignore_index = -100;
  CHECK(error_of([&] { passes::append_loss(model.graph, o); }) ==
        "usage error: --ignore-index is only for --loss cross-entropy (--loss mse given)");
}

TEST_CASE("mixed precision: the loss reads 16-bit scores through the loss pass's view") {
  // passes::reads_sixteen_bit_scores: a language model's [B, T, V] scores, reshaped by the loss
  // pass to [B * T, V], reach our domain's loss in bfloat16 (no Cast to float32); scores a
  // float32 node makes (here: the Relu's output kept as a graph output) stay float32 on the way.
  for (bool kept : {false, true}) {
    CAPTURE(kept);
    testing::TempDir dir;
    ImportedModel lm = scores_model(dir, {2, 3, 4}, std::nullopt);
    passes::append_loss(lm.graph, cross_entropy());
    if (kept) lm.graph.value(*lm.graph.find_value("y")).is_graph_output = true;
    passes::PassContext context;
    passes::MixedPrecision().run(lm.graph, context);
    const ir::Node& loss = node_of(lm.graph, "SoftmaxCrossEntropyLoss");
    const ir::Node& view = lm.graph.node(lm.graph.value(loss.inputs[0]).producer);
    CHECK(view.op_type == "Reshape");
    CHECK(view.name.rfind("loss/", 0) == 0);
    const DType scores = kept ? DType::kFloat32 : DType::kBFloat16;
    CHECK(lm.graph.value(loss.inputs[0]).dtype == scores);
    CHECK(lm.graph.value(view.outputs[0]).dtype == scores);
    CHECK(loss.domain == (kept ? "" : "ai.stagecraft"));
    CHECK(lm.graph.value(loss.outputs[0]).dtype == DType::kFloat32);
    const std::vector<std::string> order = ops(lm.graph);
    // x cast to bf16 on entry, or nothing cast at all.
    CHECK(std::count(order.begin(), order.end(), "Cast") == (kept ? 0 : 1));
  }
}

}  // namespace
}  // namespace stagecraft
