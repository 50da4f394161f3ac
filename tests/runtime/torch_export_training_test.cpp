// A PyTorch export trains as PyTorch trains it (data/torch_encoder_lm: a 2-layer causal
// nn.TransformerEncoder LM exported by PyTorch 1.13 the default way, made by its make.py). That
// export merges equal initializers, so layer 1's weights arrive as Identity nodes of layer 0's,
// and holds the causal mask buffer as a float initializer of -inf entries. A training plan gives
// each merged weight its own copy and leaves the mask untrained, saying both, and its SGD losses
// are PyTorch's on 1 and 2 devices; with --keep-merged the layers train as one (other losses).
#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/tensor_io.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/pipeline.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

const std::string kData = STAGECRAFT_TEST_DATA "/torch_encoder_lm/";

plan::PlanOptions lm_options(int devices, bool keep_merged) {
  plan::PlanOptions o;
  o.model_path = kData + "encoder_lm.onnx";
  o.devices = devices;
  o.batch = 8;
  o.microbatches = 2;
  o.device_spec = "cpu";
  o.training = true;
  o.loss.kind = "cross-entropy";
  o.optimizer = OptimizerKind::kSgd;
  o.training_config.lr = 0.1;
  o.training_config.weight_decay = 0;
  o.keep_merged = keep_merged;
  return o;
}

std::vector<double> torch_losses() {
  std::ifstream in(kData + "losses.json");
  return nlohmann::json::parse(in).at("losses").get<std::vector<double>>();
}

// Trains the plan `steps` steps on the fixture's batch; with `exported`, then writes the model
// with its trained weights there (stagerun --export).
std::vector<double> train(plan::PlannedModel& planned, const std::string& dir, int steps,
                          const std::string& exported = "") {
  plan::write_plan(planned, dir);
  auto pipeline = Pipeline::load(dir, cpu_backend(), 1);
  RunOptions run;
  run.steps = steps;
  std::vector<double> losses =
      pipeline
          ->run({{"ids", read_npy(kData + "ids.npy")}, {"labels", read_npy(kData + "labels.npy")}},
                run)
          .losses;
  if (!exported.empty()) export_model(*pipeline, exported);
  return losses;
}

// The float initializer `name` of the ONNX file at `path` (empty when there is none).
std::vector<float> initializer(const std::string& path, const std::string& name) {
  onnx::ModelProto model;
  std::ifstream in(path, std::ios::binary);
  REQUIRE(model.ParseFromIstream(&in));
  for (const onnx::TensorProto& t : model.graph().initializer())
    if (t.name() == name) {
      std::vector<float> out(t.raw_data().size() / sizeof(float));
      std::memcpy(out.data(), t.raw_data().data(), out.size() * sizeof(float));
      return out;
    }
  return {};
}

bool close_to(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  if (got.size() != want.size()) return false;
  for (size_t k = 0; k < got.size(); ++k)
    if (!(std::fabs(got[k] - want[k]) <= rtol * std::fabs(want[k]))) return false;
  return true;
}

std::vector<float> to_vector(const Tensor& t) {
  return std::vector<float>(t.as<float>(), t.as<float>() + t.numel());
}

}  // namespace

TEST_CASE("a PyTorch encoder LM export trains as PyTorch: merged weights apart, the mask frozen") {
  const std::vector<double> want = torch_losses();
  REQUIRE(want.size() == 3);
  testing::TempDir dir;
  for (int devices : {1, 2}) {
    CAPTURE(devices);
    plan::PlannedModel planned = plan::make_plan(lm_options(devices, false));
    // nn.MultiheadAttention's export (3-D products over batch x heads, the scale on Q, the mask
    // buffer added): both blocks are fused, and the losses below are still PyTorch's.
    CHECK(std::count_if(planned.plan.ops.begin(), planned.plan.ops.end(),
                        [](const plan::OpRecord& op) { return op.op_type == "Attention"; }) == 2);
    CHECK(planned.untie_summary.find("train apart, as PyTorch trains them: ") !=
          std::string::npos);
    CHECK(std::any_of(planned.model.untied.begin(), planned.model.untied.end(),
                      [](const std::string& u) { return u.rfind("enc.layers.1.", 0) == 0; }));
    CHECK(planned.freeze_summary.find("left untrained, as PyTorch leaves buffers") !=
          std::string::npos);
    CHECK(planned.freeze_summary.find("non-finite") != std::string::npos);
    const std::string exported = dir.file("trained" + std::to_string(devices) + ".onnx");
    const std::vector<double> got =
        train(planned, dir.file("plan" + std::to_string(devices)), 3, exported);
    CAPTURE(got);
    CAPTURE(want);
    CHECK(close_to(got, want, 1e-4));
    // --export writes each untied weight under its own PyTorch name, trained apart.
    const std::vector<float> first = initializer(exported, "enc.layers.0.norm1.weight"),
                             second = initializer(exported, "enc.layers.1.norm1.weight");
    REQUIRE(first.size() == 32);
    REQUIRE(second.size() == 32);
    CHECK(first != second);
  }
  // Kept merged, the two layers train as one set of weights: not PyTorch's training.
  plan::PlannedModel merged = plan::make_plan(lm_options(1, true));
  CHECK(merged.untie_summary.empty());
  const std::vector<double> shared = train(merged, dir.file("merged"), 3);
  REQUIRE(shared.size() == 3);
  CHECK(std::fabs(shared[0] - want[0]) <= 1e-4 * want[0]);  // the same function at the start
  CHECK(std::fabs(shared[2] - want[2]) > 1e-4 * want[2]);   // then other updates
}

TEST_CASE("--train-also trains a mask-like initializer, and inference plans untie nothing") {
  plan::PlanOptions o = lm_options(1, false);
  o.train_also = {"onnx::Add_*"};
  const plan::PlannedModel planned = plan::make_plan(o);
  CHECK(planned.freeze_summary.find("onnx::Add_") == std::string::npos);
  plan::PlanOptions inference;
  inference.model_path = kData + "encoder_lm.onnx";
  inference.batch = 8;
  inference.device_spec = "cpu";
  const plan::PlannedModel served = plan::make_plan(inference);
  CHECK(served.untie_summary.empty());
  CHECK(served.model.untied.empty());
}

}  // namespace stagecraft::rt

namespace stagecraft::rt {
namespace {

TEST_CASE("a training-mode PyTorch export with Dropout stays under its predicted peak") {
  // data/torch_encoder_dropout: every Dropout keeps a bool mask per microbatch for the
  // backward. The plan counted only float outputs and the run passed it by the masks' bytes
  // (+1.05 MB a microbatch on a 4-layer, width-128 export); it must count every output it keeps.
  // Mixed precision runs the training-mode Dropouts widened to float32.
  for (Precision precision : {Precision::kFp32, Precision::kMixed}) {
    for (int devices : {1, 2}) {
      for (const std::string schedule : {"gpipe", "1f1b"}) {
        CAPTURE(devices);
        CAPTURE(schedule);
        CAPTURE(static_cast<int>(precision));
        plan::PlanOptions o;
        o.model_path = STAGECRAFT_TEST_DATA "/torch_encoder_dropout/encoder_lm_dropout.onnx";
        o.devices = devices;
        o.batch = 8;
        o.microbatches = 2;
        o.device_spec = "cpu";
        o.training = true;
        o.schedule = parse_schedule(schedule);
        o.loss.kind = "cross-entropy";
        o.precision = precision;
        testing::TempDir dir;
        plan::PlannedModel planned = plan::make_plan(o);
        plan::write_plan(planned, dir.file("plan"));
        auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
        RunOptions run;
        run.steps = 2;
        const RunReport report = pipeline->run(pipeline->synthetic_inputs(), run);
        for (const DeviceReport& d : report.devices) {
          CAPTURE(d.peak_bytes);
          CAPTURE(d.predicted_peak_bytes);
          // 4 KiB: the stage's non-float constants (shape operands), which the plan leaves out.
          CHECK(d.peak_bytes <= d.predicted_peak_bytes + 4096);
          CHECK(static_cast<double>(d.predicted_peak_bytes - d.peak_bytes) <=
                0.2 * static_cast<double>(d.predicted_peak_bytes));
        }
      }
    }
  }
}

// nn.Embedding(padding_idx=0) zeroes row 0 and never gives it a gradient; the export is a
// plain Gather. The lookup table here has row 0 of zeros (the synthetic ids are 0s and 1s: row
// 0 is read by half the tokens) and an untied head; the training plan keeps row 0 at zero, as
// PyTorch does, and trains row 1; --train-also names the table to train row 0 too.
TEST_CASE("an embedding's row of zeros is its padding_idx: no gradient from the lookup") {
  testing::TempDir dir;
  const std::vector<float> table = testing::write_padded_embedding_lm(dir.file("lm.onnx"));
  for (const bool train_also : {false, true}) {
    for (int devices : {1, 2}) {
      CAPTURE(train_also);
      CAPTURE(devices);
      plan::PlanOptions o = testing::padded_embedding_options(dir.file("lm.onnx"), devices, 0.01);
      if (train_also) o.train_also = {"emb.*"};
      if (devices == 2) o.split_after = {"/emb/Gather"};
      plan::PlannedModel planned = plan::make_plan(o);
      const bool kept = planned.freeze_summary.find(
                            "1 embedding row of zeros kept as nn.Embedding's padding_idx keeps it "
                            "(no gradient from the lookup): emb.weight row 0") != std::string::npos;
      CHECK(kept == !train_also);
      plan::write_plan(planned, dir.file("plan"));
      auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
      RunOptions run;
      run.steps = 3;
      pipeline->run(pipeline->synthetic_inputs(), run);
      const Tensor& trained = pipeline->stage_weights(0).at("emb.weight");
      const float* t = trained.as<float>();
      CHECK(std::all_of(t, t + 4, [](float x) { return x == 0.0f; }) == !train_also);
      CHECK_FALSE(std::equal(t + 4, t + 8, table.begin() + 4));  // row 1 trains
    }
  }
}

// x [batch, 8] -> router: x W + router.bias [4] -> Softmax (a top-1 router's scores) -> a
// Linear; and attention scores Q K^T (both activations) + a finite causal mask buffer [4, 4]
// (-1e9 above the diagonal, as torch.finfo.min fills write it) -> Softmax -> times V. Both added
// initializers feed a Softmax: the bias is a Linear's, trained; the mask is a buffer, frozen.
void write_router_and_mask(const std::string& path, bool zero_mask = false) {
  samples::ModelBuilder b("router");
  b.add_input("x", onnx::TensorProto::FLOAT, {"batch", 4, 8});
  const std::string w = b.add_parameter("router.weight", {8, 4}, 8);
  const std::string bias = b.add_parameter("router.bias", {4}, 8);
  const std::string scores = b.add_op(
      "Softmax", "/router/Softmax",
      {b.add_op("Add", "/router/Add", {b.add_op("MatMul", "/router/MatMul", {"x", w}), bias})},
      {samples::attr_int("axis", -1)});
  std::vector<float> causal(16, 0.0f);
  for (int q = 0; q < 4; ++q)
    for (int k = q + 1; k < 4; ++k) causal[q * 4 + k] = -1e9f;
  if (zero_mask) causal.assign(16, 0.0f);
  const std::string mask = b.add_float_buffer("attn.mask", {4, 4}, causal);
  const std::string q = b.add_op("MatMul", "/q", {"x", b.add_parameter("q.weight", {8, 8}, 8)});
  const std::string kt = b.add_op(
      "Transpose", "/kt", {b.add_op("MatMul", "/k", {"x", b.add_parameter("k.weight", {8, 8}, 8)})},
      {samples::attr_ints("perm", {0, 2, 1})});
  const std::string probs =
      b.add_op("Softmax", "/attn/Softmax",
               {b.add_op("Add", "/attn/Add", {b.add_op("MatMul", "/attn/MatMul", {q, kt}), mask})},
               {samples::attr_int("axis", -1)});
  const std::string mixed = b.add_op("MatMul", "/attn/MatMul_1", {probs, "x"});
  const std::string both =
      b.add_op("Concat", "/cat", {mixed, scores}, {samples::attr_int("axis", -1)});
  b.add_node("MatMul", "/head", {both, b.add_parameter("head.weight", {12, 3}, 12)}, {"y"});
  b.add_output("y", onnx::TensorProto::FLOAT, {"batch", 4, 3});
  b.write(path);
}

TEST_CASE("a Linear's bias before a Softmax trains, a finite mask buffer there does not") {
  testing::TempDir dir;
  write_router_and_mask(dir.file("router.onnx"));
  plan::PlanOptions o = testing::training_options(dir.file("router.onnx"), 1, "1f1b", "mse");
  o.fuse_attention = false;
  plan::PlannedModel planned = plan::make_plan(o);
  CAPTURE(planned.freeze_summary);
  // router.bias was frozen as "an additive attention mask" before: silently untrained.
  CHECK(planned.freeze_summary.find("router.bias") == std::string::npos);
  CHECK(planned.freeze_summary.find("attn.mask (an additive attention mask") != std::string::npos);
  plan::write_plan(planned, dir.file("plan"));
  auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
  const std::vector<float> before = to_vector(pipeline->stage_weights(0).at("router.bias"));
  RunOptions run;
  run.steps = 2;
  pipeline->run(pipeline->synthetic_inputs(), run);
  CHECK(to_vector(pipeline->stage_weights(0).at("router.bias")) != before);
  CHECK(to_vector(pipeline->stage_weights(0).at("attn.mask"))[1] == -1e9f);
}

TEST_CASE("a learned attention bias initialised to zeros trains") {
  // The mask's place with nothing below zero: nn.Parameter(torch.zeros(T, T)) added to the
  // scores, which PyTorch trains; a mask would take from them.
  testing::TempDir dir;
  write_router_and_mask(dir.file("router.onnx"), /*zero_mask=*/true);
  plan::PlanOptions o = testing::training_options(dir.file("router.onnx"), 1, "1f1b", "mse");
  o.fuse_attention = false;
  plan::PlannedModel planned = plan::make_plan(o);
  CAPTURE(planned.freeze_summary);
  CHECK(planned.freeze_summary.find("attn.mask") == std::string::npos);
}

}  // namespace
}  // namespace stagecraft::rt
