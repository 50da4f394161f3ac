// The per-node profile (issue 31 item 1, stagerun --profile-nodes): the work each node's
// tensors say it did (runtime/core/node_work.h), a profiled step that times every node of
// every stage once per run and is left out of the median, and stagerun's table and JSON record.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <onnx/onnx_pb.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/node_work.h"
#include "runtime/exec/pipeline.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

Tensor shaped(Shape shape) { return Tensor::uninitialized(DType::kFloat32, std::move(shape)); }

// node_work of `op` over `in` and `out` (owned by the caller), with integer attributes.
NodeWork work_of(const std::string& op, std::vector<Tensor*> in, std::vector<Tensor*> out,
                 const std::map<std::string, int64_t>& ints = {}) {
  onnx::NodeProto node;
  node.set_op_type(op);
  for (const auto& [name, value] : ints) {
    onnx::AttributeProto* a = node.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(value);
  }
  std::vector<const Tensor*> inputs(in.begin(), in.end());
  return node_work(op, Attrs(node), inputs, out);
}

// mnist_cnn training on `devices` devices, batch 8 in 4 microbatches, for the cpu spec.
plan::PlanOptions mnist_options(int devices, bool training) {
  plan::PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/mnist_cnn.onnx";
  o.devices = devices;
  o.batch = 8;
  o.microbatches = 4;
  o.device_spec = "cpu";
  o.training = training;
  if (training) o.loss.kind = "mse";
  return o;
}

std::string write(const plan::PlanOptions& o, const std::string& dir) {
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir);
  return dir;
}

// The nodes of `file` (a stage file) whose op type is in `ops`.
std::vector<std::string> nodes_of(const std::string& file, const std::set<std::string>& ops) {
  onnx::ModelProto model;
  std::ifstream in(file, std::ios::binary);
  REQUIRE(model.ParseFromIstream(&in));
  std::vector<std::string> names;
  for (const onnx::NodeProto& n : model.graph().node())
    if (ops.count(n.op_type())) names.push_back(n.name());
  return names;
}

using Result = testing::CommandResult;

Result stagerun(const testing::TempDir& dir, const std::string& args) {
  return testing::run_captured(dir, fmt::format("{} {}", STAGECRAFT_STAGERUN, args));
}

}  // namespace

TEST_CASE("node_work: the products' FLOPs from the shapes, and the bytes of every tensor") {
  SUBCASE("MatMul: 2 x M x N x K, every operand's bytes") {
    Tensor a = shaped({2, 3, 4}), b = shaped({4, 5}), y = shaped({2, 3, 5});
    const NodeWork w = work_of("MatMul", {&a, &b}, {&y});
    CHECK(w.flops == 2.0 * 2 * 3 * 5 * 4);
    CHECK(w.bytes_read == (24 + 20) * 4);
    CHECK(w.bytes_written == 30 * 4);
  }
  SUBCASE("Gemm: K from A's layout, plus the bias add") {
    Tensor a = shaped({7, 6}), b = shaped({7, 3}), c = shaped({3}), y = shaped({6, 3});
    CHECK(work_of("Gemm", {&a, &b, &c}, {&y}, {{"transA", 1}}).flops == 2.0 * 18 * 7 + 18);
    Tensor a2 = shaped({6, 7});
    CHECK(work_of("Gemm", {&a2, &b}, {&y}).flops == 2.0 * 18 * 7);
  }
  SUBCASE("Conv and ConvTranspose: the weight's window per output or input element") {
    Tensor x = shaped({1, 2, 5, 5}), w = shaped({3, 2, 3, 3}), y = shaped({1, 3, 3, 3});
    CHECK(work_of("Conv", {&x, &w}, {&y}).flops == 2.0 * 18 * 27);
    Tensor xt = shaped({1, 3, 3, 3}), wt = shaped({3, 2, 3, 3}), yt = shaped({1, 2, 5, 5});
    CHECK(work_of("ConvTranspose", {&xt, &wt}, {&yt}).flops == 2.0 * 18 * 27);
  }
  SUBCASE("Attention: QK^T and PV, half of it causal") {
    Tensor q = shaped({2, 4, 8, 16}), k = shaped({2, 4, 10, 16}), v = shaped({2, 4, 10, 32}),
           o = shaped({2, 4, 8, 32});
    const double full = 2.0 * (2 * 4 * 8) * 10 * (16 + 32);
    CHECK(work_of("Attention", {&q, &k, &v}, {&o}).flops == full);
    CHECK(work_of("Attention", {&q, &k, &v}, {&o}, {{"causal", 1}}).flops == full / 2);
  }
  SUBCASE("a gradient op: one product of the forward's size per product operand it writes") {
    Tensor a = shaped({3, 4}), b = shaped({4, 5}), dy = shaped({3, 5}), da = shaped({3, 4}),
           db = shaped({4, 5});
    Tensor y = Tensor::bare(DType::kFloat32, {3, 5});  // read for its shape alone
    const double once = 2.0 * 15 * 4;
    const NodeWork both = work_of("MatMulGrad", {&a, &b, &y, &dy}, {&da, &db},
                                  {{"forward_inputs", 2}});
    CHECK(both.flops == 2 * once);
    CHECK(both.bytes_read == (12 + 20 + 15) * 4);  // the bare Y moves nothing
    CHECK(both.bytes_written == (12 + 20) * 4);
    CHECK(work_of("MatMulGrad", {&a, &b, &y, &dy}, {&da, nullptr}, {{"forward_inputs", 2}})
              .flops == once);
  }
  SUBCASE("memory-bound ops count no FLOPs, only bytes") {
    Tensor x = shaped({4, 4}), y = shaped({4, 4});
    const NodeWork w = work_of("Relu", {&x}, {&y});
    CHECK(w.flops == 0);
    CHECK(w.bytes_read + w.bytes_written == 2 * 16 * 4);
  }
}

TEST_CASE("a profiled step times every node once per run, and the median leaves it out") {
  testing::TempDir dir;
  const auto pipeline =
      Pipeline::load(write(mnist_options(2, true), dir.file("train")), cpu_backend(), 1);
  const plan::Plan& plan = pipeline->plan();
  RunOptions options;
  options.steps = 3;
  options.profile_step = 3;
  const RunReport report = pipeline->run(pipeline->synthetic_inputs(), options);
  REQUIRE(report.step_s.size() == 3);
  CHECK(report.profiled_step == 2);
  CHECK(report.reported_step == 1);  // not the warm-up, not the profiled step
  REQUIRE(!report.node_profile.empty());
  // (stage, instruction, node) -> entry
  std::map<std::tuple<int, std::string, std::string>, const NodeProfile*> by_key;
  std::vector<double> device_ms(2, 0.0);
  for (const NodeProfile& n : report.node_profile) {
    CAPTURE(n.node);
    CHECK(by_key.emplace(std::make_tuple(n.stage, n.instruction, n.node), &n).second);
    CHECK(n.ms >= 0);
    CHECK(n.bytes > 0);
    REQUIRE(n.device >= 0);
    REQUIRE(n.device < 2);
    device_ms[static_cast<size_t>(n.device)] += n.ms;
  }
  // A device's nodes run one after another on its thread, inside the step.
  for (double ms : device_ms) {
    CHECK(ms > 0);
    CHECK(ms <= report.step_s[2] * 1e3 * 1.001);
  }
  // Every product and activation of each stage ran once per microbatch in FWD, and its
  // gradient once per microbatch in BWD; the products' FLOPs are counted.
  for (const plan::Stage& stage : plan.stages) {
    const auto forward = nodes_of(dir.file("train/" + stage.file), {"Conv", "Gemm", "MatMul", "Relu"});
    REQUIRE(!forward.empty());
    for (const std::string& name : forward) {
      CAPTURE(name);
      auto it = by_key.find(std::make_tuple(stage.index, std::string("FWD"), name));
      REQUIRE(it != by_key.end());
      CHECK(it->second->calls == plan.microbatches);
      CHECK((it->second->op_type == "Relu") == (it->second->flops == 0));
    }
    for (const std::string& name :
         nodes_of(dir.file("train/" + stage.backward_file), {"ConvGrad", "GemmGrad", "MatMulGrad"})) {
      CAPTURE(name);
      auto it = by_key.find(std::make_tuple(stage.index, std::string("BWD"), name));
      REQUIRE(it != by_key.end());
      CHECK(it->second->calls == plan.microbatches);
      CHECK(it->second->flops > 0);
    }
  }

  SUBCASE("no profile unless asked") {
    RunOptions plain;
    plain.steps = 2;
    const RunReport r = pipeline->run(pipeline->synthetic_inputs(), plain);
    CHECK(r.profiled_step == -1);
    CHECK(r.node_profile.empty());
  }
}

TEST_CASE("stagerun --profile-nodes: the table by op type and by node, and the JSON record") {
  testing::TempDir dir;
  const std::string plan = write(mnist_options(2, true), dir.file("plan"));
  const Result text = stagerun(dir, plan + " --steps 3 -q --backend cpu --profile-nodes");
  CAPTURE(text.err);
  REQUIRE(text.code == 0);
  CAPTURE(text.out);
  CHECK(text.out.find("per-node profile of step 3") != std::string::npos);
  CHECK(text.out.find("rates against cpu") != std::string::npos);
  CHECK(text.out.find("  ConvGrad ") != std::string::npos);
  CHECK(text.out.find("the 15 nodes taking the most time") != std::string::npos);

  const Result json = stagerun(dir, plan + " --steps 3 -q --backend cpu --profile-nodes --json");
  REQUIRE(json.code == 0);
  std::istringstream lines(json.out);
  std::string line;
  nlohmann::json profile, summary;
  while (std::getline(lines, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record["type"] == "node_profile") profile = record;
    if (record["type"] == "summary") summary = record;
  }
  REQUIRE(profile.is_object());
  CHECK(profile["step"] == 3);
  CHECK(summary["median_of_steps"] == 1);  // step 2: not the warm-up, not the profiled step
  double nodes_ms = 0, ops_ms = 0;
  int64_t nodes_calls = 0, ops_calls = 0;
  for (const auto& n : profile["nodes"]) {
    nodes_ms += n["ms"].get<double>();
    nodes_calls += n["calls"].get<int64_t>();
  }
  for (const auto& o : profile["by_op"]) {
    ops_ms += o["ms"].get<double>();
    ops_calls += o["calls"].get<int64_t>();
    if (o["flops"].get<double>() > 0) CHECK(o.contains("tflop_per_s"));
    CHECK(o.contains("of_peak"));  // a cpu plan on the cpu backend: the plan's rates
  }
  CHECK(nodes_calls == ops_calls);
  CHECK(std::fabs(nodes_ms - ops_ms) <= 1e-9 * std::max(1.0, ops_ms));
  CHECK(std::fabs(nodes_ms - profile["kernel_ms"].get<double>()) <= 1e-9 * std::max(1.0, ops_ms));
}

TEST_CASE("stagerun --profile-nodes of a plan for another device: no %peak, and it says why") {
  testing::TempDir dir;
  plan::PlanOptions o = mnist_options(1, false);
  o.device_spec = "h100";
  const std::string plan = write(o, dir.file("plan"));
  const Result r = stagerun(dir, plan + " --steps 2 -q --backend cpu --profile-nodes");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  CAPTURE(r.out);
  CHECK(r.out.find("no %peak: the plan's device h100 is not what ran") != std::string::npos);
  CHECK(r.out.find("  Conv ") != std::string::npos);
}

}  // namespace stagecraft::rt
