// Activation recomputation: a stage that keeps only its inputs per microbatch and re-runs its
// forward before the backward trains exactly as one that keeps everything, with less memory,
// and the plan predicts that memory.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

plan::PlanOptions gpt_training(const std::string& schedule, const std::string& recompute, int64_t seq) {
  plan::PlanOptions o = testing::training_options(
      std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx", 2, schedule, "cross-entropy");
  o.dims["seq"] = seq;
  o.recompute = stagecraft::parse_recompute(recompute);
  return o;
}

struct Trained {
  plan::Plan plan;
  RunReport report;
};

Trained train(const plan::PlanOptions& o, int steps) {
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, dir.file("plan"));
  auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
  RunOptions options;
  options.steps = steps;
  return {planned.plan, pipeline->run(pipeline->synthetic_inputs(), options)};
}

TEST_CASE("recomputation gives the same loss curve under every schedule") {
  for (std::string sched : {"1f1b", "zb-h1", "gpipe", "interleaved"}) {
    CAPTURE(sched);
    plan::PlanOptions none = gpt_training(sched, "none", 8), all = gpt_training(sched, "all", 8);
    if (sched == "interleaved") none.chunks = all.chunks = 2;  // two stages per device
    Trained plain = train(none, 8);
    Trained again = train(all, 8);
    for (const plan::Stage& st : again.plan.stages) CHECK(st.recompute);
    REQUIRE(plain.report.losses.size() == 8);
    REQUIRE(again.report.losses.size() == 8);
    CHECK(plain.report.losses.back() < plain.report.losses.front());
    for (size_t k = 0; k < plain.report.losses.size(); ++k) {
      CAPTURE(k);
      CHECK(std::fabs(again.report.losses[k] - plain.report.losses[k]) <=
            1e-6 * std::max(1.0, std::fabs(plain.report.losses[k])));
    }
    // Each backward is preceded by a forward re-run (ZB-H1: each B and each W): twice (three
    // times) the forwards of the plain run.
    auto forwards = [](const RunReport& r) {
      return std::count_if(r.events.begin(), r.events.end(), [](const schedule::TimelineEvent& e) {
        return e.op == schedule::Op::kForward;
      });
    };
    CHECK(forwards(again.report) == (sched == "zb-h1" ? 3 : 2) * forwards(plain.report));
  }
}

// The bound every measured-peak test holds (issue 32): never over the prediction by more than
// the allocator's slack, and at most 20% under it. The prediction is an upper bound where the
// run's order is timing's choice: the gradients a stage receives for what it sent queue up to
// what the link holds (candidates.cpp, output_buffer_bytes), and a stage that sends two tensors
// (the planner's interleaved split of gpt_tiny with fused attention cuts after c_fc, sending
// the residual and the MLP's input) holds fewer of them at its peak than that bound: measured
// 11% under.
TEST_CASE("recomputation lowers the measured peak per device, within the plan's bound") {
  for (std::string sched : {"1f1b", "gpipe", "zb-h1", "interleaved"}) {
    CAPTURE(sched);
    plan::PlanOptions none = gpt_training(sched, "none", 32), all = gpt_training(sched, "all", 32);
    if (sched == "interleaved") none.chunks = all.chunks = 2;
    Trained plain = train(none, 2);
    Trained again = train(all, 2);
    REQUIRE(plain.report.devices.size() == 2);
    REQUIRE(again.report.devices.size() == 2);
    for (size_t d = 0; d < 2; ++d) {
      const DeviceReport& p = plain.report.devices[d];
      const DeviceReport& r = again.report.devices[d];
      CAPTURE(d);
      CAPTURE(p.peak_bytes);
      CAPTURE(p.predicted_peak_bytes);
      CAPTURE(r.peak_bytes);
      CAPTURE(r.predicted_peak_bytes);
      MESSAGE(fmt::format("{} device {}: peak {} (predicted {}) without recomputation, {} (predicted {}) with",
                          sched, d, p.peak_bytes, p.predicted_peak_bytes, r.peak_bytes,
                          r.predicted_peak_bytes));
      // Lower wherever more than one microbatch is in flight: everywhere under gpipe and zb-h1
      // (whose deferred W keeps several on the last device), on the first device under 1f1b
      // (its last holds one microbatch, so recomputation only adds its inputs and the forward
      // arena there).
      if (d == 0 || sched != "1f1b") {
        CHECK(r.peak_bytes < p.peak_bytes);
        CHECK(r.predicted_peak_bytes < p.predicted_peak_bytes);
      }
      CHECK(r.peak_bytes <= r.predicted_peak_bytes + 4096);
      CHECK(static_cast<double>(r.peak_bytes) >= 0.80 * static_cast<double>(r.predicted_peak_bytes));
    }
  }
}

}  // namespace
}  // namespace stagecraft::rt
