// DualPipeV in whole plans (issue 34): the V placement in plan.json, and training on 1, 2
// and 4 devices (two chunks each, M >= 2P, the overlapped forward and backward run back to
// back) to the losses of the same model on one device within 1e-5, with the measured peak
// under the predicted one on 1 and 2 devices.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

constexpr int kSteps = 10;

plan::PlanOptions options(const std::string& model, int devices, const std::string& schedule,
                          int microbatches) {
  plan::PlanOptions o = testing::training_options(std::string(STAGECRAFT_SAMPLES) + "/" + model,
                                                  devices, schedule, "cross-entropy");
  o.microbatches = microbatches;
  if (model == "gpt_tiny.onnx") o.dims["seq"] = 8;
  // See shared_weights_test.cpp: Adam's default epsilon turns last-bit differences in
  // near-zero gradients into whole updates; 1e-3 keeps equal runs within 1e-5.
  o.training_config.epsilon = 1e-3;
  return o;
}

TEST_CASE("a dualpipev plan puts stages i and 2P-1-i on device i") {
  plan::PlannedModel planned = plan::make_plan(options("gpt_tiny.onnx", 4, "dualpipev", 8));
  REQUIRE(planned.plan.stages.size() == 8);
  CHECK(planned.plan.chunks == 2);
  const int expected[] = {0, 1, 2, 3, 3, 2, 1, 0};
  for (const plan::Stage& stage : planned.plan.stages) {
    CAPTURE(stage.index);
    CHECK(stage.device == expected[stage.index]);
    CHECK(stage.chunk == stage.index / 4);
  }
  CHECK(planned.plan.schedule == ScheduleKind::kDualPipeV);
}

TEST_CASE("dualpipev trains to the 1-device losses on 1, 2 and 4 devices") {
  for (const std::string model : {"gpt_tiny.onnx", "mnist_cnn.onnx"}) {
    for (int microbatches : {4, 8}) {
      const std::vector<double> reference = [&] {
        testing::TempDir dir;
        return testing::train_losses(options(model, 1, "gpipe", microbatches), kSteps,
                                     dir.file("plan"));
      }();
      REQUIRE(reference.size() == static_cast<size_t>(kSteps));
      CHECK(reference.back() < reference.front());  // it learns
      for (int devices : {1, 2, 4}) {
        if (2 * devices > microbatches) continue;  // dualpipev needs M >= 2P
        CAPTURE(model);
        CAPTURE(microbatches);
        CAPTURE(devices);
        testing::TempDir dir;
        auto pipeline = testing::load_plan(options(model, devices, "dualpipev", microbatches),
                                           dir.file("plan"));
        RunOptions run;
        run.steps = kSteps;
        RunReport report = pipeline->run(pipeline->synthetic_inputs(), run);
        REQUIRE(report.losses.size() == reference.size());
        for (size_t k = 0; k < reference.size(); ++k) {
          CAPTURE(k);
          CHECK(std::fabs(report.losses[k] - reference[k]) <=
                1e-5 * std::max(1.0, std::fabs(reference[k])));
        }
        for (size_t device = 0; device < report.devices.size(); ++device) {
          const DeviceReport& d = report.devices[device];
          CAPTURE(device);
          CAPTURE(d.peak_bytes);
          CAPTURE(d.predicted_peak_bytes);
          // As attention_pipeline_test.cpp: the predicted peak is a bound on 1 and 2 devices
          // (4 KiB: what the runtime counts at a moment the simulation does not); on 4 it is not
          // yet one for any schedule (issue 33), so it is only reported there.
          if (devices <= 2) {
            CHECK(d.peak_bytes <= d.predicted_peak_bytes + 4096);
          } else if (d.peak_bytes > d.predicted_peak_bytes + 4096) {
            MESSAGE(fmt::format("{}, M={}, 4 devices: device {} measured {} B, predicted {} B",
                                model, microbatches, device, d.peak_bytes, d.predicted_peak_bytes));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace stagecraft::rt
