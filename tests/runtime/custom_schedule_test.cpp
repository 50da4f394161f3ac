// Custom schedules from torch.distributed.pipelining's CSV (stagec --schedule-csv): a built-in
// schedule written as CSV and planned back runs the identical instruction list and trains to
// the identical losses; an order none of the built-ins has (every forward first on the first
// device, 1F1B on the second) plans, is simulated and trains to the 1-device losses.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>

#include "compiler/plan/planner.h"
#include "compiler/schedule/torch_csv.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

struct Trained {
  plan::PlannedModel planned;
  std::vector<double> losses;
};

Trained train(const plan::PlanOptions& o, const std::string& dir) {
  Trained out{plan::make_plan(o), {}};
  plan::write_plan(out.planned, dir);
  auto pipeline = Pipeline::load(dir, cpu_backend(), 1);
  RunOptions run;
  run.steps = 3;
  out.losses = pipeline->run(pipeline->synthetic_inputs(), run).losses;
  return out;
}

plan::PlanOptions gpt(int devices, const std::string& schedule) {
  plan::PlanOptions o = testing::training_options(
      std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx", devices, schedule, "cross-entropy");
  o.dims["seq"] = 8;
  // See shared_weights_test.cpp: a small epsilon keeps runs that sum microbatches in another
  // order within 1e-5.
  o.training_config.epsilon = 1e-3;
  return o;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST_CASE("a built-in schedule as torch's CSV plans back to the same instructions and losses") {
  testing::TempDir dir;
  for (const std::string kind : {"1f1b", "zb-h1", "interleaved"}) {
    CAPTURE(kind);
    plan::PlanOptions o = gpt(2, kind);
    if (kind == "interleaved") o.chunks = 2;
    const Trained builtin = train(o, dir.file(kind));
    const std::string csv = dir.file(kind + ".csv");
    write(csv, schedule::to_torch_csv(builtin.planned.schedule,
                                      schedule::TorchCsvForm::kComputeOnly));
    plan::PlanOptions custom = gpt(2, kind);
    custom.schedule.reset();
    custom.schedule_csv = csv;
    custom.microbatches = 0;  // the file's
    custom.split_after = {};
    // The same cuts, so the two plans differ in nothing but the schedule's name.
    for (size_t k = 0; k + 1 < builtin.planned.plan.stages.size(); ++k)
      custom.split_after.push_back(builtin.planned.plan.stages[k].nodes.back());
    const Trained again = train(custom, dir.file(kind + "-custom"));
    CHECK(again.planned.plan.schedule == ScheduleKind::kCustom);
    CHECK(again.planned.plan.chunks == builtin.planned.plan.chunks);
    CHECK(again.planned.schedule == builtin.planned.schedule);
    CHECK(again.losses == builtin.losses);
    // The planner predicts the custom order as it predicts the built-in one.
    CHECK(again.planned.plan.predicted.step_ms == doctest::Approx(builtin.planned.plan.predicted.step_ms));
    CHECK(again.planned.plan.predicted.peak_memory_bytes ==
          builtin.planned.plan.predicted.peak_memory_bytes);
  }
}

TEST_CASE("an order of the user's own plans, simulates and trains to one device's losses") {
  testing::TempDir dir;
  const std::vector<double> one = train(gpt(1, "gpipe"), dir.file("one")).losses;
  // Device 0 runs every forward before any backward (GPipe), device 1 one forward and one
  // backward in turn (1F1B): no built-in schedule does both.
  const std::string csv = dir.file("mixed.csv");
  write(csv, "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n");
  plan::PlanOptions o = gpt(2, "1f1b");
  o.schedule.reset();
  o.schedule_csv = csv;
  o.microbatches = 0;
  const Trained mixed = train(o, dir.file("mixed"));
  CHECK(mixed.planned.plan.schedule == ScheduleKind::kCustom);
  CHECK(mixed.planned.plan.microbatches == 4);
  CHECK(mixed.planned.plan.predicted.step_ms > 0);
  REQUIRE(mixed.losses.size() == one.size());
  for (size_t k = 0; k < one.size(); ++k) {
    CAPTURE(k);
    CHECK(std::fabs(mixed.losses[k] - one[k]) <= 1e-5 * std::max(1.0, std::fabs(one[k])));
  }
  // Device 0 holds all 4 microbatches at once, as GPipe's; device 1 one, as 1F1B's last.
  REQUIRE(mixed.planned.plan.stages.size() == 2);
  CHECK(mixed.planned.plan.stages[0].in_flight == 4);
  CHECK(mixed.planned.plan.stages[1].in_flight == 1);
}

TEST_CASE("--schedule-csv is refused with another schedule, a shape it does not fit, or no file") {
  testing::TempDir dir;
  const std::string csv = dir.file("s.csv");
  write(csv, "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  auto refusal = [](const plan::PlanOptions& o) -> std::string {
    try {
      plan::make_plan(o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  plan::PlanOptions o = gpt(2, "gpipe");
  o.schedule_csv = csv;
  CHECK(refusal(o).find("--schedule gpipe and --schedule-csv: give one of them") !=
        std::string::npos);
  o.schedule.reset();
  o.microbatches = 4;
  CHECK(refusal(o).find("the schedule has 2 microbatches but the plan has 4 (--microbatches)") !=
        std::string::npos);
  o = gpt(3, "1f1b");
  o.schedule.reset();
  o.microbatches = 0;
  o.schedule_csv = csv;
  CHECK(refusal(o).find("the schedule has 2 ranks but the plan has 3") != std::string::npos);
  o.schedule_csv = dir.file("absent.csv");
  CHECK(refusal(o).find("absent.csv: no such file") != std::string::npos);
}

}  // namespace
}  // namespace stagecraft::rt
