// stagec --precision fp16 (issue 13): the stage graphs compute in float16 (the mixed-precision
// pass with PassContext::sixteen_bit float16), the CPU backend runs them widened to float32
// where a kernel has no float16 path, and training scales the loss dynamically
// (runtime/exec/run_types.h LossScale): an overflow anywhere skips the step on every stage and
// replica and halves the scale, clean steps double it, checkpoints keep it.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

using testing::load_plan;

plan::PlanOptions fp16_options(const std::string& file, const std::string& loss, int devices,
                               Precision precision) {
  plan::PlanOptions o = testing::training_options(std::string(STAGECRAFT_SAMPLES) + "/" + file,
                                                  devices, devices > 1 ? "1f1b" : "gpipe", loss);
  o.precision = precision;
  if (file == "gpt_tiny.onnx") o.dims["seq"] = 8;
  return o;
}

RunReport train(Pipeline& p, int steps) {
  RunOptions options;
  options.steps = steps;
  return p.run(p.synthetic_inputs(), options);
}

// Every replica's weights of every stage, copied.
std::vector<std::map<std::string, std::vector<std::byte>>> snapshot(const Pipeline& p) {
  std::vector<std::map<std::string, std::vector<std::byte>>> out;
  for (int r = 0; r < p.replicas(); ++r)
    for (const plan::Stage& st : p.plan().stages) {
      auto& copy = out.emplace_back();
      for (const auto& [name, t] : p.replica_weights(r, st.index))
        copy[name].assign(t.data, t.data + t.bytes());
    }
  return out;
}

TEST_CASE("the fp16 pass computes in float16: MatMul inputs and outputs, stage tensors") {
  plan::PlannedModel planned = plan::make_plan(
      fp16_options("gpt_tiny.onnx", "cross-entropy", 2, Precision::kFp16));
  CHECK(planned.plan.precision == Precision::kFp16);
  const ir::Graph& g = planned.model.graph;
  int matmuls = 0;
  for (const ir::Node& n : g.nodes()) {
    if (n.dead || n.op_type != "MatMul") continue;
    ++matmuls;
    for (ir::ValueId in : n.inputs) CHECK(g.value(in).dtype == DType::kFloat16);
    for (ir::ValueId out : n.outputs) CHECK(g.value(out).dtype == DType::kFloat16);
  }
  CHECK(matmuls > 0);
  for (const ir::Value& v : g.values()) CHECK(v.dtype != DType::kBFloat16);
  bool crossing = false;
  for (const plan::Stage& st : planned.plan.stages)
    for (const plan::StageTensor& t : st.outputs)
      if (!t.peer_stages.empty()) {
        crossing = true;
        CHECK(t.dtype == "float16");
      }
  CHECK(crossing);
}

TEST_CASE("an fp16 plan pipelined on 2 devices trains within fp16's precision of fp32") {
  // float16 keeps 11 significant bits (a relative rounding of 2^-12) on every activation,
  // weight copy and gradient; over 10 Adam steps at lr 0.01 the loss differs from fp32's by
  // far less than bfloat16's (measured 2026-11-26: toy 6.4e-5, gpt_tiny 3.5e-4 relative):
  // 2e-3 leaves room and still fails a run that learns differently.
  struct Sample {
    std::string file, loss;
  };
  for (const Sample& m : {Sample{"toy.onnx", "mse"}, Sample{"gpt_tiny.onnx", "cross-entropy"}}) {
    CAPTURE(m.file);
    testing::TempDir dir;
    auto fp32 = load_plan(fp16_options(m.file, m.loss, 1, Precision::kFp32), dir.file("fp32"));
    auto fp16 = load_plan(fp16_options(m.file, m.loss, 2, Precision::kFp16), dir.file("fp16"));
    CHECK(fp16->scales_loss());
    CHECK_FALSE(fp32->scales_loss());
    const RunReport a = train(*fp32, 10), b = train(*fp16, 10);
    CHECK(a.loss_scale.empty());
    REQUIRE(b.losses.size() == a.losses.size());
    REQUIRE(b.loss_scale.size() == a.losses.size());
    CHECK(b.losses.back() < b.losses.front());  // it learns
    double worst = 0, differ = 0;
    for (size_t k = 0; k < a.losses.size(); ++k) {
      CAPTURE(k);
      CHECK(b.loss_scale[k] == 65536.0);  // the default 2^16 never overflows here
      CHECK_FALSE(b.skipped[k]);
      worst = std::max(worst, std::fabs(b.losses[k] - a.losses[k]) /
                                  std::max(1.0, std::fabs(a.losses[k])));
      differ += b.losses[k] != a.losses[k];
    }
    MESSAGE(fmt::format("{}: largest relative difference from fp32 {:.2e}", m.file, worst));
    CHECK(worst <= 2e-3);
    CHECK(differ > 0);  // the arithmetic is not fp32's
    CHECK(fp16->loss_scale().skipped == 0);
  }
}

TEST_CASE("an overflowing fp16 step is skipped on every stage and the loss scale halves") {
  // A scale of 2^60 seeds the loss gradient far above float16's largest value (65504): the
  // first float16 gradient is inf. Every stage (and replica) must then keep its weights.
  struct Case {
    int devices, replicas;
    bool shard;
  };
  for (const Case c : {Case{2, 1, false}, Case{2, 2, false}, Case{2, 2, true}}) {
    CAPTURE(c.devices);
    CAPTURE(c.replicas);
    CAPTURE(c.shard);
    testing::TempDir dir;
    plan::PlanOptions o = fp16_options("gpt_tiny.onnx", "cross-entropy", c.devices,
                                       Precision::kFp16);
    o.data_parallel = c.replicas;
    o.shard_optimizer = c.shard;
    auto p = load_plan(o, dir.file("plan"));
    train(*p, 1);  // a clean step first: the optimizer state exists and must not move either
    const auto before = snapshot(*p);
    std::vector<std::map<std::string, optim::OptimizerState>> states;
    for (const plan::Stage& st : p->plan().stages)
      states.push_back(p->whole_optimizer_state(st.index));
    p->loss_scale().scale = 0x1p60;
    const RunReport r = train(*p, 2);
    REQUIRE(r.skipped.size() == 2);
    CHECK(r.skipped[0]);
    CHECK(r.skipped[1]);
    CHECK(r.loss_scale[0] == 0x1p60);
    CHECK(r.loss_scale[1] == 0x1p59);
    CHECK(p->loss_scale().scale == 0x1p58);
    CHECK(p->loss_scale().skipped == 2);
    CHECK(p->loss_scale().clean_steps == 0);
    CHECK(p->steps_done() == 3);  // skipped steps still count
    CHECK(snapshot(*p) == before);  // bit for bit, every stage of every replica
    for (const plan::Stage& st : p->plan().stages) {
      const auto now = p->whole_optimizer_state(st.index);
      const auto& was = states[static_cast<size_t>(st.index)];
      REQUIRE(now.size() == was.size());
      for (const auto& [weight, state] : was)
        for (const auto& [key, t] : state.tensors) {
          const Tensor& u = now.at(weight).tensors.at(key);
          REQUIRE(u.bytes() == t.bytes());
          CHECK(std::memcmp(u.data, t.data, static_cast<size_t>(t.bytes())) == 0);
        }
    }
    // From a scale that fits, training goes on (and the weights move).
    p->loss_scale().scale = 1024;
    const RunReport clean = train(*p, 1);
    CHECK_FALSE(clean.skipped[0]);
    CHECK(snapshot(*p) != before);
  }
}

TEST_CASE("the fp16 loss scale doubles after N clean steps and a checkpoint keeps it") {
  testing::TempDir dir;
  auto p = load_plan(fp16_options("toy.onnx", "mse", 2, Precision::kFp16), dir.file("plan"));
  p->loss_scale().scale = 1024;
  p->loss_scale().window = 2;
  const RunReport r = train(*p, 5);
  CHECK(r.loss_scale == std::vector<double>{1024, 1024, 2048, 2048, 4096});
  CHECK(r.skipped == std::vector<bool>(5, false));
  CHECK(p->loss_scale().scale == 4096);
  CHECK(p->loss_scale().clean_steps == 1);
  save_checkpoint(*p, dir.file("ckpt"));
  nlohmann::json manifest;
  std::ifstream(dir.file("ckpt/manifest.json")) >> manifest;
  CHECK(manifest["version"] == kCheckpointVersion);
  CHECK(manifest["loss_scale"]["scale"] == 4096.0);
  CHECK(manifest["loss_scale"]["clean_steps"] == 1);

  // Resumed: the scale and the count go on from the checkpoint, not from the defaults, and
  // the run continues as the uninterrupted one does.
  auto resumed = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
  resumed->loss_scale().window = 2;
  CHECK(resumed->loss_scale().scale == 65536);
  load_checkpoint(*resumed, dir.file("ckpt"));
  CHECK(resumed->loss_scale().scale == 4096);
  CHECK(resumed->loss_scale().clean_steps == 1);
  const RunReport go_on = train(*p, 2), again = train(*resumed, 2);
  CHECK(again.loss_scale == std::vector<double>{4096, 8192});
  CHECK(again.loss_scale == go_on.loss_scale);
  CHECK(again.losses == go_on.losses);

  // A damaged loss_scale is refused, naming the field.
  manifest["loss_scale"]["scale"] = -1.0;
  std::ofstream(dir.file("ckpt/manifest.json")) << manifest.dump();
  try {
    load_checkpoint(*resumed, dir.file("ckpt"));
    FAIL("a negative saved scale was accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("loss_scale.scale") != std::string::npos);
  }
}

TEST_CASE("bad loss scales are refused naming the flag") {
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    CAPTURE(bad);
    try {
      LossScale::check_scale(bad, "--loss-scale");
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kUsage);
      CHECK(std::string(e.what()).find("--loss-scale must be a finite number above 0") !=
            std::string::npos);
    }
  }
  CHECK_NOTHROW(LossScale::check_scale(0.5, "--loss-scale"));
  testing::TempDir dir;
  auto p = load_plan(fp16_options("toy.onnx", "mse", 1, Precision::kFp16), dir.file("plan"));
  p->loss_scale().scale = 0;
  CHECK_THROWS_AS(train(*p, 1), Error);
  p->loss_scale().scale = 8;
  p->loss_scale().window = 0;
  CHECK_THROWS_AS(train(*p, 1), Error);
}

}  // namespace
}  // namespace stagecraft::rt
