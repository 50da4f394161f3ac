// Devices that share a processor (several pipeline devices on one GPU, CPU devices whose threads
// outnumber the cores): their compute takes turns, their sum is the step, and a simulation with
// one device per processor is the one without processors, to the bit.
#include <doctest/doctest.h>

#include <string>

#include "compiler/schedule/build_schedule.h"
#include "compiler/schedule/simulator.h"
#include "runtime/format/error.h"

namespace stagecraft::schedule {
namespace {

/// Stages of forward `forward`, B `input` and W `weight`, free transfers, a byte of activations.
StageCosts stages_of(const PipelineShape& shape, double forward, double input, double weight) {
  const int stages = stage_count(shape);
  StageCosts costs;
  costs.forward_s.assign(stages, forward);
  if (shape.training) {
    costs.backward_input_s.assign(stages, input);
    costs.backward_weight_s.assign(stages, weight);
  }
  costs.send_s.assign(stages - 1, 0);
  costs.activation_bytes.assign(stages, 1);
  return costs;
}

SimResult play(ScheduleKind kind, const PipelineShape& shape, const StageCosts& costs,
               const Processors& processors = {}) {
  return simulate(build_schedule(kind, shape), shape, costs, processors);
}

/// No two compute instructions of devices on one processor overlap in time.
void check_turns(const SimResult& result, const std::vector<int>& processor_of) {
  auto compute = [](Op op) {
    return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput ||
           op == Op::kBackwardWeight || op == Op::kOptimizerStep;
  };
  for (const TimelineEvent& a : result.events)
    for (const TimelineEvent& b : result.events) {
      if (&a == &b || !compute(a.op) || !compute(b.op)) continue;
      if (processor_of[a.device] != processor_of[b.device]) continue;
      const bool apart = a.end_s <= b.start_s + 1e-12 || b.end_s <= a.start_s + 1e-12;
      CHECK_MESSAGE(apart, "devices ", a.device, " and ", b.device, " compute at once at ",
                    a.start_s);
    }
}

TEST_CASE("two pipeline devices on one processor take about the sum of their compute") {
  // Inference, 2 stages of 1 ms, 4 microbatches: apart the pipeline takes M + P - 1 = 5; on one
  // processor the 8 forwards run one at a time.
  PipelineShape inference{2, 1, 4, false};
  const StageCosts forwards = stages_of(inference, 1, 0, 0);
  const SimResult apart = play(ScheduleKind::kInference, inference, forwards);
  const SimResult shared = play(ScheduleKind::kInference, inference, forwards, {{0, 0}, 0});
  CHECK(apart.step_s == doctest::Approx(5));
  CHECK(shared.step_s == doctest::Approx(8));
  check_turns(shared, {0, 0});
  // Training, F = B = W = 1: apart at most 3 (M + P - 1) = 15 (ZB-H1 less); shared, the 24 of
  // compute.
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZBH1}) {
    CAPTURE(to_string(kind));
    PipelineShape training{2, 1, 4, true};
    const StageCosts costs = stages_of(training, 1, 1, 1);
    const SimResult alone = play(kind, training, costs);
    const SimResult turns = play(kind, training, costs, {{0, 0}, 0});
    CHECK(alone.step_s <= 15 + 1e-9);
    CHECK(turns.step_s == doctest::Approx(24));
    check_turns(turns, {0, 0});
    // Busy time is each device's own compute; the wait for the processor is idle.
    CHECK(turns.device_busy_s == alone.device_busy_s);
    CHECK(turns.bubble_fraction == doctest::Approx(0.5));
  }
}

TEST_CASE("an overlap factor puts a shared processor's step between turns and apart") {
  PipelineShape shape{2, 1, 4, false};
  const StageCosts costs = stages_of(shape, 1, 0, 0);
  const double apart = play(ScheduleKind::kInference, shape, costs).step_s;
  const double turns = play(ScheduleKind::kInference, shape, costs, {{0, 0}, 0}).step_s;
  const double half = play(ScheduleKind::kInference, shape, costs, {{0, 0}, 0.5}).step_s;
  CHECK(half > apart);
  CHECK(half < turns);
  // Each forward holds the processor for half its time: device 1's forwards start half a
  // millisecond late, then run back to back (1.5, 2.5, 3.5, 4.5).
  CHECK(half == doctest::Approx(5.5));
}

TEST_CASE("only the devices on one processor take turns: the others compute at once") {
  // 4 devices on 2 processors, round robin as the runtime places them on GPUs: 0 and 2 share,
  // 1 and 3 share. Each processor has 2 x 4 forwards of 1 ms to run: at least 8.
  PipelineShape shape{4, 1, 4, false};
  const StageCosts costs = stages_of(shape, 1, 0, 0);
  const std::vector<int> processor_of{0, 1, 0, 1};
  const SimResult shared = play(ScheduleKind::kInference, shape, costs, {processor_of, 0});
  const SimResult apart = play(ScheduleKind::kInference, shape, costs);
  CHECK(apart.step_s == doctest::Approx(7));
  CHECK(shared.step_s >= 8 - 1e-9);
  CHECK(shared.step_s < 16);  // the two processors work at once
  check_turns(shared, processor_of);
}

TEST_CASE("one device per processor is the simulation without processors, to the bit") {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZBH1,
                            ScheduleKind::kInterleaved, ScheduleKind::kInference}) {
    CAPTURE(to_string(kind));
    const bool training = kind != ScheduleKind::kInference;
    PipelineShape shape{3, kind == ScheduleKind::kInterleaved ? 2 : 1, 6, training};
    StageCosts costs = stages_of(shape, 1.25, 0.7, 0.9);
    costs.send_s.assign(stage_count(shape) - 1, 0.3);
    const SimResult plain = play(kind, shape, costs);
    const SimResult own = play(kind, shape, costs, {{5, 7, 9}, 0.5});
    CHECK(own.step_s == plain.step_s);
    CHECK(own.bubble_fraction == plain.bubble_fraction);
    CHECK(own.device_peak_bytes == plain.device_peak_bytes);
    REQUIRE(own.events.size() == plain.events.size());
    for (size_t i = 0; i < own.events.size(); ++i) {
      CHECK(own.events[i].start_s == plain.events[i].start_s);
      CHECK(own.events[i].end_s == plain.events[i].end_s);
    }
  }
}

TEST_CASE("processors that do not fit the devices are refused") {
  PipelineShape shape{2, 1, 2, false};
  const StageCosts costs = stages_of(shape, 1, 0, 0);
  const Schedule schedule = build_schedule(ScheduleKind::kInference, shape);
  auto refusal = [&](const Processors& processors) {
    try {
      simulate(schedule, shape, costs, processors);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kUsage);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refusal({{0, 0, 0}, 0}) == "processors: 3 entries for a pipeline of 2 devices");
  CHECK(refusal({{0, 0}, 1}) == "processors: overlap is 1; it must be in [0, 1)");
  CHECK(refusal({{0, 0}, -0.5}) == "processors: overlap is -0.5; it must be in [0, 1)");
}

}  // namespace
}  // namespace stagecraft::schedule
