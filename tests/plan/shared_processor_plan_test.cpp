// Plans whose pipeline devices share processors (stagec --devices-per-processor): a longer
// predicted step than apart, the same plan as before with one device per processor, the
// mapping in plan.json, and the flag's refusals.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "compiler/plan/planner.h"
#include "runtime/format/error.h"
#include "tests/error_of.h"
#include "tests/test_util.h"

namespace stagecraft::plan {
namespace {

/// gpt_tiny training on `devices` CPU devices, 1F1B, 4 microbatches of 2 at length 16, as the
/// training tests plan it (tests/runtime/training_options.h).
PlanOptions gpt_training(int devices) {
  PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx";
  o.devices = devices;
  o.batch = 8;
  o.microbatches = 4;
  o.training = true;
  o.schedule = ScheduleKind::k1F1B;
  o.optimizer = OptimizerKind::kAdam;
  o.loss.kind = "cross-entropy";
  o.device_spec = "cpu";
  o.dims["seq"] = 16;
  return o;
}

TEST_CASE("devices that share a processor predict a longer step than devices apart") {
  PlanOptions apart_options = gpt_training(2);
  const Plan apart = make_plan(apart_options).plan;
  PlanOptions shared_options = gpt_training(2);
  shared_options.devices_per_processor = 2;
  const Plan shared = make_plan(shared_options).plan;
  CHECK(shared.cluster.devices_per_processor == 2);
  CHECK(shared.processors.processor_of == std::vector<int>{0, 0});
  CHECK(shared.predicted.step_ms > apart.predicted.step_ms);
  // Taking turns, the step is at least every device's compute together.
  double compute_ms = 0;
  for (double busy : shared.predicted.device_busy_ms) compute_ms += busy;
  CHECK(shared.predicted.step_ms >= compute_ms * (1 - 1e-9));
  // The same plan with each device on its own processor: what sharing costs.
  CHECK(shared.processors.separate_step_ms < shared.predicted.step_ms);
  CHECK(shared.processors.separate_step_ms > 0);
  CHECK_NOTHROW(validate_plan(shared, "plan.json"));
  const std::string line = describe_sharing(shared);
  CAPTURE(line);
  CHECK(
      line.starts_with("devices 0 and 1 share processor 0 (2 per processor, overlap 0): "
                       "predicted step "));
  CHECK(line.find("if each had its own (+") != std::string::npos);
  CHECK(summarize(shared).find(line) != std::string::npos);
  // An overlap factor between turns and apart.
  shared_options.processor_overlap = 0.5;
  const Plan half = make_plan(shared_options).plan;
  CHECK(half.predicted.step_ms < shared.predicted.step_ms);
  CHECK(half.processors.overlap == 0.5);
}

TEST_CASE("four devices on two processors: device d on processor d mod 2") {
  PlanOptions o = gpt_training(4);
  o.devices_per_processor = 2;
  const Plan p = make_plan(o).plan;
  CHECK(p.processors.processor_of == std::vector<int>{0, 1, 0, 1});
  CHECK(describe_sharing(p).starts_with(
      "devices 0 and 2 share processor 0, 1 and 3 share processor 1 (2 per processor"));
  // Three devices at two per processor: two processors, the second with one device.
  CHECK(processor_of_devices(3, 2) == std::vector<int>{0, 1, 0});
}

TEST_CASE("one device per processor plans as before") {
  PlanOptions o = gpt_training(2);
  const PlannedModel before = make_plan(o);
  o.devices_per_processor = 1;
  const PlannedModel given = make_plan(o);
  const Plan& a = before.plan;
  const Plan& b = given.plan;
  CHECK(a.predicted.step_ms == b.predicted.step_ms);
  CHECK(a.predicted.split_after == b.predicted.split_after);
  CHECK(a.processors.processor_of == std::vector<int>{0, 1});
  CHECK(a.cluster.devices_per_processor == 1);
  CHECK(a.processors.separate_step_ms == a.predicted.step_ms);
  CHECK(describe_sharing(a).empty());
  REQUIRE(a.timeline.size() == b.timeline.size());
  for (size_t i = 0; i < a.timeline.size(); ++i) {
    CHECK(a.timeline[i].start_s == b.timeline[i].start_s);
    CHECK(a.timeline[i].end_s == b.timeline[i].end_s);
  }
}

TEST_CASE("plan.json keeps the processors, and its validator refuses a mapping that is not K's") {
  testing::TempDir dir;
  PlanOptions o = gpt_training(2);
  o.devices_per_processor = 2;
  o.processor_overlap = 0.25;
  PlannedModel planned = make_plan(o);
  write_plan(planned, dir.file("plan"));
  const Plan loaded = load_plan(dir.file("plan"));
  CHECK(loaded.cluster.devices_per_processor == 2);
  CHECK(loaded.processors.processor_of == planned.plan.processors.processor_of);
  CHECK(loaded.processors.overlap == 0.25);
  CHECK(loaded.processors.separate_step_ms == planned.plan.processors.separate_step_ms);
  CHECK(to_json(loaded) == to_json(planned.plan));
  Plan bad = planned.plan;
  bad.processors.processor_of = {0, 1};
  CHECK(testing::error_of(ErrorKind::kPlan, [&] { validate_plan(bad, "plan.json"); }) ==
        "plan.json: field 'processors.processor_of' is [0, 1]; 2 devices at 2 per processor run "
        "on [0, 0] (device d on processor d mod 1)");
  bad = planned.plan;
  bad.cluster.devices_per_processor = 3;
  CHECK(testing::error_of(ErrorKind::kPlan, [&] { validate_plan(bad, "plan.json"); }) ==
        "plan.json: field 'cluster.devices_per_processor' is 3; it must be from 1 to the "
        "pipeline's 2 devices");
  bad = planned.plan;
  bad.processors.overlap = 1;
  CHECK(testing::error_of(ErrorKind::kPlan, [&] { validate_plan(bad, "plan.json"); }) ==
        "plan.json: field 'processors.overlap' is 1; it must be in [0, 1)");
}

TEST_CASE("bad --devices-per-processor and --processor-overlap values are one-line usage errors") {
  auto refused = [](int k, double overlap, int replicas = 1) {
    PlanOptions o = gpt_training(4);
    o.devices_per_processor = k;
    o.processor_overlap = overlap;
    o.data_parallel = replicas;
    return testing::error_of(ErrorKind::kUsage, [&] { make_plan(o); });
  };
  CHECK(refused(0, 0) == "--devices-per-processor 0 must be from 1 to the pipeline's 4 devices");
  CHECK(refused(-2, 0) == "--devices-per-processor -2 must be from 1 to the pipeline's 4 devices");
  CHECK(refused(5, 0) == "--devices-per-processor 5 must be from 1 to the pipeline's 4 devices");
  CHECK(refused(2, 1) == "--processor-overlap 1 must be in [0, 1)");
  CHECK(refused(2, -0.1) == "--processor-overlap -0.1 must be in [0, 1)");
  CHECK(refused(2, 0, 2) ==
        "2 devices per processor with --data-parallel 2: devices that share a processor are "
        "planned for one pipeline only (use --data-parallel 1)");
}

TEST_CASE("a cluster file gives the devices per processor: the flag overrides it") {
  testing::TempDir dir;
  std::ofstream(dir.file("shared.json"))
      << R"({"devices_per_node": 8, "intra_node": {"bandwidth": 1e10, "latency_s": 5e-6},
            "inter_node": {"bandwidth": 1.25e9, "latency_s": 5e-5}, "devices_per_processor": 4})";
  PlanOptions o = gpt_training(2);
  o.cluster = dir.file("shared.json");
  // 4 per processor on a pipeline of 2: both devices on one.
  CHECK(make_plan(o).plan.processors.processor_of == std::vector<int>{0, 0});
  o.devices_per_processor = 1;
  CHECK(make_plan(o).plan.processors.processor_of == std::vector<int>{0, 1});
}

}  // namespace
}  // namespace stagecraft::plan
