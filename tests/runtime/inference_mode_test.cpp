// An inference plan of a model exported in training mode (what a user exports to train:
// torch.onnx.export(..., training=TrainingMode.TRAINING)) runs its Dropout and
// BatchNormalization in inference mode, as PyTorch's eval() does, and says so; with
// --keep-training-mode they stay as exported. Checked against PyTorch's own eval() output of
// an export nobody here wrote (data/torch_training_export: PyTorch 1.13, made by its make.py),
// on 1 and 2 devices.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/tensor_io.h"
#include "runtime/exec/pipeline.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

const std::string kData = STAGECRAFT_TEST_DATA "/torch_training_export/";

plan::PlanOptions inference_options(int devices, bool keep_training_mode) {
  plan::PlanOptions o;
  o.model_path = kData + "mlp_bn_dropout_training.onnx";
  o.devices = devices;
  o.microbatches = 2;
  o.batch = 8;
  o.keep_training_mode = keep_training_mode;
  o.device_spec = "cpu";
  return o;
}

// The largest |y - eval_y| of the plan's output for x.npy, and the planner's summary line.
double error_against_eval(const plan::PlanOptions& o, const std::string& dir,
                          std::string* summary = nullptr) {
  plan::PlannedModel planned = plan::make_plan(o);
  if (summary) *summary = planned.inference_mode_summary;
  plan::write_plan(planned, dir);
  auto pipeline = Pipeline::load(dir, cpu_backend(), 1);
  RunOptions run;
  run.steps = 1;
  const Tensor x = read_npy(kData + "x.npy"), want = read_npy(kData + "eval_y.npy");
  const RunReport report = pipeline->run({{"x", x}}, run);
  const Tensor& y = report.outputs.at("y");
  REQUIRE(y.numel() == want.numel());
  double worst = 0;
  for (int64_t i = 0; i < y.numel(); ++i)
    worst = std::max(worst, std::fabs(double{y.as<float>()[i]} - want.as<float>()[i]));
  return worst;
}

}  // namespace

TEST_CASE("inference plan of a PyTorch training-mode export: Dropout and BatchNorm as eval()") {
  testing::TempDir dir;
  for (int devices : {1, 2}) {
    CAPTURE(devices);
    std::string summary;
    const double error = error_against_eval(inference_options(devices, false),
                                            dir.file("plan" + std::to_string(devices)), &summary);
    CHECK(error < 1e-5);
    CHECK(summary.find("1 Dropout node and 1 BatchNormalization node exported in training "
                       "mode run in inference mode") != std::string::npos);
    CHECK(summary.find("--keep-training-mode keeps them") != std::string::npos);
  }
  // Kept in training mode, the same plan computes another function (batch statistics, random
  // drops): what every inference plan of such an export computed before.
  std::string summary;
  CHECK(error_against_eval(inference_options(1, true), dir.file("kept"), &summary) > 1e-2);
  CHECK(summary.rfind("--keep-training-mode: 1 Dropout node and 1 BatchNormalization node", 0) ==
        0);
}

TEST_CASE("inference-mode leaves training plans and eval-mode exports alone") {
  // A training plan of the same export keeps both in training mode (no line about it).
  plan::PlanOptions train = inference_options(1, false);
  train.training = true;
  train.loss.kind = "mse";
  const plan::PlannedModel planned = plan::make_plan(train);
  CHECK(planned.inference_mode_summary.empty());
  int training_bn = 0;
  for (const ir::Node& node : planned.model.graph.nodes())
    if (!node.dead && node.op_type == "BatchNormalization")
      training_bn += node.attr_int("training_mode", 0) != 0 ? 1 : 0;
  CHECK(training_bn == 1);
}

TEST_CASE("inference plan of a training-mode export fuses the attention its Dropouts hid") {
  // nn.TransformerEncoder exported in training mode: each block's probabilities go through a
  // Dropout, so import leaves its attention unfused; once inference mode passes the Dropouts
  // through, the planner fuses the blocks, and the logits are the unfused plan's.
  testing::TempDir dir;
  const std::string model = STAGECRAFT_TEST_DATA "/torch_encoder_dropout/encoder_lm_dropout.onnx";
  for (int devices : {1, 2}) {
    CAPTURE(devices);
    auto logits = [&](bool fused, int* attention) {
      plan::PlanOptions o = testing::inference_options(model, devices);
      o.microbatches = 2;
      o.batch = 4;
      o.fuse_attention = fused;
      plan::PlannedModel planned = plan::make_plan(o);
      *attention = static_cast<int>(
          std::count_if(planned.plan.ops.begin(), planned.plan.ops.end(),
                        [](const plan::OpRecord& op) { return op.op_type == "Attention"; }));
      CHECK(planned.model.attention_not_fused.empty());
      const std::string at = dir.file(fmt::format("plan{}{}", devices, fused));
      plan::write_plan(planned, at);
      auto pipeline = Pipeline::load(at, cpu_backend(), 1);
      RunOptions run;
      run.steps = 1;
      return clone(pipeline->run(pipeline->synthetic_inputs(), run).outputs.at("logits"));
    };
    int fused_blocks = 0, plain_blocks = 0;
    const Tensor fused = logits(true, &fused_blocks), plain = logits(false, &plain_blocks);
    CHECK(fused_blocks == 4);
    CHECK(plain_blocks == 0);
    REQUIRE(fused.numel() == plain.numel());
    double worst = 0, largest = 0;
    for (int64_t i = 0; i < fused.numel(); ++i) {
      worst = std::max(worst, std::fabs(double{fused.as<float>()[i]} - plain.as<float>()[i]));
      largest = std::max(largest, std::fabs(double{plain.as<float>()[i]}));
    }
    CHECK(largest > 0.1);
    CHECK(worst <= 1e-5 * largest);
  }
}

}  // namespace stagecraft::rt
