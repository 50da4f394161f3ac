// Stage files stay plain ONNX (issue 32): a file with fused Attention nodes carries the
// function ai.stagecraft.Attention (compiler/plan/attention_function.h). Checked here: ONNX's
// C++ checker and strict shape inference (which runs into the function's body) on every stage
// file of fused gpt_tiny plans, and the body's values: each file is inlined by hand (the body's
// nodes in place of the call, values renamed, attributes substituted), read back by our
// importer and run on the CPU backend against the fused kernel, within 1e-5 (16-bit nodes of
// mixed and fp16 plans: within their type's rounding).
#include "compiler/plan/attention_function.h"

#include <doctest/doctest.h>
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "compiler/plan/conv_function.h"
#include "compiler/plan/gelu_function.h"
#include "compiler/plan/planner.h"
#include "compiler/plan/pool_function.h"
#include "compiler/plan/stage_files.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using rt::Tensor;

std::string sample(const std::string& name) { return std::string(STAGECRAFT_SAMPLES) + "/" + name; }

int attention_nodes(const onnx::ModelProto& m) {
  return static_cast<int>(
      std::count_if(m.graph().node().begin(), m.graph().node().end(), [](const onnx::NodeProto& n) {
        return n.op_type() == "Attention" && n.domain() == "ai.stagecraft";
      }));
}

/// ONNX's checker, then strict shape inference with type checks: a body that does not type or
/// shape-check fails here.
void check_plain_onnx(const onnx::ModelProto& model, const std::string& path = "") {
  CAPTURE(path);
  if (path.empty())
    CHECK_NOTHROW(onnx::checker::check_model(model));
  else
    CHECK_NOTHROW(onnx::checker::check_model(path));
  onnx::ModelProto copy = model;
  CHECK_NOTHROW(onnx::shape_inference::InferShapes(copy, onnx::OpSchemaRegistry::Instance(),
                                                   onnx::ShapeInferenceOptions(true, 1, false)));
}

/// `model` with every call of one of its functions replaced by the body: a formal input or
/// output becomes the actual one, every other value "<node>/<name>", every attribute that
/// refers to the caller's its value.
onnx::ModelProto inlined(const onnx::ModelProto& model) {
  onnx::ModelProto out = model;
  out.clear_functions();
  onnx::GraphProto& g = *out.mutable_graph();
  g.clear_node();
  for (const onnx::NodeProto& call : model.graph().node()) {
    auto f = std::find_if(model.functions().begin(), model.functions().end(), [&](const auto& fn) {
      return fn.name() == call.op_type() && fn.domain() == call.domain();
    });
    if (f == model.functions().end()) {
      *g.add_node() = call;
      continue;
    }
    std::map<std::string, std::string> actual;
    for (int k = 0; k < f->input_size(); ++k)
      actual[f->input(k)] = k < call.input_size() ? call.input(k) : "";
    for (int k = 0; k < f->output_size(); ++k)
      actual[f->output(k)] = k < call.output_size() ? call.output(k) : "";
    auto rename = [&](const std::string& name) {
      auto it = actual.find(name);
      return it != actual.end() ? it->second : call.name() + "/" + name;
    };
    for (const onnx::NodeProto& body : f->node()) {
      onnx::NodeProto& n = *g.add_node();
      n = body;
      n.set_name(call.name() + "/" + body.name());
      for (std::string& in : *n.mutable_input()) in = rename(in);
      for (std::string& o : *n.mutable_output()) o = rename(o);
      for (onnx::AttributeProto& a : *n.mutable_attribute()) {
        if (a.ref_attr_name().empty()) continue;
        auto from = std::find_if(call.attribute().begin(), call.attribute().end(),
                                 [&](const auto& c) { return c.name() == a.ref_attr_name(); });
        if (from == call.attribute().end()) {  // left out by the caller: the op's default
          a.clear_name();
          continue;
        }
        const std::string name = a.name();
        a = *from;
        a.set_name(name);
      }
      auto* attrs = n.mutable_attribute();
      attrs->erase(std::remove_if(attrs->begin(), attrs->end(),
                                  [](const onnx::AttributeProto& a) { return a.name().empty(); }),
                   attrs->end());
    }
  }
  return out;
}

/// Inputs for `program`: floats uniform in [-1, 1], integers (token ids) in [0, 8).
std::vector<Tensor> random_inputs(const rt::Program& program, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<Tensor> out;
  for (const rt::ValueInfo& in : program.inputs()) {
    Tensor t = Tensor::owned(in.dtype, in.shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (in.dtype == DType::kFloat32)
        t.as<float>()[i] = uniform(rng);
      else if (in.dtype == DType::kInt64)
        t.as<int64_t>()[i] = static_cast<int64_t>(rng() % 8);
    }
    out.push_back(std::move(t));
  }
  return out;
}

/// Runs `program` on `inputs` given by name: its outputs by name.
std::map<std::string, Tensor> run(const rt::Program& program,
                                  const std::map<std::string, Tensor>& inputs) {
  auto device = rt::cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(program.arena_bytes()) + 64);
  std::vector<Tensor> args;
  for (const rt::ValueInfo& in : program.inputs()) args.push_back(inputs.at(in.name));
  std::vector<Tensor> outs = program.run(*device, args, arena.data());
  std::map<std::string, Tensor> named;
  for (size_t k = 0; k < outs.size(); ++k) named.emplace(program.outputs()[k].name, outs[k]);
  return named;
}

/// Checks the functions' values in `fused` (which calls them): the fused model on the CPU
/// kernels against its inlined copy read back by our importer, on random inputs, within
/// `tolerance` of the largest output's magnitude.
void check_inlined_values(const onnx::ModelProto& fused, double tolerance = 1e-5) {
  REQUIRE(fused.functions_size() >= 1);
  const rt::Program kernel = rt::Program::from_model(fused, rt::cpu_backend(), "fused");
  testing::TempDir dir;
  testing::write_model(inlined(fused), dir.file("inlined.onnx"));
  const ImportedModel plain = import_model(dir.file("inlined.onnx"), ImportOptions{});
  const rt::Program body =
      rt::Program::from_model(ir::model_from_graph(plain.graph), rt::cpu_backend(), "inlined");
  std::map<std::string, Tensor> inputs;
  const std::vector<Tensor> values = random_inputs(kernel, 7);
  for (size_t k = 0; k < values.size(); ++k) inputs.emplace(kernel.inputs()[k].name, values[k]);
  const auto want = run(kernel, inputs);
  const auto got = run(body, inputs);
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    CAPTURE(name);
    const Tensor& t = got.at(name);
    REQUIRE(t.shape == w.shape);
    double worst = 0, largest = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(t.as<float>()[i]) - w.as<float>()[i]));
      largest = std::max(largest, std::fabs(static_cast<double>(w.as<float>()[i])));
    }
    CHECK(worst <= tolerance * std::max(1.0, largest));
    CHECK(largest > 0);
  }
}

/// One Attention node of `spec` in a model of its own: Q [lead, tq, d], K [lead, tk, d],
/// V [lead, tk, dv], an optional mask of `mask_shape`; outputs O and lse.
struct AttentionCase {
  std::vector<int64_t> lead;
  int64_t tq = 5, tk = 7, d = 4, dv = 6;
  int causal = 0;
  float scale = 0.5f;
  std::vector<int64_t> mask_shape;  ///< Empty: no mask.
  bool has_mask = false;
};

void add_attention(onnx::ModelProto& m, const AttentionCase& c, const std::string& tag) {
  onnx::GraphProto* g = m.mutable_graph();
  auto dims = [&](int64_t t, int64_t last) {
    std::vector<int64_t> s = c.lead;
    s.push_back(t);
    s.push_back(last);
    return s;
  };
  testing::add_tensor_info(g->add_input(), "q" + tag, onnx::TensorProto::FLOAT, dims(c.tq, c.d));
  testing::add_tensor_info(g->add_input(), "k" + tag, onnx::TensorProto::FLOAT, dims(c.tk, c.d));
  testing::add_tensor_info(g->add_input(), "v" + tag, onnx::TensorProto::FLOAT, dims(c.tk, c.dv));
  std::vector<std::string> inputs = {"q" + tag, "k" + tag, "v" + tag};
  if (c.has_mask) {
    testing::add_tensor_info(g->add_input(), "mask" + tag, onnx::TensorProto::FLOAT, c.mask_shape);
    inputs.push_back("mask" + tag);
  }
  testing::add_tensor_info(g->add_output(), "o" + tag, onnx::TensorProto::FLOAT, dims(c.tq, c.dv));
  std::vector<int64_t> lse = c.lead;
  lse.push_back(c.tq);
  testing::add_tensor_info(g->add_output(), "lse" + tag, onnx::TensorProto::FLOAT, lse);
  onnx::NodeProto* n = testing::add_node(g, "Attention", inputs, {"o" + tag, "lse" + tag},
                                         "/attn" + tag + "/Attention");
  n->set_domain("ai.stagecraft");
  onnx::AttributeProto* scale = n->add_attribute();
  scale->set_name("scale");
  scale->set_type(onnx::AttributeProto::FLOAT);
  scale->set_f(c.scale);
  onnx::AttributeProto* causal = n->add_attribute();
  causal->set_name("causal");
  causal->set_type(onnx::AttributeProto::INT);
  causal->set_i(c.causal);
}

onnx::ModelProto attention_model(const std::vector<AttentionCase>& cases) {
  onnx::ModelProto m = testing::relu_model();
  m.mutable_graph()->clear_node();
  m.mutable_graph()->clear_input();
  m.mutable_graph()->clear_output();
  onnx::OperatorSetIdProto* ours = m.add_opset_import();
  ours->set_domain("ai.stagecraft");
  ours->set_version(1);
  for (size_t k = 0; k < cases.size(); ++k) add_attention(m, cases[k], std::to_string(k));
  return m;
}

TEST_CASE("fuse-attention stage function: the body computes the kernel's O and lse") {
  AttentionCase causal;  // Tq 5 != Tk 7: top-left aligned
  causal.lead = {2, 3};
  causal.causal = 1;
  AttentionCase square_causal = causal;
  square_causal.tq = square_causal.tk = 6;
  square_causal.d = square_causal.dv = 8;
  square_causal.scale = 0.35f;
  AttentionCase masked{.lead = {2}, .causal = 0, .mask_shape = {5, 7}, .has_mask = true};
  AttentionCase causal_masked{
      .lead = {2, 3}, .causal = 1, .scale = 0.25f, .mask_shape = {2, 1, 5, 7}, .has_mask = true};
  SUBCASE("causal, no mask, rank 4") {
    onnx::ModelProto m = attention_model({causal, square_causal});
    CHECK(plan::add_attention_function(m) == 2);
    CHECK(m.functions(0).input_size() == 3);
    check_plain_onnx(m);
    check_inlined_values(m);
  }
  SUBCASE("an additive mask, rank 3") {
    onnx::ModelProto m = attention_model({masked});
    CHECK(plan::add_attention_function(m) == 1);
    CHECK(m.functions(0).input_size() == 4);
    check_plain_onnx(m);
    check_inlined_values(m);
  }
  SUBCASE("both arities in one file: the mask-less node reads a zero mask") {
    onnx::ModelProto m = attention_model({causal, causal_masked});
    CHECK(plan::add_attention_function(m) == 2);
    CHECK(m.functions(0).input_size() == 4);
    CHECK(m.graph().node(0).input_size() == 4);
    CHECK(m.graph().node(0).input(3) == std::string(plan::kAttentionZeroMask));
    check_plain_onnx(m);
    check_inlined_values(m);
  }
  SUBCASE("both ranks in one file: K^T by an Einsum") {
    onnx::ModelProto m = attention_model({causal, masked});
    CHECK(plan::add_attention_function(m) == 2);
    check_plain_onnx(m);
    check_inlined_values(m);
  }
  SUBCASE("a file without Attention nodes is left as it is") {
    onnx::ModelProto m = testing::relu_model();
    CHECK(plan::add_attention_function(m) == 0);
    CHECK(m.functions_size() == 0);
  }
}

TEST_CASE("fuse-attention stage function: gpt_tiny's fused stage file against its inlined copy") {
  ImportOptions options;
  options.batch = 2;
  options.dims["seq"] = 16;
  options.fuse_attention = true;
  const ImportedModel m = import_model(sample("gpt_tiny.onnx"), options);
  const std::vector<int> stage_of(m.graph.nodes().size(), 0);
  onnx::ModelProto file = plan::stage_model(m.graph, stage_of, 0);
  REQUIRE(attention_nodes(file) > 0);
  CHECK(plan::add_attention_function(file) == attention_nodes(file));
  check_plain_onnx(file);
  check_inlined_values(file);
}

/// gpt_tiny planned with fused attention: `training`, on `devices`, `mixed` (bfloat16) or not.
plan::PlanOptions fused_gpt(bool training, int devices, bool mixed = false) {
  plan::PlanOptions o = training ? testing::training_options(sample("gpt_tiny.onnx"), devices,
                                                             "1f1b", "cross-entropy")
                                 : plan::PlanOptions{};
  o.model_path = sample("gpt_tiny.onnx");
  o.devices = devices;
  o.batch = 8;
  o.microbatches = 4;
  o.dims["seq"] = 8;
  o.device_spec = "cpu";
  o.fuse_attention = true;
  if (mixed) o.precision = Precision::kMixed;
  return o;
}

int conv_nodes(const onnx::ModelProto& m) {
  return static_cast<int>(
      std::count_if(m.graph().node().begin(), m.graph().node().end(), [](const onnx::NodeProto& n) {
        return n.op_type() == "Conv" && n.domain() == "ai.stagecraft";
      }));
}

/// Writes `planned`, checks every stage file of it as plain ONNX (checker, strict inference into
/// the functions) with one function per fused op it holds, runs one step of it on the CPU, and
/// returns how many Attention and 16-bit Conv nodes its files hold.
int check_written_plan(plan::PlannedModel planned, bool training) {
  testing::TempDir dir;
  plan::write_plan(planned, dir.file("plan"));
  int fused = 0;
  for (const plan::Stage& stage : planned.plan.stages)
    for (const std::string& name : {stage.file, stage.backward_file}) {
      if (name.empty()) continue;
      const std::string path = dir.file("plan/" + name);
      onnx::ModelProto file;
      {
        std::ifstream in(path, std::ios::binary);
        REQUIRE(file.ParseFromIstream(&in));
      }
      const int attention = attention_nodes(file), convs = conv_nodes(file);
      fused += attention + convs;
      // With GELU fusion on (the planner's default), a file holding Gelu nodes also carries
      // the ai.stagecraft.Gelu function (compiler/plan/gelu_function.h).
      const bool gelu =
          std::any_of(file.graph().node().begin(), file.graph().node().end(),
                      [](const onnx::NodeProto& n) { return n.op_type() == "Gelu"; });
      // A mixed plan's loss on 16-bit scores carries ai.stagecraft.SoftmaxCrossEntropyLoss
      // (compiler/plan/loss_function.h).
      const bool loss =
          std::any_of(file.graph().node().begin(), file.graph().node().end(), [](const auto& n) {
            return n.op_type() == "SoftmaxCrossEntropyLoss" && n.domain() == "ai.stagecraft";
          });
      std::set<std::string> pool_ops;  // 16-bit pools: a function per op
      for (const onnx::NodeProto& n : file.graph().node())
        if (n.domain() == "ai.stagecraft" && n.op_type().find("Pool") != std::string::npos &&
            !n.op_type().ends_with("Grad"))
          pool_ops.insert(n.op_type());
      CHECK(file.functions_size() == (attention > 0) + (gelu ? 1 : 0) + (convs > 0) + loss +
                                         static_cast<int>(pool_ops.size()));
      check_plain_onnx(file, path);
    }
  // The runtime reads the graph alone: the plan runs as before.
  auto pipeline = rt::Pipeline::load(dir.file("plan"), rt::cpu_backend(), 1);
  rt::RunOptions run;
  run.steps = 1;
  const rt::RunReport report = pipeline->run(pipeline->synthetic_inputs(), run);
  if (training) CHECK(std::isfinite(report.losses.at(0)));
  return fused;
}

TEST_CASE("fuse-attention stage function: every stage file of fused gpt_tiny plans checks") {
  for (bool mixed : {false, true})
    for (bool training : {false, true})
      for (int devices : {1, 2}) {
        CAPTURE(mixed);
        CAPTURE(training);
        CAPTURE(devices);
        CHECK(check_written_plan(plan::make_plan(fused_gpt(training, devices, mixed)), training) >
              0);
      }
}

TEST_CASE("16-bit Conv stage function: every stage file of mixed CNN training plans checks") {
  for (const char* file : {"mnist_cnn.onnx", "resnet_small.onnx"}) {
    CAPTURE(file);
    plan::PlanOptions o =
        testing::training_options(sample(file), 2, "1f1b", "cross-entropy");
    o.model_path = sample(file);
    o.devices = 2;
    o.batch = 4;
    o.microbatches = 2;
    o.device_spec = "cpu";
    o.precision = Precision::kMixed;
    CHECK(check_written_plan(plan::make_plan(o), true) > 0);
  }
}

TEST_CASE("fuse-attention stage function: 16-bit nodes get a body that casts, and it computes "
          "their values") {
  // A mixed (bfloat16) or fp16 plan runs the fused Attention and Gelu on 16-bit Q, K, V, O and
  // X, Y (passes::fused_sixteen_bit): the bodies read those through Casts to float32 and cast
  // the outputs back, so strict inference accepts them and an inlined copy computes what the
  // kernels do, up to where a 16-bit rounding of O or Y falls (float32 sums in another order).
  for (Precision precision : {Precision::kMixed, Precision::kFp16}) {
    CAPTURE(static_cast<int>(precision));
    plan::PlanOptions o = fused_gpt(false, 1, true);
    o.precision = precision;
    const plan::PlannedModel planned = plan::make_plan(o);
    onnx::ModelProto file = plan::stage_model(planned.model.graph, planned.stage_of, 0);
    const int nodes = attention_nodes(file);
    REQUIRE(nodes > 0);
    const int sixteen_bit =
        precision == Precision::kMixed ? onnx::TensorProto::BFLOAT16 : onnx::TensorProto::FLOAT16;
    CHECK(plan::function_storage_type(file, "Attention") == sixteen_bit);
    CHECK(plan::function_storage_type(file, "Gelu") == sixteen_bit);
    CHECK(plan::add_attention_function(file) == nodes);
    CHECK(plan::add_gelu_function(file) > 0);
    REQUIRE(file.functions_size() == 2);
    for (const onnx::FunctionProto& f : file.functions()) {
      CAPTURE(f.name());
      const auto casts = std::count_if(f.node().begin(), f.node().end(),
                                       [](const onnx::NodeProto& n) { return n.op_type() == "Cast"; });
      CHECK(casts == (f.name() == "Attention" ? 4 : 2));
    }
    check_plain_onnx(file);
    check_inlined_values(file, precision == Precision::kMixed ? 2e-2 : 4e-3);
  }
}

TEST_CASE("fuse-attention stage function: nodes of two types in one file are refused, named") {
  AttentionCase c;
  c.lead = {2};
  onnx::ModelProto m = attention_model({c, c});
  // The second node reads bfloat16: its inputs retyped as a mixed plan would have them.
  for (onnx::ValueInfoProto& in : *m.mutable_graph()->mutable_input())
    if (in.name().back() == '1') in.mutable_type()->mutable_tensor_type()->set_elem_type(
                                     onnx::TensorProto::BFLOAT16);
  try {
    plan::add_attention_function(m);
    FAIL("two types in one file were accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUnsupported);
    const std::string what = e.what();
    CHECK(what.find("/attn0/Attention") != std::string::npos);
    CHECK(what.find("/attn1/Attention") != std::string::npos);
    CHECK(what.find("--precision fp32") != std::string::npos);
  }
}

TEST_CASE("16-bit Conv stage function: a mixed CNN's stage file checks, and the body computes "
          "the kernel's values") {
  for (const char* file : {"mnist_cnn.onnx", "resnet_small.onnx"}) {
    CAPTURE(file);
    plan::PlanOptions o;
    o.model_path = sample(file);
    o.devices = 1;
    o.batch = 2;
    o.device_spec = "cpu";
    o.precision = Precision::kMixed;
    const plan::PlannedModel planned = plan::make_plan(o);
    onnx::ModelProto stage = plan::stage_model(planned.model.graph, planned.stage_of, 0);
    const int nodes = conv_nodes(stage);
    REQUIRE(nodes > 0);
    CHECK(plan::add_conv_function(stage) == nodes);
    // And the 16-bit pools' functions (compiler/plan/pool_function.h), one per op.
    std::set<std::string> pool_ops;
    for (const onnx::NodeProto& n : stage.graph().node())
      if (n.domain() == "ai.stagecraft" && n.op_type().find("Pool") != std::string::npos)
        pool_ops.insert(n.op_type());
    CHECK(!pool_ops.empty());
    CHECK(plan::add_pool_functions(stage) > 0);
    REQUIRE(stage.functions_size() == 1 + static_cast<int>(pool_ops.size()));
    check_plain_onnx(stage);
    // The CPU kernel widens X, W and B and rounds Y once, as the body's Casts do: the same
    // arithmetic, up to where oneDNN sums in another order.
    check_inlined_values(stage, 1e-2);
  }
}

TEST_CASE("16-bit Conv stage function: both arities and attributes left out") {
  // x (float32) -> Cast bf16 -> Conv with a bias and explicit attributes, and Conv without a
  // bias or attributes (1x1, Conv's defaults) -> Casts back to float32.
  onnx::ModelProto m = testing::relu_model();
  onnx::GraphProto* g = m.mutable_graph();
  g->clear_node();
  g->clear_input();
  g->clear_output();
  onnx::OperatorSetIdProto* ours = m.add_opset_import();
  ours->set_domain("ai.stagecraft");
  ours->set_version(1);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> inputs = {
      {"x", {1, 2, 5, 5}}, {"w0", {3, 2, 3, 3}}, {"b0", {3}}, {"w1", {4, 2, 1, 1}}};
  for (const auto& [name, shape] : inputs) {
    testing::add_tensor_info(g->add_input(), name, onnx::TensorProto::FLOAT, shape);
    onnx::NodeProto* cast = testing::add_node(g, "Cast", {name}, {name + "16"}, "cast_" + name);
    onnx::AttributeProto* to = cast->add_attribute();
    to->set_name("to");
    to->set_type(onnx::AttributeProto::INT);
    to->set_i(onnx::TensorProto::BFLOAT16);
    testing::add_tensor_info(g->add_value_info(), name + "16", onnx::TensorProto::BFLOAT16, shape);
  }
  onnx::NodeProto* with_bias =
      testing::add_node(g, "Conv", {"x16", "w016", "b016"}, {"y016"}, "/conv0/Conv");
  with_bias->set_domain("ai.stagecraft");
  for (const char* name : {"kernel_shape", "pads"}) {
    onnx::AttributeProto* a = with_bias->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t v : std::string_view(name) == "pads" ? std::vector<int64_t>{1, 1, 1, 1}
                                                      : std::vector<int64_t>{3, 3})
      a->add_ints(v);
  }
  testing::add_node(g, "Conv", {"x16", "w116"}, {"y116"}, "/conv1/Conv")
      ->set_domain("ai.stagecraft");
  for (const auto& [y, channels] : {std::pair{"y0", 3}, {"y1", 4}}) {
    const std::string y16 = std::string(y) + "16";
    testing::add_tensor_info(g->add_value_info(), y16, onnx::TensorProto::BFLOAT16,
                             {1, channels, 5, 5});
    onnx::AttributeProto* to =
        testing::add_node(g, "Cast", {y16}, {y}, std::string("cast_") + y)->add_attribute();
    to->set_name("to");
    to->set_type(onnx::AttributeProto::INT);
    to->set_i(onnx::TensorProto::FLOAT);
    testing::add_tensor_info(g->add_output(), y, onnx::TensorProto::FLOAT, {1, channels, 5, 5});
  }
  CHECK(plan::add_conv_function(m) == 2);
  REQUIRE(m.functions_size() == 1);
  CHECK(m.functions(0).input_size() == 3);
  // The bias-less node reads a zero bias of its 4 output channels, in bfloat16.
  const onnx::NodeProto& plain = m.graph().node(m.graph().node_size() - 3);
  REQUIRE(plain.name() == "/conv1/Conv");
  REQUIRE(plain.input_size() == 3);
  CHECK(plain.input(2) == std::string(plan::kConvZeroBias) + "4");
  check_plain_onnx(m);
  check_inlined_values(m, 1e-2);
}

}  // namespace
}  // namespace stagecraft
