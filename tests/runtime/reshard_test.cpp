// Checkpoints that outlive the plan (issue 35 item 5): a checkpoint of a model resumes on any
// training plan of it (other devices, cuts, schedule, chunks, replicas, ZeRO-1, precision), its
// weights and optimizer state found by name, and the run goes on as one device's straight run;
// what cannot carry over (another model or optimizer, a weight missing or of another shape, a
// weight the plan lacks) is refused in one line, changing nothing.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/tensor_io.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

namespace fs = std::filesystem;

const std::string kMnist = std::string(STAGECRAFT_SAMPLES) + "/mnist_cnn.onnx";

/// mnist_cnn trained with Adam on batch 16 (`replicas` x `microbatches` x b) over `devices`.
plan::PlanOptions mnist(int devices, int replicas, int microbatches, const std::string& schedule) {
  plan::PlanOptions o;
  o.model_path = kMnist;
  o.devices = devices;
  o.data_parallel = replicas;
  o.batch = 16;
  o.microbatches = microbatches;
  o.training = true;
  o.schedule = parse_schedule(schedule);
  if (o.schedule == ScheduleKind::kInterleaved) o.chunks = 2;
  o.optimizer = OptimizerKind::kAdam;
  o.training_config.lr = 0.01;
  o.training_config.lr_schedule = "cosine";  // the step count matters
  o.training_config.total_steps = 20;
  // Adam's default epsilon turns last-bit differences of near-zero gradients (another sum order
  // over replicas and microbatches) into whole updates; 1e-3 keeps them within 1e-5.
  o.training_config.epsilon = 1e-3;
  o.loss.kind = "cross-entropy";
  o.device_spec = "cpu";
  return o;
}

/// Every node of `p`'s plan, stage after stage.
std::vector<std::string> nodes_of(const Pipeline& p) {
  std::vector<std::string> nodes;
  for (const plan::Stage& s : p.plan().stages) nodes.insert(nodes.end(), s.nodes.begin(), s.nodes.end());
  return nodes;
}

/// `o` split into two stages per replica after another node than `a`'s first stage ends at: the
/// nearest node that plans.
plan::PlanOptions cut_elsewhere(plan::PlanOptions o, const Pipeline& a) {
  const std::vector<std::string> nodes = nodes_of(a);
  const auto at = static_cast<int>(a.plan().stages[0].nodes.size()) - 1;
  for (int d = 1; d < static_cast<int>(nodes.size()); ++d)
    for (int k : {at - d, at + d}) {
      if (k < 0 || k + 1 >= static_cast<int>(nodes.size())) continue;
      o.split_after = {nodes[static_cast<size_t>(k)]};
      try {
        plan::make_plan(o);
        return o;
      } catch (const Error&) {
      }
    }
  FAIL("no other cut plans");
  return o;
}

std::vector<double> run(Pipeline& p, int steps) {
  RunOptions options;
  options.steps = steps;
  return p.run(p.synthetic_inputs(), options).losses;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    CAPTURE(k);
    CHECK(std::abs(got[k] - want[k]) < 1e-5);
  }
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())) == 0;
}

/// Every float weight of `p`, by name, from the first stage that holds it.
std::map<std::string, Tensor> weights_of(const Pipeline& p) {
  std::map<std::string, Tensor> out;
  for (const plan::Stage& s : p.plan().stages)
    for (const auto& [name, t] : p.stage_weights(s.index))
      if (t.dtype == DType::kFloat32) out.emplace(name, clone(t));
  return out;
}

TEST_CASE("a checkpoint of 2 devices resumes on 2 replicas x 2 other stages, ZB-H1, ZeRO-1: "
          "and back") {
  testing::TempDir dir;
  const std::vector<double> straight =
      testing::train_losses(mnist(1, 1, 4, "1f1b"), 6, dir.file("one"));
  const plan::PlanOptions a_options = mnist(2, 1, 4, "1f1b");
  auto a = testing::load_plan(a_options, dir.file("a"));
  plan::PlanOptions b_options = cut_elsewhere(mnist(4, 2, 2, "zb-h1"), *a);
  b_options.shard_optimizer = true;
  auto b = testing::load_plan(b_options, dir.file("b"));
  REQUIRE(b->replicas() == 2);
  REQUIRE(b->plan().shard_optimizer);
  REQUIRE(b->plan().stages.size() == 2);
  CHECK(b->plan().stages[0].nodes != a->plan().stages[0].nodes);  // other cuts
  CHECK(b->plan().stages[0].file_hash != a->plan().stages[0].file_hash);

  SUBCASE("A to B") {
    std::vector<double> losses = run(*a, 3);
    save_checkpoint(*a, dir.file("ckpt"));
    CHECK(load_checkpoint(*b, dir.file("ckpt")) == 3);
    CHECK(b->steps_done() == 3);
    // Both replicas hold the weights A saved.
    const std::map<std::string, Tensor> saved = weights_of(*a);
    for (int r = 0; r < 2; ++r)
      for (const plan::Stage& s : b->plan().stages)
        for (const auto& [name, t] : b->replica_weights(r, s.index))
          if (t.dtype == DType::kFloat32) CHECK(same_bytes(t, saved.at(name)));
    for (double l : run(*b, 3)) losses.push_back(l);
    check_close(losses, straight);
  }
  SUBCASE("B to A") {
    std::vector<double> losses = run(*b, 3);
    save_checkpoint(*b, dir.file("ckpt"));
    CHECK(load_checkpoint(*a, dir.file("ckpt")) == 3);
    for (double l : run(*a, 3)) losses.push_back(l);
    check_close(losses, straight);
  }
  SUBCASE("A to interleaved and zb-v (2 chunks a device: 4 stages on 2 devices)") {
    std::vector<double> first = run(*a, 3);
    save_checkpoint(*a, dir.file("ckpt"));
    for (const char* schedule : {"interleaved", "zb-v"}) {
      CAPTURE(schedule);
      auto c = testing::load_plan(mnist(2, 1, 4, schedule), dir.file(schedule));
      REQUIRE(c->plan().stages.size() == 4);
      CHECK(load_checkpoint(*c, dir.file("ckpt")) == 3);
      std::vector<double> losses = first;
      for (double l : run(*c, 3)) losses.push_back(l);
      check_close(losses, straight);
    }
  }
}

TEST_CASE("a mixed-precision checkpoint resumes on fp32 plans of other layouts, and back") {
  testing::TempDir dir;
  plan::PlanOptions mixed_options = mnist(2, 1, 4, "1f1b");
  mixed_options.precision = Precision::kMixed;
  auto mixed = testing::load_plan(mixed_options, dir.file("mixed"));
  run(*mixed, 3);
  save_checkpoint(*mixed, dir.file("ckpt"));
  // The mixed plan's master weights are float32: all of them are in the checkpoint.
  const std::map<std::string, Tensor> masters = weights_of(*mixed);
  REQUIRE_FALSE(masters.empty());

  plan::PlanOptions b_options = cut_elsewhere(mnist(4, 2, 2, "zb-h1"), *mixed);
  b_options.shard_optimizer = true;
  auto b = testing::load_plan(b_options, dir.file("b"));
  CHECK(load_checkpoint(*b, dir.file("ckpt")) == 3);
  const std::map<std::string, Tensor> restored = weights_of(*b);
  CHECK(restored.size() == masters.size());
  for (const auto& [name, t] : restored) {
    CAPTURE(name);
    CHECK(same_bytes(t, masters.at(name)));
  }
  // It goes on as one fp32 device resumed from the same checkpoint.
  auto one = testing::load_plan(mnist(1, 1, 4, "1f1b"), dir.file("one"));
  CHECK(load_checkpoint(*one, dir.file("ckpt")) == 3);
  check_close(run(*b, 3), run(*one, 3));

  // And back: the fp32 plan's checkpoint into a fresh mixed plan.
  save_checkpoint(*b, dir.file("ckpt_b"));
  auto back = testing::load_plan(mixed_options, dir.file("mixed2"));
  CHECK(load_checkpoint(*back, dir.file("ckpt_b")) == 6);
  for (const auto& [name, t] : weights_of(*back)) {
    CAPTURE(name);
    CHECK(same_bytes(t, weights_of(*b).at(name)));
  }
}

TEST_CASE("the fp16 loss scale carries over to a plan of other cuts") {
  testing::TempDir dir;
  const std::string toy = std::string(STAGECRAFT_SAMPLES) + "/toy.onnx";
  plan::PlanOptions o = testing::training_options(toy, 2, "1f1b", "mse");
  o.precision = Precision::kFp16;
  auto p = testing::load_plan(o, dir.file("two"));
  p->loss_scale().scale = 1024;
  p->loss_scale().window = 2;
  run(*p, 3);
  REQUIRE(p->loss_scale().scale == 2048);
  save_checkpoint(*p, dir.file("ckpt"));
  o.devices = 3;
  auto q = testing::load_plan(o, dir.file("three"));
  REQUIRE(q->plan().stages.size() == 3);
  CHECK(q->loss_scale().scale != 2048);
  CHECK(load_checkpoint(*q, dir.file("ckpt")) == 3);
  CHECK(q->loss_scale().scale == 2048);
  CHECK(q->loss_scale().clean_steps == p->loss_scale().clean_steps);
}

/// Expects loading `ckpt` into a fresh pipeline of `plan_dir` to be refused in one line holding
/// `needle`, the pipeline unchanged.
void refused(const std::string& plan_dir, const std::string& ckpt, const std::string& needle) {
  auto q = Pipeline::load(plan_dir, cpu_backend(), 1);
  const std::map<std::string, Tensor> before = weights_of(*q);
  try {
    load_checkpoint(*q, ckpt);
    FAIL("no error");
  } catch (const Error& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find(needle) != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
  CHECK(q->steps_done() == 0);
  for (const auto& [name, t] : weights_of(*q)) CHECK(same_bytes(t, before.at(name)));
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST_CASE("what cannot carry over to another plan is refused, naming it") {
  testing::TempDir dir;
  auto a = testing::load_plan(mnist(2, 1, 4, "1f1b"), dir.file("a"));
  run(*a, 1);
  const std::string ckpt = dir.file("ckpt");
  save_checkpoint(*a, ckpt);
  const nlohmann::json manifest = read_json(ckpt + "/manifest.json");
  auto edit = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json m = manifest;
    change(m);
    std::ofstream(ckpt + "/manifest.json") << m.dump();
  };
  const std::string b_dir = dir.file("b");
  testing::load_plan(cut_elsewhere(mnist(4, 2, 2, "zb-h1"), *a), b_dir);

  // Another model.
  const std::string toy = dir.file("toy");
  testing::load_plan(testing::training_options(std::string(STAGECRAFT_SAMPLES) + "/toy.onnx", 2,
                                               "1f1b", "mse"),
                     toy);
  refused(toy, ckpt, "was written for another plan: model hash fnv1a64:");
  // Another optimizer.
  plan::PlanOptions sgd = mnist(4, 2, 2, "1f1b");
  sgd.optimizer = OptimizerKind::kMomentum;
  testing::load_plan(sgd, dir.file("sgd"));
  refused(dir.file("sgd"), ckpt, "was written for another plan: optimizer adam, this plan has momentum");
  // A weight of the plan missing from the checkpoint.
  std::string dropped;
  edit([&](nlohmann::json& m) {
    dropped = m["stages"][1]["weights"][0]["name"];
    m["stages"][1]["weights"].erase(0);
  });
  refused(b_dir, ckpt, fmt::format("field 'stages' lacks weight '{}' of the plan", dropped));
  // A weight of the checkpoint that no stage of the plan holds.
  edit([&](nlohmann::json& m) {
    m["stages"][0]["weights"].push_back(
        {{"name", "not.a.weight"}, {"file", "stage_0/w0000.npy"}, {"dtype", "float32"},
         {"shape", {1}}});
  });
  refused(b_dir, ckpt, "its weight 'not.a.weight' (stages[0]) is in no stage of this plan");
  // Optimizer state missing after a step.
  edit([](nlohmann::json& m) { m["stages"][1]["optimizer"] = nlohmann::json::array(); });
  refused(b_dir, ckpt, "field 'stages[1].optimizer' lacks state 'm' of weight '");
  // A weight of another shape.
  edit([](nlohmann::json&) {});
  const std::string first = manifest["stages"][0]["weights"][0]["file"];
  write_npy(ckpt + "/" + first, Tensor::owned(DType::kFloat32, {3}));
  refused(b_dir, ckpt, "is float32[3] but the plan's weight is float32[");
  // The checkpoint itself still loads into that plan (the refusals changed nothing on disk but
  // the damaged file): restored, it loads.
  write_npy(ckpt + "/" + first, a->stage_weights(0).at(manifest["stages"][0]["weights"][0]["name"].get<std::string>()));
  auto b = Pipeline::load(b_dir, cpu_backend(), 1);
  CHECK(load_checkpoint(*b, ckpt) == 1);
  // A top-level field this stagerun does not know (a later one's) is left alone.
  edit([](nlohmann::json& m) { m["data"] = {{"file", "tokens.bin"}, {"position", 12345}}; });
  auto c = Pipeline::load(b_dir, cpu_backend(), 1);
  CHECK(load_checkpoint(*c, ckpt) == 1);
}

}  // namespace
}  // namespace stagecraft::rt
