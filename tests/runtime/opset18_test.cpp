// Models of opsets 18 to 22 (torch.onnx's dynamo exporter writes 18), read as opset 17
// (compiler/import_opset.cpp): each test model is built in its opset-17 form, rewritten here into
// the newer form exporters write (the Reduce ops' axes as an input, Split's num_outputs, Gelu and
// Mish as ops, a newer ir_version), and must import, plan, run and train to exactly what its
// opset-17 twin gives; what opset 17 cannot say is refused naming the node.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "compiler/import.h"
#include "compiler/model_info.h"
#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "samples/builder/model_builder.h"
#include "tests/import_refusal.h"
#include "tests/runtime/op_coverage_util.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::testing {
namespace {

using samples::attr_float;
using samples::attr_int;
using samples::attr_ints;
using samples::ModelBuilder;

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

onnx::AttributeProto* find(onnx::NodeProto& n, const std::string& name) {
  for (auto& a : *n.mutable_attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

void erase(onnx::NodeProto& n, const std::string& name) {
  auto* attrs = n.mutable_attribute();
  for (int i = attrs->size() - 1; i >= 0; --i)
    if (attrs->Get(i).name() == name) attrs->DeleteSubrange(i, 1);
}

// `m` (opset 17) as opset `opset` writes it: every Reduce op but ReduceSum takes its axes as an
// int64 initializer input (`as_constant_node`: a Constant node's output instead), Split says
// num_outputs, Cast says saturate, the ir_version is 10.
onnx::ModelProto upgrade(onnx::ModelProto m, int64_t opset, bool as_constant_node = false) {
  m.set_ir_version(10);
  for (auto& imp : *m.mutable_opset_import())
    if (imp.domain().empty()) imp.set_version(opset);
  auto* g = m.mutable_graph();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  int k = 0;
  for (onnx::NodeProto n : g->node()) {
    const std::string& op = n.op_type();
    if (op.starts_with("Reduce") && op != "ReduceSum") {
      if (onnx::AttributeProto* axes = find(n, "axes")) {
        const std::string name = "axes_" + std::to_string(k++);
        const std::vector<int64_t> values(axes->ints().begin(), axes->ints().end());
        if (as_constant_node) {
          onnx::NodeProto* c = nodes.Add();
          c->set_op_type("Constant");
          c->set_name("/" + name + "/Constant");
          c->add_output(name);
          onnx::AttributeProto* v = c->add_attribute();
          v->set_name("value");
          v->set_type(onnx::AttributeProto::TENSOR);
          onnx::TensorProto* t = v->mutable_t();
          t->set_data_type(onnx::TensorProto::INT64);
          t->add_dims(static_cast<int64_t>(values.size()));
          for (int64_t a : values) t->add_int64_data(a);
        } else {
          add_int64_initializer(g, name, values);
        }
        erase(n, "axes");
        n.add_input(name);
      }
    }
    if (op == "Split") {
      onnx::AttributeProto* a = n.add_attribute();
      a->set_name("num_outputs");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(n.output_size());
    }
    if (op == "Cast") {
      onnx::AttributeProto* a = n.add_attribute();
      a->set_name("saturate");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(1);
    }
    *nodes.Add() = n;
  }
  g->mutable_node()->Swap(&nodes);
  return m;
}

// x [batch, 6, 8] -> LayerNorm-like statistics through ReduceMean (axes -1), a ReduceMax over
// axis 1, ReduceL2 and ReduceLogSumExp, a Split into two halves (equal parts), a Linear, Cast
// round trips: the reductions torch writes for norms and pooling.
ModelBuilder reductions_model() {
  ModelBuilder b("reductions");
  b.add_input("x", kFloat, {"batch", 6, 8});
  const std::string mean =
      b.add_op("ReduceMean", "/mean", {"x"}, {attr_ints("axes", {-1}), attr_int("keepdims", 1)});
  const std::string centred = b.add_op("Sub", "/sub", {"x", mean});
  const std::string peak =
      b.add_op("ReduceMax", "/max", {centred}, {attr_ints("axes", {1}), attr_int("keepdims", 1)});
  const std::string l2 =
      b.add_op("ReduceL2", "/l2", {centred}, {attr_ints("axes", {2}), attr_int("keepdims", 1)});
  const std::string lse = b.add_op("ReduceLogSumExp", "/lse", {centred},
                                   {attr_ints("axes", {1}), attr_int("keepdims", 1)});
  std::string h = b.add_op("Add", "/add", {b.add_op("Mul", "/mul", {centred, l2}), peak});
  h = b.add_op("Add", "/add2", {h, lse});
  const auto halves = b.add_node("Split", "/split", {h}, {"lo", "hi"}, {attr_int("axis", 2)});
  h = b.add_op("Mul", "/halves", {halves[0], halves[1]});
  h = b.add_op("Cast", "/cast", {h}, {attr_int("to", onnx::TensorProto::FLOAT)});
  const std::string w = b.add_parameter("fc.weight", {4, 3}, 4);
  b.add_node("MatMul", "/fc", {h, w}, {"y"});
  b.add_output("y", kFloat, {"batch", 6, 3});
  return b;
}

// x [batch, 16] -> Linear -> GELU (erf, or tanh when `tanh`) -> Linear -> Mish -> y: in
// opset-17 ops when `opset` is 17 (the formulas torch 1.13 writes), else as one Gelu (20) and
// one Mish (18) node each.
void write_activations(const std::string& path, int64_t opset, bool tanh) {
  ModelBuilder b("activations");
  b.add_input("x", kFloat, {"batch", 16});
  std::string h = b.add_op("MatMul", "/fc1", {"x", b.add_parameter("fc1.weight", {16, 32}, 16)});
  auto scalar = [&](const std::string& name, float v) {
    return b.add_constant(name, samples::make_float_tensor({}, {v}));
  };
  if (opset == 17) {
    std::string a;
    if (!tanh) {
      a = b.add_op("Erf", "/gelu/Erf",
                   {b.add_op("Div", "/gelu/Div", {h, scalar("/c/s2", std::sqrt(2.0f))})});
    } else {
      const std::string cube = b.add_op("Pow", "/gelu/Pow", {h, scalar("/c/3", 3.0f)});
      const std::string inner =
          b.add_op("Add", "/gelu/Add0",
                   {h, b.add_op("Mul", "/gelu/Mul0", {scalar("/c/k", 0.044715f), cube})});
      const float k = static_cast<float>(std::sqrt(2.0 / 3.14159265358979323846));
      a = b.add_op("Tanh", "/gelu/Tanh",
                   {b.add_op("Mul", "/gelu/Mul1", {scalar("/c/r", k), inner})});
    }
    a = b.add_op("Add", "/gelu/Add", {a, scalar("/c/1", 1.0f)});
    h = b.add_op("Mul", "/gelu/Mul3",
                 {b.add_op("Mul", "/gelu/Mul2", {h, a}), scalar("/c/h", 0.5f)});
  } else {
    h = b.add_op("Gelu", "/gelu/Gelu", {h},
                 {samples::attr_string("approximate", tanh ? "tanh" : "none")});
  }
  h = b.add_op("MatMul", "/fc2", {h, b.add_parameter("fc2.weight", {32, 4}, 32)});
  if (opset == 17)
    b.add_node("Mul", "/mish/Mul",
               {h, b.add_op("Tanh", "/mish/Tanh", {b.add_op("Softplus", "/mish/Softplus", {h})})},
               {"y"});
  else
    b.add_node("Mish", "/mish/Mish", {h}, {"y"});
  b.add_output("y", kFloat, {"batch", 4});
  onnx::ModelProto m = b.to_model();
  if (opset != 17) m = upgrade(m, opset);
  write_model(m, path);
}

// The outputs of `model` planned on `devices` for inference (batch 8, 4 microbatches) and run
// once on its synthetic inputs.
std::map<std::string, rt::Tensor> run_plan(const std::string& model, int devices) {
  TempDir dir;
  plan::PlannedModel planned = plan::make_plan(inference_options(model, devices));
  plan::write_plan(planned, dir.file("plan"));
  auto p = rt::Pipeline::load(dir.file("plan"), rt::cpu_backend(), 1);
  return p->run(p->synthetic_inputs(), rt::RunOptions{}).outputs;
}

bool same_outputs(const std::map<std::string, rt::Tensor>& a,
                  const std::map<std::string, rt::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const rt::Tensor& u = b.at(name);
    if (t.shape != u.shape) return false;
    for (int64_t i = 0; i < t.numel(); ++i)
      if (t.as<float>()[i] != u.as<float>()[i]) return false;
  }
  return true;
}

std::vector<double> train(const std::string& model, int devices) {
  TempDir dir;
  return train_losses(training_options(model, devices, "1f1b", "mse"), 6, dir.file("plan"));
}

int count(const ImportedModel& m, const std::string& op) {
  int n = 0;
  for (const ir::Node& node : m.graph.nodes()) n += !node.dead && node.op_type == op ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("opset 18-22: the Reduce ops' axes inputs, Split's num_outputs, Cast's saturate") {
  TempDir dir;
  const onnx::ModelProto m17 = reductions_model().to_model();
  write_model(m17, dir.file("m17.onnx"));
  const auto want = run_plan(dir.file("m17.onnx"), 2);
  for (int64_t opset : {18, 19, 20, 21, 22})
    for (bool constant_node : {false, true}) {
      CAPTURE(opset);
      CAPTURE(constant_node);
      const std::string path = dir.file("m" + std::to_string(opset) + ".onnx");
      write_model(upgrade(m17, opset, constant_node), path);
      ImportOptions o;
      o.batch = 2;
      const ImportedModel imported = import_model(path, o);
      CHECK(imported.folded.at("opset " + std::to_string(opset) + " read as 17: nodes rewritten") ==
            6);  // four Reduce ops, Split, Cast
      // stagec --info names the file's opset and IR version, and what it read them as.
      CHECK(render_text(describe_model(imported))
                .find(fmt::format("(opset {}, read as 17, ir 10,", opset)) != std::string::npos);
      CHECK(same_outputs(run_plan(path, 2), want));
    }
  // Trained on 2 devices: the opset-17 twin's losses, to the bit.
  write_model(upgrade(m17, 18), dir.file("m18.onnx"));
  CHECK(train(dir.file("m18.onnx"), 2) == train(dir.file("m17.onnx"), 2));
}

TEST_CASE("opset 18-22: Gelu and Mish become the formulas torch 1.13 writes, then fused Gelu") {
  TempDir dir;
  for (bool tanh : {false, true}) {
    CAPTURE(tanh);
    write_activations(dir.file("a17.onnx"), 17, tanh);
    write_activations(dir.file("a20.onnx"), 20, tanh);
    ImportOptions o;
    o.batch = 2;
    o.fuse_gelu = true;
    const ImportedModel old_form = import_model(dir.file("a17.onnx"), o);
    const ImportedModel new_form = import_model(dir.file("a20.onnx"), o);
    CHECK(count(old_form, "Gelu") == 1);
    CHECK(count(new_form, "Gelu") == 1);  // the lowered formula, fused again
    CHECK(count(new_form, "Softplus") == 1);
    CHECK(same_outputs(run_plan(dir.file("a20.onnx"), 2), run_plan(dir.file("a17.onnx"), 2)));
    CHECK(train(dir.file("a20.onnx"), 2) == train(dir.file("a17.onnx"), 2));
  }
}

// x [batch, 8] -> Mul by a float64 constant brought to x's type by CastLike (`like`) or by
// Cast -> Linear -> y: how torch 2.x's exporter writes a Python scalar times a tensor.
void write_scaled(const std::string& path, bool like, int64_t opset) {
  ModelBuilder b("scaled");
  b.add_input("x", kFloat, {"batch", 8});
  onnx::TensorProto half;
  half.set_data_type(onnx::TensorProto::DOUBLE);
  half.add_double_data(0.5);
  const std::string c = b.add_constant("/c", half);
  const std::string cast =
      like ? b.add_op("CastLike", "/cast", {c, "x"})
           : b.add_op("Cast", "/cast", {c}, {attr_int("to", onnx::TensorProto::FLOAT)});
  const std::string h = b.add_op("Mul", "/mul", {"x", cast});
  b.add_node("MatMul", "/fc", {h, b.add_parameter("fc.weight", {8, 4}, 8)}, {"y"});
  b.add_output("y", kFloat, {"batch", 4});
  onnx::ModelProto m = b.to_model();
  if (opset != 17) m = upgrade(m, opset);
  write_model(m, path);
}

TEST_CASE("CastLike runs as the Cast to its target's type, at opset 17 and 19") {
  TempDir dir;
  write_scaled(dir.file("cast.onnx"), false, 17);
  const auto want = run_plan(dir.file("cast.onnx"), 1);
  for (int64_t opset : {17, 19}) {
    CAPTURE(opset);
    write_scaled(dir.file("like.onnx"), true, opset);
    ImportOptions o;
    o.batch = 2;
    const ImportedModel m = import_model(dir.file("like.onnx"), o);
    CHECK(count(m, "CastLike") == 0);
    CHECK(same_outputs(run_plan(dir.file("like.onnx"), 1), want));
  }
  CHECK(train(dir.file("like.onnx"), 2) == train(dir.file("cast.onnx"), 2));
}

// x [batch, 4, 3, 3] -> GroupNormalization (2 groups; scale and bias per group at opset 18,
// per channel at 21) -> Relu -> y.
void write_group_norm(const std::string& path, int64_t opset) {
  ModelBuilder b("group_norm");
  b.add_input("x", kFloat, {"batch", 4, 3, 3});
  const int64_t n = opset < 21 ? 2 : 4;
  const std::string scale = b.add_parameter("gn.weight", {n}, 1);
  const std::string bias = b.add_parameter("gn.bias", {n}, 1);
  const std::string h = b.add_op("GroupNormalization", "/gn", {"x", scale, bias},
                                 {attr_int("num_groups", 2), attr_float("epsilon", 1e-3f)});
  b.add_node("Relu", "/relu", {h}, {"y"});
  b.add_output("y", kFloat, {"batch", 4, 3, 3});
  onnx::ModelProto m = b.to_model();
  for (auto& imp : *m.mutable_opset_import()) imp.set_version(opset);
  write_model(m, path);
}

TEST_CASE("opset 18 and 21: GroupNormalization runs as torch's opset-17 form, and trains") {
  TempDir dir;
  for (int64_t opset : {18, 21}) {
    CAPTURE(opset);
    const std::string path = dir.file("gn" + std::to_string(opset) + ".onnx");
    write_group_norm(path, opset);
    // The first row of the synthetic batch against GroupNorm computed here in double.
    ImportOptions o;
    o.batch = 8;
    const ImportedModel m = import_model(path, o);
    CHECK(count(m, "InstanceNormalization") == 1);
    const auto y = run_plan(path, 1).at("y");
    TempDir plan_dir;
    plan::PlannedModel planned = plan::make_plan(inference_options(path, 1));
    plan::write_plan(planned, plan_dir.file("plan"));
    auto p = rt::Pipeline::load(plan_dir.file("plan"), rt::cpu_backend(), 1);
    const auto inputs = p->synthetic_inputs();
    const rt::Tensor& x = inputs.at("x");
    const auto& w = p->stage_weights(0);
    const float* scale = w.at("gn.weight").as<float>();
    const float* bias = w.at("gn.bias").as<float>();
    for (int g = 0; g < 2; ++g) {
      const float* v = x.as<float>() + g * 18;
      double mean = 0, var = 0;
      for (int i = 0; i < 18; ++i) mean += v[i] / 18.0;
      for (int i = 0; i < 18; ++i) var += (v[i] - mean) * (v[i] - mean) / 18.0;
      for (int i = 0; i < 18; ++i) {
        const int c = g * 2 + i / 9;
        const int k = opset < 21 ? g : c;
        const double want =
            std::max(0.0, (v[i] - mean) / std::sqrt(var + 1e-3) * scale[k] + bias[k]);
        CHECK(std::fabs(y.as<float>()[g * 18 + i] - want) < 1e-5);
      }
    }
    check_training(path);
  }
}

TEST_CASE("opset 18-22: what opset 17 cannot say is refused naming the node") {
  TempDir dir;
  // A Reduce op whose axes are computed.
  onnx::ModelProto m = upgrade(reductions_model().to_model(), 18);
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.op_type() == "ReduceMax") *n.mutable_input(1) = "x_shape";
  add_node(m.mutable_graph(), "Shape", {"x"}, {"x_shape"}, "/shape");
  write_model(m, dir.file("computed.onnx"));
  expect_refused(dir.file("computed.onnx"), ErrorKind::kUnsupported,
                 "node '/max' (ReduceMax, opset 18): its axes input 'x_shape' is not a constant");

  // An op opset 17 does not have: named with the file's opset.
  onnx::ModelProto g = relu_model(18);
  g.mutable_graph()->mutable_node(0)->set_op_type("Col2Im");
  write_model(g, dir.file("col2im.onnx"));
  expect_refused(dir.file("col2im.onnx"), ErrorKind::kUnsupported,
                 "op Col2Im (node '/relu/Relu', domain ai.onnx, opset 18) is not supported");

  // Resize with antialias.
  onnx::ModelProto r = relu_model(18);
  auto* node = r.mutable_graph()->mutable_node(0);
  node->set_op_type("Resize");
  onnx::AttributeProto* a = node->add_attribute();
  a->set_name("antialias");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(1);
  write_model(r, dir.file("antialias.onnx"));
  expect_refused(dir.file("antialias.onnx"), ErrorKind::kUnsupported,
                 "node '/relu/Relu' (Resize, opset 18): antialias is not supported");

  // Newer than 22: refused with the numbers.
  write_model(relu_model(23), dir.file("opset23.onnx"));
  expect_refused(dir.file("opset23.onnx"), ErrorKind::kUnsupported,
                 "opset 23 is newer than 22, the newest stagecraft reads");
  // 22 and an ir_version of 10 import.
  onnx::ModelProto ok = relu_model(22);
  ok.set_ir_version(10);
  write_model(ok, dir.file("opset22.onnx"));
  ImportOptions o;
  o.batch = 2;
  CHECK(count(import_model(dir.file("opset22.onnx"), o), "Relu") == 1);
}

}  // namespace stagecraft::testing
