// Gradient clipping by the global norm (stagec --clip-grad-norm C) trains as PyTorch's
// torch.nn.utils.clip_grad_norm_ does (data/torch_clip_mlp, made by its make.py: a small MLP
// whose middle Linear runs twice, SGD, MSE): the norm it reports per step is PyTorch's, the
// clipped gradients' norm within 1e-6 and the losses within 1e-5, where clipping binds (C under
// every step's norm) and where it does not, on one device, on a 2-device pipeline that holds
// the tied weight on both stages (counted once), on data-parallel replicas (their summed
// gradients, counted once) and with ZeRO-1's shards. Also: fp16 with dynamic loss scaling
// clips the unscaled gradients and a skipped step stays skipped, plan.json carries C and the
// runtime refuses a bad one, and the planner charges the optimizer step for the norm.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/tensor_io.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

const std::string kData = STAGECRAFT_TEST_DATA "/torch_clip_mlp/";

/// PyTorch's run at one max_norm (reference.json).
struct TorchRun {
  double max_norm = 0;
  std::vector<double> losses, norms, clipped_norms;
};

std::vector<TorchRun> torch_runs() {
  std::ifstream in(kData + "reference.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<TorchRun> runs;
  for (const nlohmann::json& r : j.at("runs"))
    runs.push_back({r.at("max_norm").get<double>(), r.at("losses").get<std::vector<double>>(),
                    r.at("norms").get<std::vector<double>>(),
                    r.at("clipped_norms").get<std::vector<double>>()});
  return runs;
}

/// A layout of the tied MLP's training: devices in all, replicas, microbatches per replica.
struct Layout {
  const char* name;
  int devices, replicas, microbatches;
  bool split = false;  ///< Split between the tied weight's two uses (2 pipeline devices).
  bool shard = false;  ///< ZeRO-1.
};

plan::PlanOptions clip_options(const Layout& l, double clip) {
  plan::PlanOptions o;
  o.model_path = kData + "tied_mlp.onnx";
  o.devices = l.devices;
  o.data_parallel = l.replicas;
  o.shard_optimizer = l.shard;
  o.batch = 8;
  o.microbatches = l.microbatches;
  o.device_spec = "cpu";
  o.training = true;
  o.loss.kind = "mse";
  o.optimizer = OptimizerKind::kSgd;
  o.training_config.lr = 0.1;
  o.training_config.clip_grad_norm = clip;
  if (l.split) o.split_after = {"/Relu_1"};
  return o;
}

std::map<std::string, Tensor> batch() {
  return {{"x", read_npy(kData + "x.npy")}, {"labels", read_npy(kData + "y.npy")}};
}

/// Plans `o` into `dir` and loads it on the cpu backend.
std::unique_ptr<Pipeline> load(const plan::PlanOptions& o, const std::string& dir) {
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir);
  return Pipeline::load(dir, cpu_backend(), 1);
}

bool close(double got, double want, double rtol) {
  return std::fabs(got - want) <= rtol * std::fabs(want);
}

}  // namespace

TEST_CASE(
    "clipping by the global norm trains as PyTorch's clip_grad_norm_ where it binds and not") {
  const std::vector<TorchRun> torch = torch_runs();
  REQUIRE(torch.size() == 2);
  REQUIRE(torch[0].norms.size() == 3);
  for (double norm : torch[0].norms) REQUIRE(norm > torch[0].max_norm);  // binds every step
  for (double norm : torch[1].norms) REQUIRE(norm < torch[1].max_norm);  // never
  testing::TempDir dir;
  int plan_index = 0;
  for (const Layout& layout :
       {Layout{"one device", 1, 1, 2},
        Layout{"a 2-device pipeline, the tied weight on both", 2, 1, 4, true},
        Layout{"2 data-parallel replicas", 2, 2, 2},
        Layout{"2 replicas with ZeRO-1", 2, 2, 2, false, true},
        Layout{"2 replicas of a 2-device pipeline", 4, 2, 2, true, true}}) {
    for (const TorchRun& want : torch) {
      CAPTURE(layout.name);
      CAPTURE(want.max_norm);
      const plan::PlanOptions o = clip_options(layout, want.max_norm);
      auto pipeline = load(o, dir.file("plan" + std::to_string(plan_index++)));
      if (layout.split) {  // the tied weight is held by both stages: its gradient counts once
        REQUIRE(pipeline->plan().stages.size() == 2);
        CHECK(pipeline->plan().stages[0].shared_weights.size() == 2);  // mid.weight, mid.bias
      }
      RunOptions run;
      run.steps = 3;
      const RunReport report = pipeline->run(batch(), run);
      REQUIRE(report.grad_norm.size() == 3);
      for (size_t k = 0; k < 3; ++k) {
        CAPTURE(k);
        const double norm = report.grad_norm[k];
        const double clipped = norm * std::min(1.0, want.max_norm / (norm + 1e-6));
        CAPTURE(norm);
        CAPTURE(want.norms[k]);
        CHECK(close(norm, want.norms[k], 1e-5));
        CHECK(close(clipped, want.clipped_norms[k], 1e-6));
        CAPTURE(report.losses[k]);
        CAPTURE(want.losses[k]);
        CHECK(close(report.losses[k], want.losses[k], 1e-5));
      }
    }
  }
}

TEST_CASE(
    "fp16 with dynamic loss scaling clips the unscaled gradients and a skipped step stays "
    "skipped") {
  const TorchRun want = torch_runs().at(0);
  testing::TempDir dir;
  plan::PlanOptions o = clip_options({"fp16", 2, 1, 4, true}, want.max_norm);
  o.precision = Precision::kFp16;
  auto pipeline = load(o, dir.file("plan"));
  RunOptions run;
  run.steps = 3;
  RunReport report = pipeline->run(batch(), run);
  REQUIRE(report.grad_norm.size() == 3);
  for (size_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(!report.skipped[k]);
    // Float16 compute: the norm of the unscaled gradients, PyTorch's to float16's precision
    // (the scaled ones would be 65536 times larger).
    CHECK(close(report.grad_norm[k], want.norms[k], 1e-2));
    CHECK(close(report.losses[k], want.losses[k], 1e-2));
  }
  // A scale that overflows float16: the step is skipped, clipping or not, and the weights stay.
  auto fresh = load(o, dir.file("plan_overflow"));
  fresh->set_loss_scale(1e30, 1000);
  report = fresh->run(batch(), run);
  REQUIRE(report.skipped.size() == 3);
  CHECK(report.skipped[0]);
  CHECK(!std::isfinite(report.grad_norm[0]));
  CHECK(report.losses[1] == report.losses[0]);  // the skipped step changed nothing
}

TEST_CASE("plan.json carries the clipping bound and the runtime refuses one not positive") {
  testing::TempDir dir;
  const std::string plan_dir = dir.file("plan");
  plan::PlannedModel clipped = plan::make_plan(clip_options({"one", 1, 1, 2}, 0.25));
  plan::write_plan(clipped, plan_dir);
  const std::string path = plan_dir + "/plan.json";
  nlohmann::json j = nlohmann::json::parse(testing::read_bytes(path));
  CHECK(j.at("training_config").at("clip_grad_norm") == 0.25);
  CHECK(Pipeline::load(plan_dir, cpu_backend(), 1)->plan().training_config.clip_grad_norm == 0.25);
  // An unclipped plan leaves the field out.
  const std::string plain = dir.file("plain");
  plan::PlannedModel unclipped = plan::make_plan(clip_options({"one", 1, 1, 2}, 0));
  plan::write_plan(unclipped, plain);
  CHECK(!nlohmann::json::parse(testing::read_bytes(plain + "/plan.json"))
             .at("training_config")
             .contains("clip_grad_norm"));
  // Edited to -1: refused, naming the file and the field.
  j["training_config"]["clip_grad_norm"] = -1;
  std::ofstream(path) << j.dump();
  try {
    plan::load_plan(plan_dir);
    FAIL("a negative clip_grad_norm was accepted");
  } catch (const Error& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find("clip_grad_norm") != std::string::npos);
    CHECK(what.find("must be positive") != std::string::npos);
  }
}

TEST_CASE("the planner refuses a bad clipping bound and charges the optimizer step for the norm") {
  const Layout two{"two", 2, 1, 4, true};
  CHECK_THROWS_WITH_AS(plan::make_plan(clip_options(two, -1)),
                       doctest::Contains("--clip-grad-norm -1"), Error);
  plan::PlanOptions inference = clip_options(two, 0.5);
  inference.training = false;
  CHECK_THROWS_WITH_AS(plan::make_plan(inference), doctest::Contains("add --train"), Error);
  const plan::PlannedModel plain = plan::make_plan(clip_options(two, 0));
  const plan::PlannedModel clipped = plan::make_plan(clip_options(two, 0.5));
  REQUIRE(plain.plan.stages.size() == clipped.plan.stages.size());
  for (size_t k = 0; k < plain.plan.stages.size(); ++k)
    CHECK(clipped.plan.stages[k].optimizer_ms > plain.plan.stages[k].optimizer_ms);
  CHECK(clipped.plan.predicted.step_ms > plain.plan.predicted.step_ms);
}

}  // namespace stagecraft::rt
