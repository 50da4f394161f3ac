// The event simulator: the textbook bubbles of each schedule, ZB-H1 against 1F1B, memory in
// flight, transfers on links, deadlocks and bad costs.
#include "compiler/schedule/simulator.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "compiler/schedule/build_schedule.h"
#include "runtime/format/error.h"
#include "runtime/format/readiness.h"

namespace stagecraft::schedule {
namespace {

/// Equal stages: forward, B and W times per stage, free communication unless `send` is given,
/// one byte of activations per microbatch and stage.
StageCosts equal_stages(const PipelineShape& shape, double forward, double input, double weight,
                        double send = 0) {
  int stages = stage_count(shape);
  StageCosts costs;
  costs.forward_s.assign(stages, forward);
  costs.backward_input_s.assign(stages, input);
  costs.backward_weight_s.assign(stages, weight);
  costs.send_s.assign(stages - 1, send);
  costs.activation_bytes.assign(stages, 1);
  return costs;
}

SimResult run(ScheduleKind kind, const PipelineShape& shape, const StageCosts& costs) {
  return simulate(build_schedule(kind, shape), shape, costs);
}

double total(const std::vector<double>& values) {
  return std::accumulate(values.begin(), values.end(), 0.0);
}

/// The bubble as the tests define it: idle compute time over devices * step.
double idle_over_step(const SimResult& result, int devices) {
  return total(result.device_idle_s) / (devices * result.step_s);
}

/// Checks that two simulations of one schedule agree to the bit on what every SimDetail keeps:
/// the step, bubble, busy and idle times, each device's peak and its parts at that instant.
void check_same_figures(const SimResult& got, const SimResult& want) {
  CHECK(got.step_s == want.step_s);
  CHECK(got.bubble_fraction == want.bubble_fraction);
  CHECK(got.device_busy_s == want.device_busy_s);
  CHECK(got.device_idle_s == want.device_idle_s);
  CHECK(got.device_peak_bytes == want.device_peak_bytes);
  REQUIRE(got.device_peak_parts.size() == want.device_peak_parts.size());
  for (std::size_t d = 0; d < want.device_peak_parts.size(); ++d) {
    const PeakParts &a = got.device_peak_parts[d], &b = want.device_peak_parts[d];
    CHECK(a.time_s == b.time_s);
    CHECK(a.activation_bytes == b.activation_bytes);
    CHECK(a.deferred_bytes == b.deferred_bytes);
    CHECK(a.backward_bytes == b.backward_bytes);
    CHECK(a.activations_held == b.activations_held);
  }
}

TEST_CASE("GPipe and 1F1B bubbles are (P-1)/(M+P-1) with forward 1, backward 2") {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
    for (int devices : {1, 2, 3, 4, 8}) {
      for (int microbatches : {1, 2, 4, 7, 8, 16}) {
        PipelineShape shape{devices, 1, microbatches, true};
        SimResult result = run(kind, shape, equal_stages(shape, 1, 1, 1));
        double expected = (devices - 1.0) / (microbatches + devices - 1.0);
        INFO(to_string(kind), " P=", devices, " M=", microbatches);
        CHECK(result.step_s == doctest::Approx(3.0 * (microbatches + devices - 1)).epsilon(1e-12));
        CHECK(std::abs(idle_over_step(result, devices) - expected) < 1e-9);
        CHECK(std::abs(result.bubble_fraction - expected) < 1e-9);
      }
    }
  }
}

TEST_CASE("interleaved bubble is (P-1)/(V*M+P-1) with M a multiple of P") {
  for (int devices : {1, 2, 3, 4, 8}) {
    for (int chunks : {1, 2, 3}) {
      for (int multiple : {1, 2, 4}) {
        int microbatches = multiple * devices;
        PipelineShape shape{devices, chunks, microbatches, true};
        SimResult result = run(ScheduleKind::kInterleaved, shape, equal_stages(shape, 1, 1, 1));
        double expected = (devices - 1.0) / (chunks * microbatches + devices - 1.0);
        INFO("P=", devices, " V=", chunks, " M=", microbatches);
        CHECK(std::abs(idle_over_step(result, devices) - expected) < 1e-9);
        CHECK(std::abs(result.bubble_fraction - expected) < 1e-9);
      }
    }
  }
}

TEST_CASE("ZB-H1 idles a third of 1F1B's time with F = B = W") {
  // Qi et al. 2023: 1F1B idles (P-1)(F+B+W) per device, ZB-H1 (P-1)(F+B-W), once M >= P.
  for (int devices : {2, 3, 4, 8}) {
    for (int microbatches : {devices, 2 * devices, 16}) {
      PipelineShape shape{devices, 1, microbatches, true};
      StageCosts costs = equal_stages(shape, 1, 1, 1);
      SimResult one_f_one_b = run(ScheduleKind::k1F1B, shape, costs);
      SimResult zero_bubble = run(ScheduleKind::kZBH1, shape, costs);
      INFO("P=", devices, " M=", microbatches);
      CHECK(total(zero_bubble.device_idle_s) * 3 ==
            doctest::Approx(total(one_f_one_b.device_idle_s)));
      CHECK(zero_bubble.step_s == 3.0 * microbatches + devices - 1);
      CHECK(std::abs(zero_bubble.bubble_fraction -
                     (devices - 1.0) / (3.0 * microbatches + devices - 1)) < 1e-9);
      CHECK(zero_bubble.bubble_fraction < one_f_one_b.bubble_fraction);
      // Same peak activations as 1F1B's first device, which is 1F1B's peak.
      CHECK(*std::max_element(zero_bubble.device_peak_bytes.begin(),
                              zero_bubble.device_peak_bytes.end()) ==
            *std::max_element(one_f_one_b.device_peak_bytes.begin(),
                              one_f_one_b.device_peak_bytes.end()));
    }
  }
  // The figures quoted in the report: P=4, M=8.
  PipelineShape shape{4, 1, 8, true};
  StageCosts costs = equal_stages(shape, 1, 1, 1);
  SimResult one_f_one_b = run(ScheduleKind::k1F1B, shape, costs);
  SimResult zero_bubble = run(ScheduleKind::kZBH1, shape, costs);
  CHECK(std::abs(one_f_one_b.bubble_fraction - 3.0 / 11) < 1e-9);
  CHECK(std::abs(zero_bubble.bubble_fraction - 3.0 / 27) < 1e-9);
  CHECK(zero_bubble.bubble_fraction < 0.5 * one_f_one_b.bubble_fraction);
}

TEST_CASE("ZB-H1 idles (P-1)(F+B-W) per device for unequal F, B, W") {
  PipelineShape shape{4, 1, 8, true};
  struct Case {
    double forward, input, weight;
  };
  for (Case c : {Case{1, 2, 1}, Case{2, 2, 1}, Case{1, 1, 0.5}}) {
    SimResult result =
        run(ScheduleKind::kZBH1, shape, equal_stages(shape, c.forward, c.input, c.weight));
    INFO("F=", c.forward, " B=", c.input, " W=", c.weight);
    CHECK(total(result.device_idle_s) / 4 == doctest::Approx(3 * (c.forward + c.input - c.weight)));
  }
}

TEST_CASE("ZB-H1 holds deferred bytes from each B to its W: a full backward holds none") {
  PipelineShape shape{2, 1, 4, true};
  StageCosts costs = equal_stages(shape, 1, 1, 1);
  SimResult plain = run(ScheduleKind::kZBH1, shape, costs);
  costs.deferred_bytes.assign(2, 1000);
  SimResult deferred = run(ScheduleKind::kZBH1, shape, costs);
  for (int device = 0; device < 2; ++device) {
    INFO("device ", device);
    // At least one microbatch sits between its B and its W at the peak, and all are released.
    CHECK(deferred.device_peak_bytes[device] >= plain.device_peak_bytes[device] + 1000);
    CHECK(deferred.memory_timeline[device].back().second ==
          plain.memory_timeline[device].back().second);
  }
  // The last device runs W late (filling its bubble): more than one microbatch waits there.
  CHECK(deferred.device_peak_bytes[1] >= plain.device_peak_bytes[1] + 2000);
  SimResult one_f_one_b = run(ScheduleKind::k1F1B, shape, costs);
  costs.deferred_bytes.clear();
  SimResult without = run(ScheduleKind::k1F1B, shape, costs);
  CHECK(one_f_one_b.device_peak_bytes == without.device_peak_bytes);
}

TEST_CASE("backward bytes are held only while a backward runs, one at a time per device") {
  // GPipe on 2 devices, 4 microbatches: device 0 holds 4 activations at its peak; bytes held
  // during a backward add once (backwards of one device never overlap), not once per
  // microbatch or per stage.
  PipelineShape shape{2, 1, 4, true};
  StageCosts costs = equal_stages(shape, 1, 1, 1);
  SimResult plain = run(ScheduleKind::kGPipe, shape, costs);
  costs.backward_bytes.assign(2, 100);
  SimResult held = run(ScheduleKind::kGPipe, shape, costs);
  for (int device = 0; device < 2; ++device) {
    INFO("device ", device);
    CHECK(plain.device_peak_bytes[device] == 4);
    CHECK(held.device_peak_bytes[device] == 4 + 100);
    CHECK(held.memory_timeline[device].back().second == 0);
  }
}

TEST_CASE("the parts of a device's peak add up to it and say what is held at that instant") {
  PipelineShape shape{2, 1, 4, true};
  StageCosts costs = equal_stages(shape, 1, 1, 1);
  costs.static_bytes.assign(2, 10000);
  costs.deferred_bytes.assign(2, 1000);
  costs.backward_bytes.assign(2, 100);
  for (ScheduleKind kind : {ScheduleKind::kZBH1, ScheduleKind::kGPipe}) {
    SimResult result = run(kind, shape, costs);
    REQUIRE(result.device_peak_parts.size() == 2);
    for (int device = 0; device < 2; ++device) {
      INFO(to_string(kind), " device ", device);
      const PeakParts& at = result.device_peak_parts[device];
      CHECK(at.static_bytes == 10000);
      CHECK(at.static_bytes + at.activation_bytes + at.deferred_bytes + at.backward_bytes ==
            result.device_peak_bytes[device]);
      // One byte of activations per microbatch held.
      CHECK(at.activation_bytes == static_cast<double>(at.activations_held));
      // The first instant of the peak, which the timeline has.
      auto first = std::find_if(
          result.memory_timeline[device].begin(), result.memory_timeline[device].end(),
          [&](const auto& entry) { return entry.second == result.device_peak_bytes[device]; });
      REQUIRE(first != result.memory_timeline[device].end());
      CHECK(first->first == at.time_s);
    }
    // GPipe: device 0 holds all 4 microbatches when its first backward starts, rebuilt bytes
    // with it; nothing deferred (no split backward).
    if (kind == ScheduleKind::kGPipe) {
      CHECK(result.device_peak_parts[0].activations_held == 4);
      CHECK(result.device_peak_parts[0].backward_bytes == 100);
      CHECK(result.device_peak_parts[0].deferred_bytes == 0);
    } else {
      CHECK(result.device_peak_parts[1].deferred_bytes >= 2000);
    }
  }
}

TEST_CASE("activations in flight: 1F1B holds min(P-i, M) on device i, GPipe M") {
  for (int devices : {1, 2, 4, 8}) {
    for (int microbatches : {1, 3, 8, 16}) {
      PipelineShape shape{devices, 1, microbatches, true};
      StageCosts costs = equal_stages(shape, 1, 1, 1);
      costs.static_bytes.assign(devices, 100);
      SimResult one_f_one_b = run(ScheduleKind::k1F1B, shape, costs);
      SimResult gpipe = run(ScheduleKind::kGPipe, shape, costs);
      for (int device = 0; device < devices; ++device) {
        INFO("P=", devices, " M=", microbatches, " device ", device);
        CHECK(one_f_one_b.device_peak_bytes[device] ==
              100 + std::min(devices - device, microbatches));
        CHECK(gpipe.device_peak_bytes[device] == 100 + microbatches);
        // Everything is freed by the end of the step.
        CHECK(one_f_one_b.memory_timeline[device].front() == std::pair(0.0, 100.0));
        CHECK(one_f_one_b.memory_timeline[device].back().second == 100);
      }
    }
  }
}

TEST_CASE("memory timeline is in time order and peaks where the schedule says") {
  PipelineShape shape{3, 2, 6, true};
  SimResult result = run(ScheduleKind::kInterleaved, shape, equal_stages(shape, 1, 1, 1, 0.25));
  for (const auto& timeline : result.memory_timeline) {
    CHECK(std::is_sorted(timeline.begin(), timeline.end(),
                         [](auto& a, auto& b) { return a.first < b.first; }));
    double peak = 0;
    for (auto& point : timeline) peak = std::max(peak, point.second);
    CHECK(peak == result.device_peak_bytes[&timeline - &result.memory_timeline[0]]);
  }
}

TEST_CASE("a simulation that keeps only the peaks gives the full one's step, times and peaks") {
  // SimDetail::kPeaks (the split search's candidates): no events, no memory over time, every
  // figure the search reads the same to the bit, on every schedule with every kind of cost.
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                            ScheduleKind::kZBH1, ScheduleKind::kZBV, ScheduleKind::kDualPipeV}) {
    const bool two = kind == ScheduleKind::kInterleaved || kind == ScheduleKind::kZBV ||
                     kind == ScheduleKind::kDualPipeV;
    PipelineShape shape{3, two ? 2 : 1, 6, true};
    shape.placement = placement_of(kind);
    StageCosts costs = equal_stages(shape, 1, 1.5, 0.75, 0.25);
    const int stages = stage_count(shape);
    for (int k = 0; k < stages; ++k) costs.forward_s[k] += 0.1 * k;
    costs.static_bytes.assign(stages, 1000);
    costs.deferred_bytes.assign(stages, 30);
    costs.backward_bytes.assign(stages, 7);
    costs.allgather_s.assign(stages, 0.5);  // the OPT_STEP's event is stretched only when kept
    costs.allreduce_s.assign(stages, 0.3);
    const Schedule schedule = build_schedule(kind, shape);
    const SimResult full = simulate(schedule, shape, costs);
    const SimResult lean = simulate(schedule, shape, costs, {}, SimDetail::kPeaks);
    INFO(to_string(kind));
    check_same_figures(lean, full);
    CHECK(lean.events.empty());
    CHECK_FALSE(full.events.empty());
    REQUIRE(lean.memory_timeline.size() == 3);
    for (const auto& timeline : lean.memory_timeline) CHECK(timeline.empty());
  }
}

TEST_CASE("a prepared schedule plays its recorded order to the same result, bit for bit") {
  // prepare_schedule checks a schedule once and records its order of play; simulating it with
  // other costs (the split search's candidates) gives simulate's result exactly: every schedule
  // kind, uneven random costs with slow links (sends wait for slots), instruction costs, data
  // parallelism, and shared processors (where the rules are asked by the times).
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.1, 2.0);
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved, ScheduleKind::kZBH1,
        ScheduleKind::kZBV, ScheduleKind::kDualPipeV, ScheduleKind::kInference}) {
    const bool two = kind == ScheduleKind::kInterleaved || kind == ScheduleKind::kZBV ||
                     kind == ScheduleKind::kDualPipeV;
    PipelineShape shape{4, two ? 2 : 1, 8, kind != ScheduleKind::kInference};
    shape.placement = placement_of(kind);
    if (kind == ScheduleKind::k1F1B) shape.data_parallel = 2;
    const Schedule schedule = build_schedule(kind, shape);
    const PreparedSchedule prepared = prepare_schedule(schedule, shape);
    CHECK(prepared.schedule == schedule);
    size_t instructions = 0;
    for (const auto& list : schedule) instructions += list.size();
    CHECK(prepared.order.size() == instructions);
    const int stages = stage_count(shape);
    for (int round = 0; round < 4; ++round) {
      StageCosts costs = equal_stages(shape, 1, 1, 1);
      for (int k = 0; k < stages; ++k) {
        costs.forward_s[k] = u(rng);
        costs.backward_input_s[k] = shape.training ? u(rng) : 0;
        costs.backward_weight_s[k] = shape.training ? u(rng) : 0;
        if (k + 1 < stages) costs.send_s[k] = round == 0 ? 0 : 3 * u(rng);
      }
      if (!shape.training) {
        costs.backward_input_s.clear();
        costs.backward_weight_s.clear();
      }
      costs.static_bytes.assign(stages, 100);
      costs.deferred_bytes.assign(stages, 3);
      costs.backward_bytes.assign(stages, 5);
      if (round == 2) costs.instruction_s.assign(kInstructionKinds, 0.05);
      if (kind == ScheduleKind::k1F1B) costs.allreduce_s.assign(stages, u(rng));
      Processors processors;
      if (round == 3) processors = {{0, 0, 1, 1}, 0.25};
      CAPTURE(to_string(kind));
      CAPTURE(round);
      for (SimDetail detail : {SimDetail::kFull, SimDetail::kPeaks}) {
        const SimResult want = simulate(schedule, shape, costs, processors, detail);
        const SimResult got = simulate(prepared, costs, processors, detail);
        check_same_figures(got, want);
        CHECK(got.memory_timeline == want.memory_timeline);
        REQUIRE(got.events.size() == want.events.size());
        for (size_t i = 0; i < got.events.size(); ++i) {
          CHECK(got.events[i].start_s == want.events[i].start_s);
          CHECK(got.events[i].end_s == want.events[i].end_s);
        }
      }
    }
  }
}

TEST_CASE("preparing a deadlocked schedule fails as simulating it does") {
  PipelineShape shape{2, 1, 1, true};
  Schedule schedule = build_schedule(ScheduleKind::k1F1B, shape);
  std::rotate(schedule[0].begin(), schedule[0].begin() + 2, schedule[0].begin() + 3);
  std::string simulated, prepared;
  try {
    simulate(schedule, shape, equal_stages(shape, 1, 1, 1));
  } catch (const Error& e) {
    simulated = e.what();
  }
  try {
    prepare_schedule(schedule, shape);
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kPlan);
    prepared = e.what();
  }
  CHECK_FALSE(simulated.empty());
  CHECK(prepared == simulated);
}

TEST_CASE("transfers take send_s on their link, one at a time, and overlap compute") {
  // GPipe, P=2, M=2, forward 1, backward 2, sends of 2: device 0's second send waits for the
  // link, so device 1's second forward starts at 5, not 4.
  PipelineShape shape{2, 1, 2, true};
  SimResult result = run(ScheduleKind::kGPipe, shape, equal_stages(shape, 1, 2, 0, 2));
  auto event = [&](int device, Op op, int microbatch) {
    for (const TimelineEvent& e : result.events) {
      if (e.device == device && e.op == op && e.microbatch == microbatch) return e;
    }
    FAIL("no such event");
    return result.events.front();
  };
  CHECK(event(0, Op::kForward, 1).start_s == 1);  // the first send did not hold device 0
  CHECK(event(0, Op::kSendAct, 0).start_s == 1);
  CHECK(event(0, Op::kSendAct, 1).start_s == 3);
  CHECK(event(0, Op::kSendAct, 1).end_s == 5);
  CHECK(event(1, Op::kForward, 1).start_s == 5);
  // Device 1: F0 3-4, F1 5-6, B1 6-8, B0 8-10; its gradients arrive at 10 and 12 (link busy).
  CHECK(event(1, Op::kBackward, 0).end_s == 10);
  CHECK(event(0, Op::kRecvGrad, 0).end_s == 12);
  CHECK(result.step_s == 14);
  CHECK(result.device_busy_s == std::vector<double>{6, 6});
  CHECK(result.samples_per_s(28) == 2);
}

TEST_CASE("stages on one device pass data without a link") {
  PipelineShape shape{1, 3, 4, true};
  SimResult result = run(ScheduleKind::kInterleaved, shape, equal_stages(shape, 1, 1, 1, 10));
  CHECK(result.step_s == 3 * 4 * 3);
  CHECK(result.bubble_fraction == 0);
}

TEST_CASE("optimizer steps are busy time, all-reduces are not") {
  PipelineShape shape{1, 1, 2, true, 2};
  StageCosts costs = equal_stages(shape, 1, 1, 1);
  costs.optimizer_s = 1;
  costs.allreduce_s = {3};
  SimResult result = run(ScheduleKind::k1F1B, shape, costs);
  CHECK(result.step_s == 2 * 3 + 3 + 1);
  CHECK(result.device_busy_s[0] == 7);
  CHECK(result.bubble_fraction == doctest::Approx(0.3));
}

TEST_CASE("the all-reduce's buckets go on the link during the last backward") {
  // One device, 1F1B over 2 microbatches: F0 0-1, B0 1-3, F1 3-4, B1 4-6. Two buckets are
  // final at 5 and 6 and take 1.5 each on the replica link: 5-6.5, 6.5-8; ALLREDUCE waits
  // 6-8, the optimizer 8-9. One bucket would go 6-9 (the case above).
  PipelineShape shape{1, 1, 2, true, 2};
  StageCosts costs = equal_stages(shape, 1, 1, 1);
  costs.optimizer_s = 1;
  costs.allreduce_s = {3};
  costs.allreduce_buckets = {2};
  SimResult result = run(ScheduleKind::k1F1B, shape, costs);
  CHECK(result.step_s == 9);
  CHECK(result.device_busy_s[0] == 7);
  bool seen = false;
  for (const TimelineEvent& e : result.events)
    if (e.op == Op::kAllReduce) {
      seen = true;
      CHECK(e.start_s == 6);
      CHECK(e.end_s == 8);
    }
  CHECK(seen);
}

TEST_CASE("an all-reduce runs behind the device's other work: ALLREDUCE waits for the rest") {
  // Two devices, GPipe, 1 microbatch: device 1's backward ends before device 0's starts, so
  // its all-reduce (3) runs while device 0 works: device 1's ALLREDUCE waits only for the part
  // left, device 0's for all of its own.
  PipelineShape shape{2, 1, 1, true, 2};
  StageCosts costs = equal_stages(shape, 1, 1, 1);
  costs.allreduce_s = {3, 3};
  SimResult result = run(ScheduleKind::kGPipe, shape, costs);
  // F0 0-1 (d0), F1 1-2 (d1), B1 2-4 (d1), B0 4-6 (d0). All-reduces: stage 1 4-7, stage 0 6-9.
  for (const TimelineEvent& e : result.events)
    if (e.op == Op::kAllReduce) {
      CAPTURE(e.stage);
      CHECK(e.end_s == (e.stage == 1 ? 7 : 9));
      CHECK(e.start_s == (e.stage == 1 ? 4 : 6));
    }
  CHECK(result.step_s == 9);
}

TEST_CASE("inference needs no backward costs") {
  PipelineShape shape{4, 1, 8, false};
  StageCosts costs;
  costs.forward_s.assign(4, 1);
  SimResult result = run(ScheduleKind::kInference, shape, costs);
  CHECK(result.step_s == 8 + 3);
  CHECK(std::abs(result.bubble_fraction - 3.0 / 11) < 1e-9);
}

TEST_CASE("a deadlocked schedule fails naming each stuck device and instruction") {
  // 1F1B for P=2, M=1 with device 0 waiting for its gradient before it runs the forward.
  PipelineShape shape{2, 1, 1, true};
  Schedule schedule = build_schedule(ScheduleKind::k1F1B, shape);
  std::rotate(schedule[0].begin(), schedule[0].begin() + 2, schedule[0].begin() + 3);
  REQUIRE(schedule[0][0] == Instruction{Op::kRecvGrad, 0, 0, 1});
  try {
    simulate(schedule, shape, equal_stages(shape, 1, 1, 1));
    FAIL("expected a deadlock");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kPlan);
    CHECK(std::string(e.what()) ==
          "schedule deadlocks: device 0 at instruction 0 (RECV_GRAD stage 0 mb 0 from stage 1): "
          "no SEND_GRAD from stage 1 has run; device 1 at instruction 0 (RECV_ACT stage 1 mb 0 "
          "from stage 0): no SEND_ACT from stage 0 has run");
  }
}

TEST_CASE("a receive nobody sends to is a deadlock, not a hang") {
  PipelineShape shape{3, 1, 2, false};
  Schedule schedule = build_schedule(ScheduleKind::kInference, shape);
  schedule[1].erase(schedule[1].begin() + 2);  // device 1's first SEND_ACT
  StageCosts costs;
  costs.forward_s.assign(3, 1);
  CHECK_THROWS_WITH_AS(simulate(schedule, shape, costs),
                       "schedule deadlocks: device 2 at instruction 0 (RECV_ACT stage 2 mb 0 from "
                       "stage 1): no SEND_ACT from stage 1 has run",
                       Error);
}

TEST_CASE("costs that do not fit the pipeline are refused") {
  PipelineShape shape{2, 2, 2, true};
  Schedule schedule = build_schedule(ScheduleKind::kInterleaved, shape);
  StageCosts costs = equal_stages(shape, 1, 1, 1);
  SUBCASE("too few stages") {
    costs.forward_s.pop_back();
    CHECK_THROWS_WITH_AS(simulate(schedule, shape, costs),
                         "stage costs: forward_s has 3 entries; the pipeline has 4 stages", Error);
  }
  SUBCASE("a negative time") {
    costs.send_s[1] = -1;
    CHECK_THROWS_WITH_AS(simulate(schedule, shape, costs),
                         "stage costs: send_s[1] is -1; it must be finite and >= 0", Error);
  }
  SUBCASE("an instruction outside the pipeline") {
    schedule[0].push_back({Op::kForward, 0, 2});
    CHECK_THROWS_WITH_AS(simulate(schedule, shape, costs),
                         "device 0 instruction 22 (FWD stage 0 mb 2) is outside a pipeline of 4 "
                         "stages and 2 microbatches",
                         Error);
  }
}

}  // namespace
}  // namespace stagecraft::schedule

namespace stagecraft::schedule {
namespace {

TEST_CASE("a training link holds two messages: a sender ahead of a slow receiver waits") {
  // GPipe, device 1 ten times slower: device 0's forwards would send all four activations by
  // t = 4; with two messages a link, its third waits for device 1 to take the first (t = 1), its
  // fourth for the second, taken when device 1 finished its first forward (t = 1 + 10 = 11).
  PipelineShape shape{2, 1, 4, true};
  StageCosts costs = equal_stages(shape, 1, 1, 1);
  costs.forward_s = {1, 10};
  SimResult result = run(ScheduleKind::kGPipe, shape, costs);
  auto send_start = [&](int microbatch) {
    for (const TimelineEvent& e : result.events)
      if (e.device == 0 && e.op == Op::kSendAct && e.microbatch == microbatch) return e.start_s;
    FAIL("no SEND_ACT of microbatch " << microbatch);
    return -1.0;
  };
  CHECK(link_capacity(shape) == kTrainingLinkCapacity);
  CHECK(send_start(2) == doctest::Approx(3));
  CHECK(send_start(3) == doctest::Approx(11));
  // Inference links hold one message: the second send waits for the first to be taken.
  PipelineShape inference{2, 1, 4, false};
  CHECK(link_capacity(inference) == 1);
}

TEST_CASE("readiness: a send waits while its link is full, and says so") {
  PipelineShape shape{2, 1, 4, true};
  Readiness r(shape);
  for (int mb = 0; mb < 2; ++mb) {
    r.mark_done({Op::kForward, 0, mb});
    r.mark_done({Op::kSendAct, 0, mb, 1});
  }
  r.mark_done({Op::kForward, 0, 2});
  const Instruction third{Op::kSendAct, 0, 2, 1};
  CHECK_FALSE(r.ready(third));
  CHECK(r.waiting_for(third) == "its link to stage 1 holds 2 messages stage 1 has not received");
  r.mark_done({Op::kRecvAct, 1, 0, 0});
  CHECK(r.ready(third));
}

}  // namespace
}  // namespace stagecraft::schedule
