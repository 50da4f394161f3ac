// Fused attention in whole plans (issue 32): every sample with attention (the bundled gpt_tiny
// and a GPT whose output head is tied to its embedding) trains on 1, 2 and 4 devices under
// every schedule to the losses of the same plan with the exporter's ops (--no-fuse-attention),
// and the fused plans keep fewer bytes at their peak; so does a T5-style learned position bias,
// through the fused op's mask gradient.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "samples/builder/sample_models.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

/// A sample GPT of `options`, written once into a folder that lives as long as the tests.
struct WrittenGpt {
  testing::TempDir dir;
  std::string path;
  explicit WrittenGpt(const samples::GptOptions& options) {
    path = dir.file("gpt.onnx");
    samples::build_gpt(options).write(path);
  }
};

/// The tied GPT.
const std::string& tied_gpt() {
  static const WrittenGpt instance(testing::tied_gpt_options());
  return instance.path;
}

/// The GPT as an encoder given padded batches: no causal mask, the padding masked as Hugging
/// Face's models and nn.TransformerEncoder's key_padding_mask export it, an additive
/// [batch, 1, 1, seq] made from the tokens (token 0 is padding; the synthetic inputs are 0s and
/// 1s, so about half the keys of every row are masked, and now and then all of them).
const std::string& padded_gpt() {
  static const WrittenGpt instance([] {
    samples::GptOptions gpt;
    gpt.padding_mask = true;
    gpt.causal = false;
    return gpt;
  }());
  return instance.path;
}

/// The GPT as a T5-style encoder: a learned relative position bias (a [2 seq - 1, heads] table
/// looked up by distance) added to every layer's scores, no causal mask, 8 tokens.
const std::string& biased_gpt() {
  static const WrittenGpt instance([] {
    samples::GptOptions gpt;
    gpt.position_bias = true;
    gpt.causal = false;
    gpt.fixed_seq = true;
    gpt.seq = 8;
    return gpt;
  }());
  return instance.path;
}

constexpr const char* kBiasTable = "transformer.relative_attention_bias.weight";

struct Run {
  std::vector<double> losses;
  int64_t peak = 0;            ///< The largest measured device peak.
  int64_t predicted_peak = 0;  ///< Its prediction.
  int attention_nodes = 0;     ///< Fused Attention nodes the plan's stages hold.
  std::vector<float> bias_table_change;  ///< What the steps added to kBiasTable, if any.
};

Run train(const std::string& model, int devices, const std::string& schedule, bool fused) {
  plan::PlanOptions o = testing::training_options(model, devices, schedule, "cross-entropy");
  if (schedule == "interleaved") o.chunks = 2;
  // See shared_weights_test.cpp: Adam's default epsilon turns last-bit differences in
  // near-zero gradients into whole updates; 1e-3 keeps equal runs within 1e-5.
  o.training_config.epsilon = 1e-3;
  if (model != biased_gpt()) o.dims["seq"] = 8;  // its sequence is fixed at 8
  o.fuse_attention = fused;
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(o);
  Run out;
  for (const plan::OpRecord& op : planned.plan.ops) out.attention_nodes += op.op_type == "Attention";
  plan::write_plan(planned, dir.file("plan"));
  auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
  const auto& first_stage = pipeline->stage_weights(0);
  const auto table = first_stage.find(kBiasTable);
  auto values = [](const Tensor& t) {
    return std::vector<float>(t.as<float>(), t.as<float>() + t.numel());
  };
  const std::vector<float> table_before =
      table != first_stage.end() ? values(table->second) : std::vector<float>{};
  RunOptions options;
  options.steps = 4;
  RunReport report = pipeline->run(pipeline->synthetic_inputs(), options);
  out.losses = report.losses;
  if (table != first_stage.end()) {
    out.bias_table_change = values(table->second);
    for (size_t k = 0; k < table_before.size(); ++k) out.bias_table_change[k] -= table_before[k];
  }
  CAPTURE(fused);
  for (size_t device = 0; device < report.devices.size(); ++device) {
    const DeviceReport& d = report.devices[device];
    CAPTURE(device);
    if (d.peak_bytes > out.peak) {
      out.peak = d.peak_bytes;
      out.predicted_peak = d.predicted_peak_bytes;
    }
    // Every device holds to the bound of the other measured-peak tests, on 1 and 2 devices.
    // On 4 the prediction is not yet a bound, fused or not: gpt_tiny's zb-h1 plan measures
    // 1.20 MiB on device 2 against 1.17 MiB predicted with the exporter's ops too (issue 33).
    if (devices > 2) continue;
    CHECK(d.peak_bytes <= d.predicted_peak_bytes + 4096);
    CHECK(static_cast<double>(d.peak_bytes) >= 0.80 * static_cast<double>(d.predicted_peak_bytes));
  }
  return out;
}

// The same plan with the exporter's ops and fused (two blocks): 4 steps, the loss falling, each
// step's loss within 1e-5 of the other's.
void check_fused_as_plain(const Run& plain, const Run& fused) {
  CHECK(plain.attention_nodes == 0);
  CHECK(fused.attention_nodes == 2);
  REQUIRE(plain.losses.size() == 4);
  REQUIRE(fused.losses.size() == 4);
  CHECK(plain.losses.back() < plain.losses.front());
  for (size_t k = 0; k < plain.losses.size(); ++k) {
    CAPTURE(k);
    CHECK(std::fabs(fused.losses[k] - plain.losses[k]) <=
          1e-5 * std::max(1.0, std::fabs(plain.losses[k])));
  }
}

// A model's constants count in its plan: the sample GPT keeps its causal mask as a bool buffer
// of its whole context ([512, 512]: 256 KiB, read by every layer through a Slice), as Hugging
// Face's GPT-2 export does. At 272 tokens the Slice's output is past what import folds (2^16
// elements), so the stages read the buffer itself, and stagerun holds it with the weights of
// each stage that reads it. The plan left every initializer that is not a float weight out, so
// a run measured the buffer over the prediction (a seq 512 GPT: 244 KiB over).
TEST_CASE("a causal mask kept as a buffer counts in the plan's memory, as the run holds it") {
  testing::TempDir dir;
  samples::GptOptions gpt;
  gpt.seq = 512;
  samples::build_gpt(gpt).write(dir.file("gpt.onnx"));
  for (int devices : {1, 2}) {
    CAPTURE(devices);
    plan::PlanOptions o =
        testing::training_options(dir.file("gpt.onnx"), devices, "1f1b", "cross-entropy");
    o.dims["seq"] = 272;
    o.fuse_attention = false;
    plan::PlannedModel planned = plan::make_plan(o);
    int64_t weights = 0, params = 0;
    for (const plan::Stage& st : planned.plan.stages) {
      weights += st.memory.weights;
      params += st.params;
    }
    // The mask is in the stages' weights beside the float32 parameters.
    CHECK(weights >= 4 * params + 512 * 512);
    plan::write_plan(planned, dir.file("plan"));
    auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
    RunOptions options;
    options.steps = 2;
    const RunReport report = pipeline->run(pipeline->synthetic_inputs(), options);
    for (const DeviceReport& d : report.devices) {
      CHECK(d.peak_bytes <= d.predicted_peak_bytes + 4096);
      CHECK(static_cast<double>(d.peak_bytes) >=
            0.80 * static_cast<double>(d.predicted_peak_bytes));
    }
  }
}

TEST_CASE("fused attention trains to the exporter's ops' losses on 1, 2 and 4 devices") {
  const std::string gpt_tiny = std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx";
  for (const std::string& model : {gpt_tiny, tied_gpt()}) {
    for (int devices : {1, 2, 4}) {
      for (const std::string schedule : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
        if (devices == 1 && schedule != "gpipe") continue;  // one device: one schedule's order
        CAPTURE(model);
        CAPTURE(devices);
        CAPTURE(schedule);
        const Run plain = train(model, devices, schedule, false);
        const Run fused = train(model, devices, schedule, true);
        check_fused_as_plain(plain, fused);  // both samples have two blocks, each fused
        MESSAGE(fmt::format("{} devices, {}: peak {} B (predicted {}) with the exporter's ops, {} "
                            "B (predicted {}) fused",
                            devices, schedule, plain.peak, plain.predicted_peak, fused.peak,
                            fused.predicted_peak));
      }
    }
  }
}

// The padding mask is made once from the tokens in the first stage and read by the Attention of
// every layer, each a stage of its own on 2 and 4 devices: the fused op gives its mask no
// gradient, so the first stage must not wait for one (it did: "backward input '...@grad' of
// stage 0 is neither a forward value nor a received gradient", a plan the runtime refused).
TEST_CASE("a padding mask from the tokens, shared by every layer, trains fused as exported") {
  for (int devices : {1, 2, 4}) {
    for (const std::string schedule : {"gpipe", "1f1b", "zb-h1"}) {
      if (devices == 1 && schedule != "gpipe") continue;
      CAPTURE(devices);
      CAPTURE(schedule);
      check_fused_as_plain(train(padded_gpt(), devices, schedule, false),
                           train(padded_gpt(), devices, schedule, true));
    }
  }
}

// A learned relative position bias (T5's, Swin's) is made once in the first stage and added to
// every layer's scores: the fused nodes take it as a mask with mask_gradient = 1, whose gradient
// (runtime/cpu/attention.cpp's mask pass) reaches the bias table through the stages. It was left
// unfused before, for the fused op gave its mask no gradient.
TEST_CASE("a learned position bias trains fused, its table through the mask's gradient") {
  for (int devices : {1, 2, 4}) {
    for (const std::string schedule : {"gpipe", "1f1b", "zb-h1"}) {
      if (devices == 1 && schedule != "gpipe") continue;
      CAPTURE(devices);
      CAPTURE(schedule);
      const Run plain = train(biased_gpt(), devices, schedule, false);
      const Run fused = train(biased_gpt(), devices, schedule, true);
      check_fused_as_plain(plain, fused);
      // The table moved as much in both, element by element: Adam normalises a gradient's
      // scale away but for epsilon, so a dmask off by half kept the losses within 1e-5 and
      // failed only this.
      REQUIRE(plain.bias_table_change.size() == fused.bias_table_change.size());
      float largest = 0, apart = 0;
      for (size_t k = 0; k < plain.bias_table_change.size(); ++k) {
        largest = std::max(largest, std::fabs(plain.bias_table_change[k]));
        apart = std::max(apart, std::fabs(plain.bias_table_change[k] - fused.bias_table_change[k]));
      }
      CHECK(largest > 0);
      CHECK(apart <= 1e-3f * largest);
    }
  }
}

TEST_CASE("fused attention lowers gpt_tiny's measured peak at a longer sequence") {
  // At seq 64 each block's [B, H, T, T] scores and probabilities (2 x 4 x 64 x 64 floats per
  // microbatch, 128 KiB each) outweigh the log-sum-exp (2 KiB) the fused backward keeps instead.
  const std::string gpt_tiny = std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx";
  auto peak = [&](bool fused) {
    plan::PlanOptions o = testing::training_options(gpt_tiny, 1, "gpipe", "cross-entropy");
    o.dims["seq"] = 64;
    o.fuse_attention = fused;
    testing::TempDir dir;
    auto pipeline = testing::load_plan(o, dir.file("plan"));
    RunOptions options;
    options.steps = 1;
    return pipeline->run(pipeline->synthetic_inputs(), options).devices.at(0).peak_bytes;
  };
  const int64_t plain = peak(false), fused = peak(true);
  MESSAGE(fmt::format("gpt_tiny seq 64, 1 device: measured peak {} B unfused, {} B fused", plain,
                      fused));
  CHECK(fused < plain);
}

}  // namespace
}  // namespace stagecraft::rt
