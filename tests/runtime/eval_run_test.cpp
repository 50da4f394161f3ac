// A forward-only run of a training plan (RunOptions::forward_only, stagerun's held-out
// evaluation): its loss is a training step's forward loss; it changes no weight, optimizer
// state, step count or later training loss; every schedule and data-parallel replicas give one
// device's loss; its memory stays within the training's prediction; an inference plan is refused.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

// `devices`: every replica's (R x P).
plan::PlanOptions gpt(int devices, const std::string& schedule, int replicas = 1) {
  plan::PlanOptions o = testing::training_options(std::string(STAGECRAFT_SAMPLES) +
                                                      "/gpt_tiny.onnx",
                                                  devices, schedule, "cross-entropy");
  o.dims["seq"] = 8;
  o.data_parallel = replicas;
  if (o.schedule == ScheduleKind::kInterleaved) o.chunks = 2;
  return o;
}

RunOptions forward_only() {
  RunOptions o;
  o.forward_only = true;
  return o;
}

// Every weight of every stage (replica 0), as bytes.
std::map<std::string, std::string> weights(const Pipeline& p) {
  std::map<std::string, std::string> out;
  for (size_t s = 0; s < p.plan().stages.size(); ++s)
    for (const auto& [name, t] : p.stage_weights(static_cast<int>(s)))
      out[fmt::format("{}/{}", s, name)] =
          std::string(reinterpret_cast<const char*>(t.data), static_cast<size_t>(t.bytes()));
  return out;
}

TEST_CASE("a forward-only run gives the next training step's loss and changes nothing") {
  testing::TempDir dir;
  auto p = testing::load_plan(gpt(2, "1f1b"), dir.file("plan"));
  auto again = testing::load_plan(gpt(2, "1f1b"), dir.file("plan2"));
  const auto inputs = p->synthetic_inputs();
  RunOptions step;
  std::vector<double> evaluated, trained, plain;
  for (int s = 0; s < 3; ++s) {
    const auto before = weights(*p);
    const RunReport eval = p->run(inputs, forward_only());
    REQUIRE(eval.losses.size() == 1);
    evaluated.push_back(eval.losses[0]);
    CHECK(weights(*p) == before);
    CHECK(p->steps_done() == s);
    // The memory a forward keeps is within the training's prediction.
    for (const DeviceReport& d : eval.devices) CHECK(d.peak_bytes <= d.predicted_peak_bytes);
    trained.push_back(p->run(inputs, step).losses.at(0));
    plain.push_back(again->run(inputs, step).losses.at(0));
  }
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    CHECK(std::fabs(evaluated[s] - trained[s]) <= 1e-6);
  }
  CHECK(trained[2] < trained[0]);  // it learns: the evaluations saw moving weights
  // The evaluations between the steps changed no training loss and no weight, bit for bit.
  CHECK(trained == plain);
  CHECK(weights(*p) == weights(*again));
  CHECK(p->steps_done() == 3);
}

TEST_CASE("a forward-only run gives one device's loss on every schedule and with replicas") {
  testing::TempDir dir;
  auto one = testing::load_plan(gpt(1, "gpipe"), dir.file("one"));
  const auto inputs = one->synthetic_inputs();
  const double reference = one->run(inputs, forward_only()).losses.at(0);
  CHECK(std::isfinite(reference));
  struct Case {
    int devices;
    std::string schedule;
    int replicas;
  };
  for (const Case& c : {Case{2, "gpipe", 1}, Case{2, "1f1b", 1}, Case{2, "interleaved", 1},
                        Case{3, "zb-h1", 1}, Case{2, "zb-v", 1}, Case{4, "1f1b", 2},
                        Case{2, "gpipe", 2}}) {
    const std::string name = fmt::format("{}x{}_{}", c.replicas, c.devices, c.schedule);
    CAPTURE(name);
    auto p = testing::load_plan(gpt(c.devices, c.schedule, c.replicas), dir.file(name));
    const RunReport r = p->run(inputs, forward_only());
    REQUIRE(r.losses.size() == 1);
    CHECK(std::fabs(r.losses[0] - reference) <= 1e-5);
    CHECK(p->steps_done() == 0);
    for (const DeviceReport& d : r.devices) CHECK(d.peak_bytes <= d.predicted_peak_bytes);
  }
  // Recomputation: the forward keeps nothing either way.
  plan::PlanOptions rc = gpt(2, "1f1b");
  rc.recompute = stagecraft::Recompute::kAll;
  auto p = testing::load_plan(rc, dir.file("recompute"));
  CHECK(std::fabs(p->run(inputs, forward_only()).losses.at(0) - reference) <= 1e-5);
}

TEST_CASE("a forward-only run of an inference plan is refused") {
  testing::TempDir dir;
  plan::PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx";
  o.devices = 2;
  o.batch = 8;
  o.microbatches = 4;
  o.dims["seq"] = 8;
  o.device_spec = "cpu";
  auto p = testing::load_plan(o, dir.file("inference"));
  try {
    p->run(p->synthetic_inputs(), forward_only());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
    CHECK(std::string(e.what()).find("inference plan") != std::string::npos);
  }
}

}  // namespace
}  // namespace stagecraft::rt
