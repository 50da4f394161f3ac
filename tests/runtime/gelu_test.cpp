// Fused GELU (issue 31): fuse-gelu (passes/fuse_gelu.cpp) on the bundled gpt_tiny (its MLPs'
// erf GELU) and on PyTorch 1.13's exports (data/torch_gelu_mlp, made by its make.py: nn.GELU(),
// nn.GELU(approximate='tanh'), HF GPT-2's gelu_new), the near-misses that stay unfused; the
// Gelu kernels against a double-precision reference; fused plans against PyTorch's output, their
// stage files plain ONNX; gpt_tiny trained fused against --no-fuse-gelu.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <onnx/checker.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "compiler/import.h"
#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/tensor_io.h"
#include "runtime/exec/pipeline.h"
#include "tests/runtime/gelu_util.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

const std::string kData = STAGECRAFT_TEST_DATA "/torch_gelu_mlp/";
const std::string kGptTiny = std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx";

size_t count_ops(const ir::Graph& g, std::string_view op) {
  return static_cast<size_t>(
      std::count_if(g.nodes().begin(), g.nodes().end(),
                    [&](const ir::Node& n) { return !n.dead && n.op_type == op; }));
}

size_t live_nodes(const ir::Graph& g) {
  return static_cast<size_t>(
      std::count_if(g.nodes().begin(), g.nodes().end(), [](const ir::Node& n) { return !n.dead; }));
}

/// gpt_tiny at batch 2, seq 16; the PyTorch exports have static shapes.
ImportedModel import_with(const std::string& path, bool fuse) {
  ImportOptions options;
  if (path == kGptTiny) {
    options.batch = 2;
    options.dims["seq"] = 16;
  }
  options.fuse_attention = true;
  options.fuse_gelu = fuse;
  return import_model(path, options);
}

TEST_CASE("fuse-gelu: the bundled gpt_tiny's erf GELUs become Gelu nodes") {
  const ImportedModel plain = import_with(kGptTiny, false);
  const ImportedModel fused = import_with(kGptTiny, true);
  const size_t erfs = count_ops(plain.graph, "Erf");
  REQUIRE(erfs > 0);
  CHECK(count_ops(fused.graph, "Gelu") == erfs);
  CHECK(count_ops(fused.graph, "Erf") == 0);
  CHECK(fused.folded.at("fuse-gelu") == static_cast<int64_t>(erfs));
  // Each GELU's Div, Erf, Add, Mul, Mul became one node.
  CHECK(live_nodes(fused.graph) + 4 * erfs == live_nodes(plain.graph));
  for (const ir::Node& n : fused.graph.nodes()) {
    if (n.dead || n.op_type != "Gelu") continue;
    CAPTURE(n.name);
    CHECK(n.domain == grad::kGradDomain);
    CHECK(n.attr_string("approximate", "") == "none");
    CHECK(fused.graph.value(n.inputs[0]).shape == fused.graph.value(n.outputs[0]).shape);
  }
}

TEST_CASE("fuse-gelu: PyTorch's erf, tanh and gelu_new exports each become one Gelu") {
  const std::pair<const char*, const char*> cases[] = {
      {"erf", "none"}, {"tanh", "tanh"}, {"gelu_new", "tanh"}};
  for (const auto& [name, approximate] : cases) {
    CAPTURE(name);
    const ImportedModel m = import_with(kData + fmt::format("mlp_{}.onnx", name), true);
    CHECK(count_ops(m.graph, "Gelu") == 1);
    CHECK(live_nodes(m.graph) == 5);  // MatMul, Add, Gelu, MatMul, Add
    for (const ir::Node& n : m.graph.nodes())
      if (!n.dead && n.op_type == "Gelu") CHECK(n.attr_string("approximate", "") == approximate);
    CHECK(m.folded.at("fuse-gelu") == 1);
  }
}

TEST_CASE(
    "fuse-gelu: a GELU whose intermediate is read elsewhere, or with another constant, stays") {
  for (const std::string which : {"erf out", "tanh out", "other constant"}) {
    CAPTURE(which);
    onnx::ModelProto m;
    REQUIRE(m.ParseFromString(
        testing::read_bytes(kData + (which == "tanh out" ? "mlp_tanh.onnx" : "mlp_erf.onnx"))));
    onnx::GraphProto* g = m.mutable_graph();
    if (which == "other constant") {
      for (onnx::NodeProto& n : *g->mutable_node())
        if (n.op_type() == "Constant" && n.output(0) == "/1/Constant_output_0")
          n.mutable_attribute(0)->mutable_t()->set_raw_data(std::string("\x00\x00\xc0\x3f", 4));
    } else {
      const char* value = which == "erf out" ? "/1/Erf_output_0" : "/1/Tanh_output_0";
      testing::add_tensor_info(g->add_output(), value, onnx::TensorProto::FLOAT, {4, 8, 64});
    }
    testing::TempDir dir;
    testing::write_model(m, dir.file("m.onnx"));
    const ImportedModel got = import_with(dir.file("m.onnx"), true);
    CHECK(count_ops(got.graph, "Gelu") == 0);
    CHECK(got.folded.count("fuse-gelu") == 0);
  }
}

// Plans name nodes, so a fused node takes a name no node has: functional GELUs in a loop (an
// MLP-Mixer's) all fused to "/Gelu", and stagec wrote a plan that did not read back ("names node
// '/Gelu', which is already in stage 0").
TEST_CASE("fuse-gelu: the fused node's name is not one the graph already has") {
  onnx::ModelProto m;
  REQUIRE(m.ParseFromString(testing::read_bytes(kData + "mlp_erf.onnx")));
  std::string gelu_scope;
  for (const onnx::NodeProto& n : m.graph().node())
    if (n.op_type() == "Erf") gelu_scope = n.name().substr(0, n.name().rfind('/') + 1);
  REQUIRE(!gelu_scope.empty());
  // The last node (not part of the GELU) takes the name the fused node would.
  onnx::NodeProto* last = m.mutable_graph()->mutable_node(m.graph().node_size() - 1);
  REQUIRE(last->op_type() != "Mul");
  last->set_name(gelu_scope + "Gelu");
  testing::TempDir dir;
  testing::write_model(m, dir.file("m.onnx"));
  const ImportedModel got = import_with(dir.file("m.onnx"), true);
  REQUIRE(count_ops(got.graph, "Gelu") == 1);
  std::vector<std::string> names;
  for (const ir::Node& n : got.graph.nodes())
    if (!n.dead) names.push_back(n.name);
  std::sort(names.begin(), names.end());
  CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
  CHECK(std::count(names.begin(), names.end(), gelu_scope + "Gelu") == 1);
  CHECK(std::count(names.begin(), names.end(), gelu_scope + "Gelu#2") == 1);
  plan::PlanOptions o;
  o.model_path = dir.file("m.onnx");
  o.devices = 1;
  o.microbatches = 1;
  o.device_spec = "cpu";
  plan::PlannedModel planned = plan::make_plan(o);
  CHECK_NOTHROW(plan::write_plan(planned, dir.file("plan")));
}

TEST_CASE("Gelu and GeluGrad kernels on the cpu against a double-precision reference") {
  testing::gelu::check_kernels(rt::cpu_backend());
  // Only "none" and "tanh" are GELUs.
  const onnx::NodeProto bad = testing::gelu::node("sigmoid");
  const rt::Attrs attrs(bad);
  const DType f32[] = {DType::kFloat32};
  const rt::OpSignature s{"Gelu", f32, f32, attrs};
  CHECK(rt::cpu_backend().check(s).find("approximate='sigmoid'") != std::string::npos);
}

// The fused plan of each export, on 1 and 2 devices, gives PyTorch's output on x.npy; every
// stage file carries the Gelu function and passes ONNX's checker.
TEST_CASE("fused Gelu plans of PyTorch's exports give PyTorch's output, stage files plain ONNX") {
  const rt::Tensor x = rt::read_npy(kData + "x.npy");
  for (const char* name : {"erf", "tanh", "gelu_new"}) {
    const rt::Tensor want = rt::read_npy(kData + fmt::format("y_{}.npy", name));
    for (int devices : {1, 2}) {
      CAPTURE(name);
      CAPTURE(devices);
      plan::PlanOptions o;
      o.model_path = kData + fmt::format("mlp_{}.onnx", name);
      o.devices = devices;
      o.microbatches = 1;  // the export's batch is static: one microbatch of x.npy's 4
      o.device_spec = "cpu";
      if (devices == 2) o.split_after = {"/0/Add"};  // the Gelu on the second device
      testing::TempDir dir;
      plan::PlannedModel planned = plan::make_plan(o);
      CHECK(std::count_if(planned.plan.ops.begin(), planned.plan.ops.end(),
                          [](const plan::OpRecord& op) { return op.op_type == "Gelu"; }) == 1);
      plan::write_plan(planned, dir.file("plan"));
      int functions = 0;
      for (const auto& stage : planned.plan.stages) {
        const std::string path = dir.file("plan") + "/" + stage.file;
        onnx::ModelProto model;
        REQUIRE(model.ParseFromString(testing::read_bytes(path)));
        functions += model.functions_size();
        CHECK_NOTHROW(onnx::checker::check_model(path));
      }
      CHECK(functions == 1);
      auto pipeline = rt::Pipeline::load(dir.file("plan"), rt::cpu_backend(), 1);
      rt::RunOptions run;
      run.steps = 1;
      const rt::RunReport report = pipeline->run({{"x", x}}, run);
      const rt::Tensor& y = report.outputs.at("y");
      REQUIRE(y.numel() == want.numel());
      double worst = 0;
      for (int64_t i = 0; i < y.numel(); ++i)
        worst = std::max(worst, std::fabs(double{y.as<float>()[i]} - want.as<float>()[i]));
      MESSAGE(fmt::format("mlp_{} on {} device(s): largest |y - PyTorch's| {:.3g}", name, devices,
                          worst));
      CHECK(worst <= 1e-5);
    }
  }
}

struct Run {
  std::vector<double> losses;
  int64_t peak = 0;
  int gelu_nodes = 0;
};

Run train(int devices, bool fused, int64_t seq) {
  plan::PlanOptions o = testing::training_options(kGptTiny, devices, "gpipe", "cross-entropy");
  // As attention_pipeline_test.cpp: Adam's epsilon at 1e-3 keeps equal runs within 1e-5.
  o.training_config.epsilon = 1e-3;
  o.dims["seq"] = seq;
  o.fuse_gelu = fused;
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(o);
  Run out;
  for (const plan::OpRecord& op : planned.plan.ops) out.gelu_nodes += op.op_type == "Gelu";
  plan::write_plan(planned, dir.file("plan"));
  auto pipeline = rt::Pipeline::load(dir.file("plan"), rt::cpu_backend(), 1);
  rt::RunOptions options;
  options.steps = 4;
  const rt::RunReport report = pipeline->run(pipeline->synthetic_inputs(), options);
  out.losses = report.losses;
  for (const rt::DeviceReport& d : report.devices) {
    out.peak = std::max(out.peak, d.peak_bytes);
    CHECK(d.peak_bytes <= d.predicted_peak_bytes + 4096);
  }
  return out;
}

TEST_CASE(
    "fused Gelu trains gpt_tiny to --no-fuse-gelu's losses with a lower peak, 1 and 2 devices") {
  for (int devices : {1, 2}) {
    CAPTURE(devices);
    const Run plain = train(devices, false, 64);
    const Run fused = train(devices, true, 64);
    CHECK(plain.gelu_nodes == 0);
    CHECK(fused.gelu_nodes == 2);  // one per MLP
    REQUIRE(plain.losses.size() == 4);
    REQUIRE(fused.losses.size() == 4);
    for (size_t k = 0; k < plain.losses.size(); ++k) {
      CAPTURE(k);
      CHECK(std::fabs(fused.losses[k] - plain.losses[k]) <=
            1e-5 * std::max(1.0, std::fabs(plain.losses[k])));
    }
    MESSAGE(
        fmt::format("gpt_tiny seq 64, {} device(s): measured peak {} B with the exporter's "
                    "GELU ops, {} B fused",
                    devices, plain.peak, fused.peak));
    CHECK(fused.peak < plain.peak);
  }
}

}  // namespace
}  // namespace stagecraft
