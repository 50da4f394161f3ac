// ZeRO-1 in one process (stagec --shard-optimizer, issue 14): each replica keeps 1/R of every
// stage's optimizer state, its gradients reduce-scattered and the updated weights all-gathered.
// Sharded training gives the unsharded run's losses and weights (bit for bit with 2 replicas,
// whose sums are the same two-term additions; within 1e-6 with 4, whose shards add in another
// rotation of the ring) for adam and momentum, with a weight two stages share too; each
// replica holds only its shard of the state; the plan predicts 1/R of the optimizer bytes; the
// validator refuses inconsistent boundaries; a sharded checkpoint holds the whole state and
// resumes on 1, 2 or 4 replicas as a straight run goes on.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

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

using testing::load_plan;

const std::string kMnist = std::string(STAGECRAFT_SAMPLES) + "/mnist_cnn.onnx";

plan::PlanOptions options_for(const std::string& model, OptimizerKind optimizer, int devices,
                              int replicas, int microbatches, bool shard) {
  plan::PlanOptions o;
  o.model_path = model;
  o.devices = devices;
  o.data_parallel = replicas;
  o.shard_optimizer = shard;
  o.batch = 16;
  o.microbatches = microbatches;
  o.training = true;
  o.schedule = ScheduleKind::k1F1B;
  o.optimizer = optimizer;
  o.training_config.lr = 0.001;
  o.training_config.epsilon = 1e-3;  // data_parallel_test.cpp says why
  o.loss.kind = "mse";
  o.device_spec = "cpu";
  return o;
}

struct Trained {
  std::vector<double> losses;
  std::map<std::string, Tensor> weights;  ///< Float weights by name, from the lowest holder.
  int replica_copies_differ = 0;          ///< Replica weights not the first replica's bytes.
  std::vector<int64_t> state_bytes;       ///< Per replica: optimizer state held, all stages.
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())) == 0;
}

Trained weights_of(const Pipeline& pipeline, std::vector<double> losses) {
  Trained out;
  out.losses = std::move(losses);
  for (const plan::Stage& stage : pipeline.plan().stages) {
    for (const auto& [name, t] : pipeline.stage_weights(stage.index))
      if (t.dtype == DType::kFloat32) out.weights.emplace(name, clone(t));
    for (int r = 1; r < pipeline.replicas(); ++r)
      for (const auto& [name, t] : pipeline.replica_weights(r, stage.index))
        if (!same_bytes(t, pipeline.stage_weights(stage.index).at(name)))
          ++out.replica_copies_differ;
  }
  return out;
}

/// `bucket_bytes` and `overlap`: RunOptions' (the gradient buckets summed over the replicas).
Trained train(const plan::PlanOptions& o, int steps,
              int64_t bucket_bytes = schedule::kDefaultGradientBucketBytes, bool overlap = true) {
  testing::TempDir dir;
  auto pipeline = load_plan(o, dir.file("plan"));
  RunOptions options;
  options.steps = steps;
  options.bucket_bytes = bucket_bytes;
  options.overlap_allreduce = overlap;
  std::vector<double> losses = pipeline->run(pipeline->synthetic_inputs(), options).losses;
  Trained out = weights_of(*pipeline, losses);
  // What each replica keeps of the state: the whole state's bytes over its stages' shards.
  const auto whole = [&](int stage) {
    int64_t bytes = 0;
    for (const auto& [name, state] : pipeline->whole_optimizer_state(stage)) bytes += state.bytes();
    return bytes;
  };
  int64_t all = 0;
  for (const plan::Stage& stage : pipeline->plan().stages) all += whole(stage.index);
  out.state_bytes.push_back(all);
  return out;
}

/// Largest difference of the losses and of the weights; `bit_equal` when none.
struct Difference {
  double loss = 0;
  float weight = 0;
  bool bit_equal = true;
};

Difference compare(const Trained& a, const Trained& b) {
  Difference d;
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t k = 0; k < a.losses.size(); ++k) {
    d.loss = std::max(d.loss, std::abs(a.losses[k] - b.losses[k]));
    d.bit_equal = d.bit_equal && a.losses[k] == b.losses[k];
  }
  REQUIRE(a.weights.size() == b.weights.size());
  for (const auto& [name, w] : a.weights) {
    const Tensor& got = b.weights.at(name);
    REQUIRE(got.shape == w.shape);
    for (int64_t i = 0; i < w.numel(); ++i)
      d.weight = std::max(d.weight, std::abs(got.as<float>()[i] - w.as<float>()[i]));
    d.bit_equal = d.bit_equal && same_bytes(got, w);
  }
  return d;
}

TEST_CASE("sharded training gives the unsharded run's losses and weights (adam, momentum)") {
  for (OptimizerKind optimizer : {OptimizerKind::kAdam, OptimizerKind::kMomentum}) {
    CAPTURE(to_string(optimizer));
    // 2 replicas x 2 devices: every sum is of two terms, the same bits in either order.
    const Trained plain = train(options_for(kMnist, optimizer, 4, 2, 2, false), 5);
    const Trained sharded = train(options_for(kMnist, optimizer, 4, 2, 2, true), 5);
    CHECK(plain.losses.back() < plain.losses.front());  // it learns
    CHECK(sharded.replica_copies_differ == 0);
    const Difference two = compare(plain, sharded);
    CHECK(two.bit_equal);
    // 4 replicas of one device: shard r adds the replicas from r + 1 round, the unsharded
    // chunk r from r: other roundings, within 1e-6.
    const Trained plain4 = train(options_for(kMnist, optimizer, 4, 4, 1, false), 5);
    const Trained sharded4 = train(options_for(kMnist, optimizer, 4, 4, 1, true), 5);
    CHECK(sharded4.replica_copies_differ == 0);
    const Difference four = compare(plain4, sharded4);
    CHECK(four.loss < 1e-6);
    CHECK(four.weight < 1e-6f);
    MESSAGE(fmt::format("{}: 2 replicas bit-equal {}; 4 replicas: losses within {:g}, weights "
                        "within {:g} (bit-equal {})",
                        to_string(optimizer), two.bit_equal, four.loss, four.weight,
                        four.bit_equal));
  }
}

TEST_CASE("sharded gradient buckets: several, overlapped, give the whole reduce-scatter's bits") {
  // Each bucket is reduce-scattered at the plan's shards cut to it: every element adds the
  // replicas in its shard's order whatever the buckets, so 1 KiB buckets (one weight each,
  // most started inside the last backward) give the bits of one bucket summed at ALLREDUCE,
  // with 2 and with 4 replicas.
  for (int replicas : {2, 4}) {
    CAPTURE(replicas);
    const plan::PlanOptions o =
        options_for(kMnist, OptimizerKind::kAdam, 4, replicas, 4 / replicas, true);
    const Trained whole = train(o, 4, int64_t{1} << 40, false);
    const Trained small = train(o, 4, 1024, true);
    CHECK(small.replica_copies_differ == 0);
    CHECK(compare(whole, small).bit_equal);
    if (replicas == 2)  // and the unsharded run's (two terms a sum: any order)
      CHECK(compare(train(options_for(kMnist, OptimizerKind::kAdam, 4, 2, 2, false), 4, 2048),
                    small)
                .bit_equal);
  }
}

TEST_CASE("a weight two stages share is summed whole beside the shards") {
  testing::TempDir dir;
  const std::string chain = dir.file("shared_chain.onnx");
  samples::build_shared_chain().write(chain);
  const Trained plain = train(options_for(chain, OptimizerKind::kAdam, 4, 2, 2, false), 5);
  const Trained sharded = train(options_for(chain, OptimizerKind::kAdam, 4, 2, 2, true), 5);
  CHECK(sharded.replica_copies_differ == 0);
  const Difference d = compare(plain, sharded);
  CHECK(d.loss < 1e-6);
  CHECK(d.weight < 1e-6f);
}

TEST_CASE("each replica keeps its shard of the state: the plan predicts 1/R of it") {
  testing::TempDir dir;
  auto plain =
      load_plan(options_for(kMnist, OptimizerKind::kAdam, 4, 2, 2, false), dir.file("plain"));
  auto sharded =
      load_plan(options_for(kMnist, OptimizerKind::kAdam, 4, 2, 2, true), dir.file("zero"));
  RunOptions options;
  options.steps = 2;
  sharded->run(sharded->synthetic_inputs(), options);
  plain->run(plain->synthetic_inputs(), options);
  const plan::Plan& p = sharded->plan();
  REQUIRE(p.shard_optimizer);
  for (const plan::Stage& stage : p.stages) {
    CAPTURE(stage.index);
    REQUIRE(stage.optimizer_shards.size() == 3);
    // The whole state put together is the unsharded run's size; each replica holds its part.
    int64_t whole = 0, unsharded = 0;
    for (const auto& [name, state] : sharded->whole_optimizer_state(stage.index))
      whole += state.bytes();
    for (const auto& [name, state] : plain->optimizer_state(stage.index)) unsharded += state.bytes();
    CHECK(whole == unsharded);
    const int64_t elements = stage.optimizer_shards.back();
    CHECK(unsharded == 8 * elements);  // adam: m and v of every sharded element (none shared)
    int64_t first = 0;
    for (const auto& [name, state] : sharded->optimizer_state(stage.index)) first += state.bytes();
    CHECK(first == 8 * (stage.optimizer_shards[1] - stage.optimizer_shards[0]));
  }
  // The memory anatomy: each device's optimizer state is 1/R of the unsharded plan's.
  const plan::Plan& q = plain->plan();
  REQUIRE(p.device_memory.size() == q.device_memory.size());
  for (size_t d = 0; d < p.device_memory.size(); ++d) {
    CAPTURE(d);
    const int64_t mine = p.device_memory[d].parts.optimizer, all = q.device_memory[d].parts.optimizer;
    CHECK(all > 0);
    CHECK(std::abs(2 * mine - all) <= 2 * 8);  // within one element's rounding per replica
    CHECK(p.device_memory[d].peak_bytes < q.device_memory[d].peak_bytes);
  }
  // The step counts the reduce-scatter and the all-gather.
  for (const plan::Stage& stage : p.stages) CHECK(stage.allgather_ms > 0);
}

TEST_CASE("--shard-optimizer needs training and 2 or more replicas: bad boundaries are refused") {
  auto refused = [](plan::PlanOptions o) {
    try {
      plan::make_plan(o);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kUsage);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string one = refused(options_for(kMnist, OptimizerKind::kAdam, 2, 1, 2, true));
  CHECK(one.find("--shard-optimizer") != std::string::npos);
  CHECK(one.find("--data-parallel 1") != std::string::npos);
  plan::PlanOptions inference = options_for(kMnist, OptimizerKind::kAdam, 4, 2, 2, true);
  inference.training = false;
  inference.schedule.reset();
  CHECK(refused(inference).find("--train") != std::string::npos);

  plan::PlannedModel planned = plan::make_plan(options_for(kMnist, OptimizerKind::kAdam, 4, 2, 2, true));
  const plan::Plan good = planned.plan;
  plan::validate_plan(good, "plan.json");
  auto why = [&](auto change) {
    plan::Plan bad = good;
    change(bad);
    try {
      plan::validate_plan(bad, "plan.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(why([](plan::Plan& p) { p.stages[0].optimizer_shards.pop_back(); })
            .find("stages[0].optimizer_shards' lists 2 boundaries; 2 replicas need 3") !=
        std::string::npos);
  CHECK(why([](plan::Plan& p) { std::swap(p.stages[0].optimizer_shards[1], p.stages[0].optimizer_shards[2]); })
            .find("less than the boundary before it") != std::string::npos);
  CHECK(why([](plan::Plan& p) { p.stages[1].optimizer_shards[0] = 1; })
            .find("the first shard starts at 0") != std::string::npos);
  CHECK(why([](plan::Plan& p) { p.stages[1].optimizer_shards[2] = p.stages[1].params + 1; })
            .find("more than the stage's") != std::string::npos);
  CHECK(why([](plan::Plan& p) { p.shard_optimizer = false; }).find("but shard_optimizer is false") !=
        std::string::npos);
  CHECK(why([](plan::Plan& p) {
          p.data_parallel = 1;
          p.batch /= 2;
          p.placement = plan::pipeline_major_placement(1, p.devices);
        })
            .find("sharding the optimizer state needs training with 2 or more") != std::string::npos);
}

TEST_CASE("the runtime refuses boundaries that do not end at the stage's trained elements") {
  testing::TempDir dir;
  load_plan(options_for(kMnist, OptimizerKind::kAdam, 4, 2, 2, true), dir.file("plan"));
  // Moving the last boundary by one (still within the stage's parameters) and re-hashing.
  const std::string path = dir.file("plan") + "/plan.json";
  nlohmann::json json = nlohmann::json::parse(testing::read_bytes(path));
  auto& bounds = json["stages"][1]["optimizer_shards"];
  bounds[2] = bounds[2].get<int64_t>() - 1;
  testing::write_bytes(path, plan::plan_json_text(nlohmann::ordered_json(json)));
  try {
    Pipeline::load(dir.file("plan"), cpu_backend(), 1);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("stages[1].optimizer_shards ends at") != std::string::npos);
  }
}

TEST_CASE("a sharded checkpoint holds the whole state and resumes on 1, 2 or 4 replicas") {
  testing::TempDir dir;
  // 3 steps sharded on 2 replicas x 2 devices, saved.
  auto sharded =
      load_plan(options_for(kMnist, OptimizerKind::kAdam, 4, 2, 2, true), dir.file("zero"));
  const std::vector<std::string> split = sharded->plan().predicted.split_after;
  auto same_split = [&](plan::PlanOptions o) {
    o.split_after = split;
    return o;
  };
  RunOptions three;
  three.steps = 3;
  sharded->run(sharded->synthetic_inputs(), three);
  save_checkpoint(*sharded, dir.file("ckpt"));
  // A straight run of 6 steps on one pipeline of 2 devices (the same global batch).
  auto reference = load_plan(same_split(options_for(kMnist, OptimizerKind::kAdam, 2, 1, 4, false)),
                             dir.file("ref"));
  RunOptions six;
  six.steps = 6;
  const std::vector<double> straight =
      reference->run(reference->synthetic_inputs(), six).losses;
  // The checkpoint holds every state tensor whole (the unsharded shapes).
  auto plain = load_plan(same_split(options_for(kMnist, OptimizerKind::kAdam, 2, 1, 4, false)),
                         dir.file("plain"));
  load_checkpoint(*plain, dir.file("ckpt"));
  for (const plan::Stage& stage : plain->plan().stages)
    for (const auto& [name, state] : plain->optimizer_state(stage.index))
      for (const auto& [key, t] : state.tensors) {
        CAPTURE(name);
        CHECK(t.shape == plain->stage_weights(stage.index).at(name).shape);
      }
  struct Resume {
    std::string what;
    plan::PlanOptions options;
  };
  for (const Resume& resume :
       {Resume{"1 replica", options_for(kMnist, OptimizerKind::kAdam, 2, 1, 4, false)},
        Resume{"2 replicas sharded", options_for(kMnist, OptimizerKind::kAdam, 4, 2, 2, true)},
        Resume{"4 replicas sharded", options_for(kMnist, OptimizerKind::kAdam, 8, 4, 1, true)},
        Resume{"4 replicas", options_for(kMnist, OptimizerKind::kAdam, 8, 4, 1, false)}}) {
    CAPTURE(resume.what);
    auto p = load_plan(same_split(resume.options), dir.file("resume"));
    CHECK(load_checkpoint(*p, dir.file("ckpt")) == 3);
    const std::vector<double> losses = p->run(p->synthetic_inputs(), three).losses;
    REQUIRE(losses.size() == 3);
    for (size_t k = 0; k < 3; ++k) {
      CAPTURE(k);
      CHECK(std::abs(losses[k] - straight[k + 3]) < 1e-6);
    }
  }
}

}  // namespace
}  // namespace stagecraft::rt
