// The simulator's fixed cost per instruction kind (StageCosts::instruction_s): what each kind
// adds to a step, on a pipeline small enough to add up by hand.
#include <doctest/doctest.h>

#include "compiler/schedule/build_schedule.h"
#include "compiler/schedule/simulator.h"
#include "runtime/format/error.h"

namespace stagecraft::schedule {
namespace {

StageCosts two_stage_inference() {
  StageCosts costs;
  costs.forward_s = {1.0, 1.0};
  costs.send_s = {0.5};
  return costs;
}

TEST_CASE("fixed instruction costs add to the forward, the send and the receive they stand on") {
  const PipelineShape shape{2, 1, 1, false};
  const Schedule schedule = build_schedule(ScheduleKind::kInference, shape);
  StageCosts costs = two_stage_inference();
  // Without fixed costs: forward 1, transfer 0.5, forward 1.
  CHECK(simulate(schedule, shape, costs).step_s == doctest::Approx(2.5));
  costs.instruction_s.assign(kInstructionKinds, 0.0);
  costs.instruction_s[static_cast<size_t>(Op::kForward)] = 0.1;
  costs.instruction_s[static_cast<size_t>(Op::kSendAct)] = 0.2;
  costs.instruction_s[static_cast<size_t>(Op::kRecvAct)] = 0.3;
  // Device 0: FWD 0 .. 1.1, SEND holds it to 1.3, the transfer arrives at 1.8; device 1: RECV
  // until 1.8 + 0.3, FWD 2.1 .. 3.2.
  const SimResult result = simulate(schedule, shape, costs);
  CHECK(result.step_s == doctest::Approx(3.2));
  CHECK(result.device_busy_s[0] == doctest::Approx(1.1));
  CHECK(result.device_busy_s[1] == doctest::Approx(1.1));
}

TEST_CASE("a device that starts late starts its list then") {
  const PipelineShape shape{2, 1, 1, false};
  const Schedule schedule = build_schedule(ScheduleKind::kInference, shape);
  StageCosts costs = two_stage_inference();
  costs.device_start_s = {0.0, 2.0};
  // Device 1 receives from 2.0 (the message arrived at 1.5), then computes 1.
  CHECK(simulate(schedule, shape, costs).step_s == doctest::Approx(3.0));
  costs.device_start_s = {0.0};
  CHECK_THROWS_WITH_AS(simulate(schedule, shape, costs),
                       doctest::Contains("device_start_s has 1 entries; the pipeline has 2"),
                       Error);
}

TEST_CASE("a step's time beyond its instructions lengthens the step, every device idle for it") {
  const PipelineShape shape{2, 1, 1, false};
  const Schedule schedule = build_schedule(ScheduleKind::kInference, shape);
  StageCosts costs = two_stage_inference();
  costs.step_overhead_s = 0.4;
  const SimResult result = simulate(schedule, shape, costs);
  CHECK(result.step_s == doctest::Approx(2.9));
  CHECK(result.device_idle_s[0] == doctest::Approx(1.9));
  CHECK(result.device_idle_s[1] == doctest::Approx(1.9));
  costs.step_overhead_s = -0.1;
  CHECK_THROWS_WITH_AS(simulate(schedule, shape, costs),
                       doctest::Contains("step_overhead_s is -0.1"), Error);
}

TEST_CASE("a per-stage optimizer step replaces the shared one and takes its fixed cost") {
  const PipelineShape shape{1, 1, 1, true};
  const Schedule schedule = build_schedule(ScheduleKind::k1F1B, shape);
  StageCosts costs;
  costs.forward_s = {1.0};
  costs.backward_input_s = {1.0};
  costs.backward_weight_s = {1.0};
  costs.optimizer_s = 0.5;
  CHECK(simulate(schedule, shape, costs).step_s == doctest::Approx(3.5));
  costs.optimizer_stage_s = {2.0};
  costs.instruction_s.assign(kInstructionKinds, 0.0);
  costs.instruction_s[static_cast<size_t>(Op::kOptimizerStep)] = 0.25;
  costs.instruction_s[static_cast<size_t>(Op::kBackward)] = 0.125;
  CHECK(simulate(schedule, shape, costs).step_s == doctest::Approx(1 + 2.125 + 2.25));
}

TEST_CASE("instruction costs of the wrong length or negative are refused") {
  const PipelineShape shape{2, 1, 1, false};
  const Schedule schedule = build_schedule(ScheduleKind::kInference, shape);
  StageCosts costs = two_stage_inference();
  costs.instruction_s = {0.1, 0.2};
  CHECK_THROWS_WITH_AS(simulate(schedule, shape, costs),
                       doctest::Contains("instruction_s has 2 entries"), Error);
  costs.instruction_s.assign(kInstructionKinds, 0.0);
  costs.instruction_s[0] = -1;
  CHECK_THROWS_WITH_AS(simulate(schedule, shape, costs),
                       doctest::Contains("instruction_s[0] is -1"), Error);
}

}  // namespace
}  // namespace stagecraft::schedule
