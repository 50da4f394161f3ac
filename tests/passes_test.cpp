// Import passes on tiny graphs built in code: folding, Constant, Identity, dead code.
#include <doctest/doctest.h>
#include <onnx/checker.h>

#include <cstring>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "passes/attributes.h"
#include "passes/host_tensor.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using testing::add_node;

/// x [batch, seq, 8] reshaped to [batch, seq, 2, 4] through the shape subgraph exporters emit.
onnx::ModelProto exporter_style_reshape() {
  onnx::ModelProto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_input();
  g->clear_output();
  testing::add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {-1, -1, 8}, {"batch", "seq"});
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {-1, -1, 2, 4}, {"batch", "seq"});
  testing::add_int64_initializer(g, "zero", {0}, true);
  testing::add_int64_initializer(g, "one", {1}, true);
  testing::add_int64_initializer(g, "axes0", {0});
  add_node(g, "Shape", {"x"}, {"s"});
  add_node(g, "Gather", {"s", "zero"}, {"b"});
  add_node(g, "Gather", {"s", "one"}, {"t"});
  add_node(g, "Unsqueeze", {"b", "axes0"}, {"b1"});
  add_node(g, "Unsqueeze", {"t", "axes0"}, {"t1"});
  auto* c = add_node(g, "Constant", {}, {"c"});
  auto* attr = c->add_attribute();
  attr->set_name("value");
  attr->set_type(onnx::AttributeProto::TENSOR);
  attr->mutable_t()->set_data_type(onnx::TensorProto::INT64);
  attr->mutable_t()->add_dims(2);
  attr->mutable_t()->add_int64_data(2);
  attr->mutable_t()->add_int64_data(4);
  auto* cat = add_node(g, "Concat", {"b1", "t1", "c"}, {"shape4"});
  auto* axis = cat->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(0);
  add_node(g, "Reshape", {"x", "shape4"}, {"r"}, "/attn/Reshape");
  add_node(g, "Identity", {"r"}, {"r2"});
  add_node(g, "Relu", {"r2"}, {"y"}, "/act/Relu");
  return m;
}

std::vector<int64_t> int64_values(const ir::Value& v) {
  auto bytes = v.initializer->bytes();
  std::vector<int64_t> out(bytes.size() / 8);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

/// Writes the exporter-style model and imports it with batch and seq bound.
ImportedModel import_reshape_model(int64_t batch, int64_t seq) {
  testing::TempDir dir;
  testing::write_model(exporter_style_reshape(), dir.file("m.onnx"));
  ImportOptions options;
  options.batch = batch;
  options.dims["seq"] = seq;
  return import_model(dir.file("m.onnx"), options);
}

TEST_CASE("the shape subgraph of an exporter folds into one constant after binding") {
  auto model = import_reshape_model(2, 5);
  const auto& g = model.graph;
  CHECK(model.nodes_in_file == 10);
  REQUIRE(g.live_nodes() == 2);
  const auto& reshape = g.node(g.topological_order()[0]);
  CHECK(reshape.op_type == "Reshape");
  const auto& target = g.value(reshape.inputs[1]);
  REQUIRE(target.is_initializer());
  CHECK(int64_values(target) == std::vector<int64_t>{2, 5, 2, 4});
  const auto& relu = g.node(g.topological_order()[1]);
  CHECK(relu.op_type == "Relu");
  CHECK(g.value(relu.inputs[0]).name == "r");  // the Identity is gone
  CHECK(g.value(g.outputs[0]).shape == std::vector<int64_t>{2, 5, 2, 4});
  CHECK(model.folded.at("constant-to-initializer") == 1);
  CHECK(model.folded.at("drop-identity") == 1);
  CHECK(model.folded.at("fold-constants") == 6);
  REQUIRE(model.bound_dims.size() == 2);
  CHECK(model.bound_dims[1].name == "seq");
  CHECK(model.bound_dims[1].value == 5);
}

TEST_CASE("different bindings give different folded constants") {
  auto model = import_reshape_model(7, 3);
  const auto& g = model.graph;
  const auto& reshape = g.node(g.topological_order()[0]);
  CHECK(int64_values(g.value(reshape.inputs[1])) == std::vector<int64_t>{7, 3, 2, 4});
}

TEST_CASE("a folded graph exports back to a model the ONNX checker accepts, whole or in part") {
  auto model = import_reshape_model(2, 5);
  auto whole = ir::model_from_graph(model.graph);
  CHECK_NOTHROW(onnx::checker::check_model(whole));
  CHECK(whole.graph().input_size() == 1);
  CHECK(whole.graph().initializer_size() == 1);

  ir::ExportOptions second_half;
  second_half.nodes = std::vector<ir::NodeId>{model.graph.topological_order()[1]};
  auto part = ir::model_from_graph(model.graph, second_half);
  CHECK_NOTHROW(onnx::checker::check_model(part));
  REQUIRE(part.graph().input_size() == 1);
  CHECK(part.graph().input(0).name() == "r");
  REQUIRE(part.graph().output_size() == 1);
  CHECK(part.graph().output(0).name() == "y");
}

TEST_CASE("host evaluation: Slice with INT64_MAX end, negative Gather index, Range, Where") {
  ir::Node slice;
  slice.op_type = "Slice";
  passes::HostTensor data{DType::kInt64, {5}, {10, 11, 12, 13, 14}, {}};
  passes::HostTensor starts{DType::kInt64, {1}, {-3}, {}};
  passes::HostTensor ends{DType::kInt64, {1}, {INT64_MAX}, {}};
  auto r = passes::evaluate_on_host(slice, {data, starts, ends}, {}, 17);
  REQUIRE(r);
  CHECK((*r)[0].ints == std::vector<int64_t>{12, 13, 14});

  ir::Node gather;
  gather.op_type = "Gather";
  passes::HostTensor idx{DType::kInt64, {}, {-1}, {}};
  r = passes::evaluate_on_host(gather, {data, idx}, {}, 17);
  REQUIRE(r);
  CHECK((*r)[0].shape.empty());
  CHECK((*r)[0].ints == std::vector<int64_t>{14});
  passes::HostTensor bad{DType::kInt64, {}, {5}, {}};
  CHECK_THROWS_AS(passes::evaluate_on_host(gather, {data, bad}, {}, 17), Error);

  ir::Node range;
  range.op_type = "Range";
  passes::HostTensor s{DType::kInt64, {}, {2}, {}}, l{DType::kInt64, {}, {9}, {}}, d{DType::kInt64, {}, {3}, {}};
  r = passes::evaluate_on_host(range, {s, l, d}, {}, 17);
  REQUIRE(r);
  CHECK((*r)[0].ints == std::vector<int64_t>{2, 5, 8});

  ir::Node where;
  where.op_type = "Where";
  passes::HostTensor cond{DType::kBool, {2}, {1, 0}, {}};
  passes::HostTensor a{DType::kFloat32, {1}, {}, {1.5}}, b{DType::kFloat32, {2}, {}, {-1, -2}};
  r = passes::evaluate_on_host(where, {cond, a, b}, {}, 17);
  REQUIRE(r);
  CHECK((*r)[0].reals == std::vector<double>{1.5, -2});
}

TEST_CASE("host evaluation runs the CPU backend's kernels: Cast, Concat, Equal, Div, Expand") {
  ir::Node cast;
  cast.op_type = "Cast";
  cast.attributes.push_back(passes::int_attribute("to", onnx::TensorProto::INT64));
  passes::HostTensor reals{DType::kFloat32, {3}, {}, {2.75, -1.5, 7}};
  auto r = passes::evaluate_on_host(cast, {reals}, {}, 17);
  REQUIRE(r);
  CHECK((*r)[0].dtype == DType::kInt64);
  CHECK((*r)[0].ints == std::vector<int64_t>{2, -1, 7});

  ir::Node concat;
  concat.op_type = "Concat";
  concat.attributes.push_back(passes::int_attribute("axis", 0));
  passes::HostTensor a{DType::kInt64, {2}, {1, 2}, {}}, b{DType::kInt64, {1}, {-1}, {}};
  r = passes::evaluate_on_host(concat, {a, b, a}, {}, 17);
  REQUIRE(r);
  CHECK((*r)[0].shape == std::vector<int64_t>{5});
  CHECK((*r)[0].ints == std::vector<int64_t>{1, 2, -1, 1, 2});

  ir::Node equal;
  equal.op_type = "Equal";
  r = passes::evaluate_on_host(equal, {a, passes::HostTensor{DType::kInt64, {}, {2}, {}}}, {}, 17);
  REQUIRE(r);
  CHECK((*r)[0].dtype == DType::kBool);
  CHECK((*r)[0].ints == std::vector<int64_t>{0, 1});

  ir::Node div;
  div.op_type = "Div";
  passes::HostTensor num{DType::kInt64, {2}, {7, -7}, {}}, den{DType::kInt64, {}, {2}, {}};
  r = passes::evaluate_on_host(div, {num, den}, {}, 17);
  REQUIRE(r);
  CHECK((*r)[0].ints == std::vector<int64_t>{3, -3});  // truncated toward zero
  // Mixed dtypes: no kernel signature, so no fold (not an error).
  CHECK_FALSE(passes::evaluate_on_host(div, {num, reals}, {}, 17));
  // A kernel's error names the node.
  div.name = "/attn/Div";
  passes::HostTensor zero{DType::kInt64, {}, {0}, {}};
  CHECK_THROWS_WITH_AS(passes::evaluate_on_host(div, {num, zero}, {}, 17),
                       doctest::Contains("/attn/Div"), Error);

  ir::Node expand;
  expand.op_type = "Expand";
  passes::HostTensor shape{DType::kInt64, {2}, {2, 3}, {}};
  passes::HostTensor row{DType::kFloat32, {3}, {}, {0.5, 1, 2}};
  r = passes::evaluate_on_host(expand, {row, shape}, {}, 17);
  REQUIRE(r);
  CHECK((*r)[0].shape == std::vector<int64_t>{2, 3});
  CHECK((*r)[0].reals == std::vector<double>{0.5, 1, 2, 0.5, 1, 2});
}

TEST_CASE("a tensor whose shape stays unknown is named") {
  testing::TempDir dir;
  auto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_output();
  testing::add_tensor_info(g->add_input(), "target", onnx::TensorProto::INT64, {2});
  add_node(g, "Reshape", {"x", "target"}, {"y"}, "/data/Reshape");
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {-1, -1});
  testing::write_model(m, dir.file("m.onnx"));
  ImportOptions options;
  options.batch = 2;
  try {
    import_model(dir.file("m.onnx"), options);
    FAIL("a data-dependent shape imported");
  } catch (const Error& e) {
    INFO(std::string(e.what()));
    CHECK(e.kind() == ErrorKind::kShape);
    CHECK(std::string(e.what()).find("tensor 'y' written by node '/data/Reshape' (Reshape) has no static shape") !=
          std::string::npos);
    CHECK(std::string(e.what()).find("its shape depends on the values of input 'target'") != std::string::npos);
  }
}

TEST_CASE("an unknown shape computed from an input names the operand, its producer and the input") {
  testing::TempDir dir;
  auto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_output();
  testing::add_tensor_info(g->add_input(), "target", onnx::TensorProto::INT64, {2});
  testing::add_int64_initializer(g, "one", {1, 1});
  add_node(g, "Mul", {"target", "one"}, {"shape"}, "/data/Mul");
  add_node(g, "Reshape", {"x", "shape"}, {"y"}, "/data/Reshape");
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {-1, -1});
  testing::write_model(m, dir.file("m.onnx"));
  ImportOptions options;
  options.batch = 2;
  try {
    import_model(dir.file("m.onnx"), options);
    FAIL("a data-dependent shape imported");
  } catch (const Error& e) {
    INFO(std::string(e.what()));
    CHECK(e.kind() == ErrorKind::kShape);
    CHECK(std::string(e.what()).find("its shape depends on the values of 'shape' (input 1 of the "
                                     "node, computed by node '/data/Mul' (Mul) from input "
                                     "'target')") != std::string::npos);
  }
}

}  // namespace
}  // namespace stagecraft

namespace stagecraft {
namespace {

TEST_CASE("unnamed and repeated node names become unique names a plan can refer to") {
  testing::TempDir dir;
  auto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->mutable_node(0)->set_name("");
  g->mutable_node(0)->set_output(0, "h");
  testing::add_node(g, "Relu", {"h"}, {"y"}, "");
  g->mutable_node(1)->set_name("");
  testing::add_node(g, "Relu", {"y"}, {"z"}, "dup");
  testing::add_node(g, "Relu", {"z"}, {"w"}, "dup");
  g->mutable_output(0)->set_name("w");
  testing::write_model(m, dir.file("m.onnx"));
  ImportOptions options;
  options.batch = 2;
  auto model = import_model(dir.file("m.onnx"), options);
  std::vector<std::string> names;
  for (ir::NodeId id : model.graph.topological_order()) names.push_back(model.graph.node(id).name);
  CHECK(names == std::vector<std::string>{"Relu(h)", "Relu(y)", "dup", "dup#2"});
}

}  // namespace
}  // namespace stagecraft

namespace stagecraft {
namespace {

/// Adds an int64 attribute-free helper: a 1-element int64 initializer named `name`.
void int64_const(onnx::GraphProto* g, const std::string& name, int64_t v, bool scalar = false) {
  testing::add_int64_initializer(g, name, {v}, scalar);
}

/// x float[batch, 8, 4] through `blocks` ShuffleNet-style channel shuffles (groups 2), each
/// reshape target computed from the shape of the tensor before it, with a Div that ONNX's
/// data propagation does not see through: every block's shapes are known only after the
/// block before it was folded.
onnx::ModelProto channel_shuffle_chain(int blocks) {
  onnx::ModelProto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_input();
  g->clear_output();
  testing::add_tensor_info(g->add_input(), "x0", onnx::TensorProto::FLOAT, {-1, 8, 4}, {"batch"});
  int64_const(g, "i0", 0, true);
  int64_const(g, "i1", 1, true);
  int64_const(g, "i2", 2, true);
  int64_const(g, "two", 2, true);
  int64_const(g, "groups", 2);
  int64_const(g, "minus1", -1);
  int64_const(g, "axes0", 0);
  auto concat0 = [&](const std::vector<std::string>& in, const std::string& out) {
    auto* n = add_node(g, "Concat", in, {out});
    auto* a = n->add_attribute();
    a->set_name("axis");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(0);
  };
  for (int k = 0; k < blocks; ++k) {
    const std::string p = "b" + std::to_string(k) + "_", x = "x" + std::to_string(k);
    add_node(g, "Shape", {x}, {p + "s"});
    add_node(g, "Gather", {p + "s", "i0"}, {p + "n"});
    add_node(g, "Gather", {p + "s", "i1"}, {p + "c"});
    add_node(g, "Gather", {p + "s", "i2"}, {p + "l"});
    add_node(g, "Div", {p + "c", "two"}, {p + "half"});
    for (const char* v : {"n", "half", "l"}) add_node(g, "Unsqueeze", {p + v, "axes0"}, {p + v + "1"});
    concat0({p + "n1", "groups", p + "half1", p + "l1"}, p + "target4");
    add_node(g, "Reshape", {x, p + "target4"}, {p + "r"});
    auto* t = add_node(g, "Transpose", {p + "r"}, {p + "t"});
    auto* perm = t->add_attribute();
    perm->set_name("perm");
    perm->set_type(onnx::AttributeProto::INTS);
    for (int64_t d : {0, 2, 1, 3}) perm->add_ints(d);
    add_node(g, "Shape", {p + "t"}, {p + "s2"});
    add_node(g, "Gather", {p + "s2", "i0"}, {p + "n2"});
    add_node(g, "Unsqueeze", {p + "n2", "axes0"}, {p + "n21"});
    concat0({p + "n21", "minus1", p + "l1"}, p + "target3");
    add_node(g, "Reshape", {p + "t", p + "target3"}, {"x" + std::to_string(k + 1)});
  }
  add_node(g, "Relu", {"x" + std::to_string(blocks)}, {"y"});
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {-1, 8, 4}, {"batch"});
  return m;
}

TEST_CASE("shape folding runs to a fixed point: 16 chained channel shuffles import with static shapes") {
  testing::TempDir dir;
  testing::write_model(channel_shuffle_chain(16), dir.file("m.onnx"));
  ImportOptions options;
  options.batch = 3;
  ImportedModel model = import_model(dir.file("m.onnx"), options);
  const auto& g = model.graph;
  // What is left is the data path: two Reshapes and a Transpose per block, then the Relu.
  CHECK(g.live_nodes() == 16 * 3 + 1);
  for (ir::NodeId id : g.topological_order()) {
    const ir::Node& n = g.node(id);
    for (ir::ValueId out : n.outputs) CHECK(g.value(out).shape_known);
    if (n.op_type == "Reshape") CHECK(g.value(n.inputs[1]).is_initializer());
  }
  CHECK(g.value(g.outputs[0]).shape == std::vector<int64_t>{3, 8, 4});
}

}  // namespace
}  // namespace stagecraft
