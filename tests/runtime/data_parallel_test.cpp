// Data parallelism x pipeline parallelism in one process (one thread per device of every
// replica): 2 replicas of a 2-device pipeline train as one device does on the same global
// batch (losses and weights within 1e-5) under GPipe, 1F1B and ZB-H1, also with a weight two
// stages share; the replicas' weights stay bit-identical; inference gives one device's outputs
// bit for bit; a checkpoint of 2 replicas resumes on 1.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "samples/builder/sample_models.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

plan::PlanOptions options_for(const std::string& model, const std::string& loss, int devices,
                              int replicas, int microbatches, const std::string& schedule) {
  plan::PlanOptions o;
  o.model_path = model;
  o.devices = devices;
  o.data_parallel = replicas;
  o.batch = 16;
  o.microbatches = microbatches;
  o.training = true;
  o.schedule = stagecraft::parse_schedule(schedule);
  if (o.schedule == ScheduleKind::kInterleaved) o.chunks = 2;
  o.optimizer = stagecraft::OptimizerKind::kAdam;
  o.training_config.lr = 0.01;
  // Adam's default epsilon turns last-bit differences of near-zero gradients into whole
  // updates (tests/runtime/shared_weights_test.cpp says more); 1e-3 keeps them within 1e-5.
  o.training_config.epsilon = 1e-3;
  o.loss.kind = loss;
  o.device_spec = "cpu";
  return o;
}

struct Trained {
  std::vector<double> losses;
  std::map<std::string, Tensor> weights;  ///< Float weights by name, from the lowest holder.
  int replica_copies_differ = 0;          ///< Replica weights not the first replica's bytes.
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())) == 0;
}

/// `bucket_bytes` and `overlap`: RunOptions' (the gradient buckets summed over the replicas).
Trained train(const plan::PlanOptions& o, int steps,
              int64_t bucket_bytes = schedule::kDefaultGradientBucketBytes, bool overlap = true) {
  testing::TempDir dir;
  auto pipeline = testing::load_plan(o, dir.file("plan"));
  RunOptions options;
  options.steps = steps;
  options.bucket_bytes = bucket_bytes;
  options.overlap_allreduce = overlap;
  Trained out;
  out.losses = pipeline->run(pipeline->synthetic_inputs(), options).losses;
  for (const plan::Stage& stage : pipeline->plan().stages) {
    for (const auto& [name, t] : pipeline->stage_weights(stage.index))
      if (t.dtype == DType::kFloat32) out.weights.emplace(name, clone(t));
    for (int r = 1; r < pipeline->replicas(); ++r)
      for (const auto& [name, t] : pipeline->replica_weights(r, stage.index))
        if (!same_bytes(t, pipeline->stage_weights(stage.index).at(name)))
          ++out.replica_copies_differ;
  }
  return out;
}

void check_same_training(const Trained& one, const Trained& replicated) {
  REQUIRE(replicated.losses.size() == one.losses.size());
  for (size_t k = 0; k < one.losses.size(); ++k) {
    CAPTURE(k);
    CHECK(std::abs(replicated.losses[k] - one.losses[k]) < 1e-5);
  }
  CHECK(replicated.replica_copies_differ == 0);
  REQUIRE(replicated.weights.size() == one.weights.size());
  for (const auto& [name, w] : one.weights) {
    CAPTURE(name);
    const Tensor& got = replicated.weights.at(name);
    REQUIRE(got.shape == w.shape);
    float worst = 0;
    for (int64_t i = 0; i < w.numel(); ++i)
      worst = std::max(worst, std::abs(got.as<float>()[i] - w.as<float>()[i]));
    CHECK(worst < 1e-5f);
  }
}

TEST_CASE("2 replicas x 2 pipeline devices train as one device on the same global batch") {
  const std::string mnist = std::string(STAGECRAFT_SAMPLES) + "/mnist_cnn.onnx";
  // One device: 4 microbatches of 4. Data parallel: each replica 2 microbatches of 4.
  const Trained one = train(options_for(mnist, "cross-entropy", 1, 1, 4, "gpipe"), 8);
  CHECK(one.losses.back() < one.losses.front());  // it learns
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1"}) {
    CAPTURE(schedule);
    check_same_training(one, train(options_for(mnist, "cross-entropy", 4, 2, 2, schedule), 8));
  }
}

/// Whether two runs end with the same bytes: losses and every weight.
bool bit_equal(const Trained& a, const Trained& b) {
  if (a.losses != b.losses || a.weights.size() != b.weights.size()) return false;
  for (const auto& [name, w] : a.weights)
    if (!same_bytes(w, b.weights.at(name))) return false;
  return true;
}

TEST_CASE("gradient buckets: several, overlapped with the backward, give one bucket's bits") {
  // Buckets of 1 KiB put mnist_cnn's weights (the largest 100 KiB and more) one a bucket, most
  // of them started inside the last backward; one bucket started at ALLREDUCE is the summing
  // as it was before buckets. 2 replicas: each element sums two terms, so any split of the
  // chunks gives the same bits.
  const std::string mnist = std::string(STAGECRAFT_SAMPLES) + "/mnist_cnn.onnx";
  const Trained one = train(options_for(mnist, "cross-entropy", 1, 1, 4, "gpipe"), 4);
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1", "interleaved"}) {
    CAPTURE(schedule);
    const plan::PlanOptions o = options_for(mnist, "cross-entropy", 4, 2, 2, schedule);
    const Trained whole = train(o, 4, int64_t{1} << 40, false);
    const Trained small = train(o, 4, 1024, true);
    CHECK(bit_equal(whole, small));
    CHECK(bit_equal(whole, train(o, 4, 1024, false)));
    CHECK(bit_equal(whole, train(o, 4, int64_t{1} << 40, true)));
    check_same_training(one, small);
  }
}

TEST_CASE("a gradient bucket of no bytes is refused") {
  const std::string mnist = std::string(STAGECRAFT_SAMPLES) + "/mnist_cnn.onnx";
  const plan::PlanOptions o = options_for(mnist, "cross-entropy", 4, 2, 2, "1f1b");
  try {
    train(o, 1, 0);
    FAIL("a bucket of 0 bytes ran");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("gradient bucket must hold at least one byte, not 0") !=
          std::string::npos);
  }
}

TEST_CASE("data parallelism with a weight two stages share: both sums, one device's result") {
  testing::TempDir dir;
  const std::string chain = dir.file("shared_chain.onnx");
  samples::build_shared_chain().write(chain);
  const Trained one = train(options_for(chain, "mse", 1, 1, 4, "gpipe"), 6);
  for (const char* schedule : {"gpipe", "1f1b"}) {
    CAPTURE(schedule);
    check_same_training(one, train(options_for(chain, "mse", 4, 2, 2, schedule), 6));
  }
}

TEST_CASE("4 replicas of one device: the ring's chunk order, one device's result") {
  const std::string mnist = std::string(STAGECRAFT_SAMPLES) + "/mnist_cnn.onnx";
  const Trained one = train(options_for(mnist, "cross-entropy", 1, 1, 4, "1f1b"), 5);
  check_same_training(one, train(options_for(mnist, "cross-entropy", 4, 4, 1, "1f1b"), 5));
  // Several buckets: each its own chunks, so other roundings than one bucket, still within.
  check_same_training(one,
                      train(options_for(mnist, "cross-entropy", 4, 4, 1, "1f1b"), 5, 4096));
}

TEST_CASE("data-parallel inference gives one device's outputs, bit for bit") {
  plan::PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/mnist_cnn.onnx";
  o.batch = 16;
  o.microbatches = 2;
  o.device_spec = "cpu";
  auto outputs = [&](int devices, int replicas) {
    testing::TempDir dir;
    plan::PlanOptions p = o;
    p.devices = devices;
    p.data_parallel = replicas;
    p.microbatches = 4 / replicas;
    plan::PlannedModel planned = plan::make_plan(p);
    plan::write_plan(planned, dir.file("plan"));
    auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
    RunOptions options;
    std::map<std::string, Tensor> out =
        pipeline->run(pipeline->synthetic_inputs(), options).outputs;
    for (auto& [name, t] : out) t = clone(t);
    return out;
  };
  auto one = outputs(1, 1), replicated = outputs(4, 2);
  REQUIRE(one.size() == replicated.size());
  for (const auto& [name, t] : one) {
    CAPTURE(name);
    CHECK(t.shape == replicated.at(name).shape);
    CHECK(same_bytes(t, replicated.at(name)));
  }
}

TEST_CASE("a checkpoint of 2 replicas resumes on 1 (and the other way), as one device goes on") {
  const std::string mnist = std::string(STAGECRAFT_SAMPLES) + "/mnist_cnn.onnx";
  testing::TempDir dir;
  auto load = [&](const plan::PlanOptions& o, const std::string& name) {
    return testing::load_plan(o, dir.file(name));
  };
  auto replicated = load(options_for(mnist, "cross-entropy", 4, 2, 2, "1f1b"), "dp");
  // The same split (the all-reduce's time may tip the planner's choice): the same stage files.
  plan::PlanOptions pipelined = options_for(mnist, "cross-entropy", 2, 1, 4, "1f1b");
  pipelined.split_after = replicated->plan().predicted.split_after;
  auto single = load(pipelined, "pp");
  RunOptions three;
  three.steps = 3;
  // 3 steps on 2 replicas, then 3 on one pipeline from the checkpoint ...
  replicated->run(replicated->synthetic_inputs(), three);
  save_checkpoint(*replicated, dir.file("ckpt"));
  load_checkpoint(*single, dir.file("ckpt"));
  std::vector<double> resumed = single->run(single->synthetic_inputs(), three).losses;
  // ... against 6 on one pipeline.
  auto reference = load(pipelined, "ref");
  RunOptions six;
  six.steps = 6;
  std::vector<double> straight = reference->run(reference->synthetic_inputs(), six).losses;
  for (size_t k = 0; k < 3; ++k) CHECK(std::abs(resumed[k] - straight[k + 3]) < 1e-5);
  // And back: the 2 replicas restore the one pipeline's checkpoint into both.
  save_checkpoint(*single, dir.file("ckpt"));
  load_checkpoint(*replicated, dir.file("ckpt"));
  for (const plan::Stage& stage : replicated->plan().stages)
    for (const auto& [name, t] : replicated->replica_weights(1, stage.index))
      CHECK(same_bytes(t, single->stage_weights(stage.index).at(name)));
}

}  // namespace
}  // namespace stagecraft::rt
