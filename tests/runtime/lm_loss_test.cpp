// Language-model cross-entropy end to end on gpt_tiny (logits [B,T,V], token labels [B,T]):
// the training loss equals a cross-entropy over the vocabulary computed here from the same
// model's logits (an inference run of the same weights), padding labelled with the ignore index
// is left out, a microbatch with nothing counted adds 0 and no gradient, and pipelined runs
// give the single-device losses under every schedule.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

constexpr int64_t kBatch = 8, kMicrobatches = 4, kSeq = 8, kVocab = 256;
constexpr int64_t kIgnore = -100;

plan::PlanOptions gpt_options(bool training, int devices = 1,
                              const std::string& schedule = "gpipe") {
  plan::PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx";
  o.devices = devices;
  o.batch = kBatch;
  o.microbatches = kMicrobatches;
  o.dims["seq"] = kSeq;
  o.device_spec = "cpu";
  o.training = training;
  if (training) {
    o.schedule = stagecraft::parse_schedule(schedule);
    o.loss.kind = "cross-entropy";  // no --loss-axis: the labels are added, rank 3 -> last axis
    o.optimizer = stagecraft::OptimizerKind::kAdam;
    o.training_config.lr = 0.01;
  }
  return o;
}

std::unique_ptr<Pipeline> load(const plan::PlanOptions& o, const testing::TempDir& dir) {
  return testing::load_plan(o, dir.file("plan"));
}

/// Tokens of a fixed pseudo-random text and their next-token labels (the last position of each
/// row: the ignore index).
struct Tokens {
  Tensor ids = Tensor::owned(DType::kInt64, {kBatch, kSeq});
  Tensor labels = Tensor::owned(DType::kInt64, {kBatch, kSeq});
  int64_t& label(int64_t row, int64_t t) { return labels.as<int64_t>()[row * kSeq + t]; }
};

Tokens next_token_data() {
  Tokens d;
  uint64_t x = 12345;
  for (int64_t i = 0; i < kBatch * kSeq; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    d.ids.as<int64_t>()[i] = static_cast<int64_t>((x >> 33) % kVocab);
  }
  for (int64_t r = 0; r < kBatch; ++r)
    for (int64_t t = 0; t < kSeq; ++t)
      d.label(r, t) = t + 1 < kSeq ? d.ids.as<int64_t>()[r * kSeq + t + 1] : kIgnore;
  return d;
}

/// The logits [B, T, V] of an inference run of gpt_tiny on `ids`.
Tensor logits_of(const Tensor& ids) {
  testing::TempDir dir;
  auto pipeline = load(gpt_options(false), dir);
  RunReport report = pipeline->run({{"input_ids", ids}}, RunOptions{});
  Tensor logits = report.outputs.at("logits");
  REQUIRE(logits.shape == Shape{kBatch, kSeq, kVocab});
  return logits;
}

/// Cross-entropy computed here: per microbatch, the mean over positions whose label is not
/// `ignore` of -log_softmax(logits over the vocabulary)[label] (0 when none counts); the step's
/// loss is the mean over microbatches.
double reference_loss(const Tensor& logits, const Tensor& labels, std::optional<int64_t> ignore) {
  const int64_t rows_per_mb = kBatch / kMicrobatches;
  double step = 0;
  for (int64_t mb = 0; mb < kMicrobatches; ++mb) {
    double sum = 0;
    int64_t counted = 0;
    for (int64_t r = mb * rows_per_mb; r < (mb + 1) * rows_per_mb; ++r)
      for (int64_t t = 0; t < kSeq; ++t) {
        const int64_t y = labels.as<int64_t>()[r * kSeq + t];
        if (ignore && y == *ignore) continue;
        const float* z = logits.as<float>() + (r * kSeq + t) * kVocab;
        double mx = z[0], s = 0;
        for (int64_t v = 1; v < kVocab; ++v) mx = std::max(mx, static_cast<double>(z[v]));
        for (int64_t v = 0; v < kVocab; ++v) s += std::exp(z[v] - mx);
        sum += -(z[y] - mx - std::log(s));
        ++counted;
      }
    step += counted ? sum / static_cast<double>(counted) : 0.0;
  }
  return step / kMicrobatches;
}

/// The first step's loss of a 1-device training plan of gpt_tiny (before any update).
double first_loss(const Tokens& d) {
  testing::TempDir dir;
  auto pipeline = load(gpt_options(true), dir);
  RunOptions one;
  one.steps = 1;
  return pipeline->run({{"input_ids", d.ids}, {"labels", d.labels}}, one).losses.at(0);
}

TEST_CASE("gpt_tiny's training loss is the cross-entropy over the vocabulary of its logits") {
  Tokens d = next_token_data();
  const Tensor logits = logits_of(d.ids);
  const double want = reference_loss(logits, d.labels, kIgnore);
  CHECK(want > 4.0);  // about log(256) = 5.5 for an untrained model: a real comparison
  CHECK(std::fabs(first_loss(d) - want) <= 1e-5);
}

TEST_CASE("labels equal to the ignore index are left out of the loss and of its count") {
  Tokens d = next_token_data();
  for (int64_t r = 0; r < kBatch; ++r)
    for (int64_t t = 0; t < kSeq; t += 3) d.label(r, t) = kIgnore;  // padding here and there
  for (int64_t t = 0; t < kSeq; ++t) d.label(0, t) = d.label(1, t) = kIgnore;  // microbatch 0: all
  const Tensor logits = logits_of(d.ids);
  const double masked = reference_loss(logits, d.labels, kIgnore);
  // Counting the padding as class 0 instead gives another number: the check below can fail.
  Tensor as_class0 = Tensor::owned(DType::kInt64, {kBatch, kSeq});
  for (int64_t i = 0; i < kBatch * kSeq; ++i)
    as_class0.as<int64_t>()[i] =
        d.labels.as<int64_t>()[i] == kIgnore ? 0 : d.labels.as<int64_t>()[i];
  CHECK(std::fabs(reference_loss(logits, as_class0, std::nullopt) - masked) > 1e-2);
  CHECK(std::fabs(first_loss(d) - masked) <= 1e-5);
}

TEST_CASE("a step whose every label is ignored has loss 0 and leaves the weights where they were") {
  Tokens d = next_token_data();
  for (int64_t i = 0; i < kBatch * kSeq; ++i) d.labels.as<int64_t>()[i] = kIgnore;
  plan::PlanOptions o = gpt_options(true);
  o.optimizer = stagecraft::OptimizerKind::kSgd;
  o.training_config.lr = 1.0;
  testing::TempDir dir;
  auto pipeline = load(o, dir);
  std::map<std::string, std::vector<float>> before;
  for (const auto& [name, w] : pipeline->stage_weights(0))
    if (w.dtype == DType::kFloat32) before[name].assign(w.as<float>(), w.as<float>() + w.numel());
  REQUIRE(!before.empty());
  RunReport report = pipeline->run({{"input_ids", d.ids}, {"labels", d.labels}}, RunOptions{});
  CHECK(report.losses.at(0) == 0.0);
  int moved = 0;
  for (const auto& [name, w] : pipeline->stage_weights(0))
    if (w.dtype == DType::kFloat32)
      for (int64_t i = 0; i < w.numel(); ++i) moved += w.as<float>()[i] != before.at(name)[i];
  CHECK(moved == 0);
}

TEST_CASE("pipelined language-model training gives the single-device losses for every schedule") {
  Tokens d = next_token_data();
  for (int64_t r = 0; r < kBatch; r += 2) d.label(r, 0) = kIgnore;
  const std::map<std::string, Tensor> inputs{{"input_ids", d.ids}, {"labels", d.labels}};
  auto train = [&](int devices, const std::string& schedule) {
    plan::PlanOptions o = gpt_options(true, devices, schedule);
    if (schedule == "interleaved") o.chunks = 2;
    testing::TempDir dir;
    auto pipeline = load(o, dir);
    RunOptions options;
    options.steps = 10;
    return pipeline->run(inputs, options).losses;
  };
  const std::vector<double> reference = train(1, "gpipe");
  REQUIRE(reference.size() == 10);
  CHECK(reference.back() < reference.front() - 0.5);  // it learns the tokens
  for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
    CAPTURE(schedule);
    const std::vector<double> losses = train(2, schedule);
    REQUIRE(losses.size() == reference.size());
    for (size_t k = 0; k < losses.size(); ++k) {
      CAPTURE(k);
      CHECK(std::fabs(losses[k] - reference[k]) <= 1e-5 * std::max(1.0, std::fabs(reference[k])));
    }
  }
}

}  // namespace
}  // namespace stagecraft::rt
