// Activations in flight counted from the schedules' own lists: per stage (each interleaved chunk
// apart) and per device (its chunks together), against the textbook counts and the simulator.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "compiler/schedule/build_schedule.h"
#include "compiler/schedule/simulator.h"

namespace stagecraft::schedule {
namespace {

/// Megatron-LM's warm-up forwards plus the one in flight, in chunk-microbatches, for device i.
int64_t megatron_interleaved(int p, int m, int v, int i) {
  return std::min<int64_t>(static_cast<int64_t>(m) * v, 2 * (p - i - 1) + (v - 1) * p + 1);
}

TEST_CASE("stages hold M under GPipe and min(P - i, M) under 1F1B and ZB-H1") {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m = 1; m <= 16; ++m) {
      PipelineShape shape{p, 1, m, true};
      CAPTURE(p);
      CAPTURE(m);
      auto gpipe = stage_in_flight_peaks(build_schedule(ScheduleKind::kGPipe, shape), shape);
      auto one = stage_in_flight_peaks(build_schedule(ScheduleKind::k1F1B, shape), shape);
      auto zb = stage_in_flight_peaks(build_schedule(ScheduleKind::kZBH1, shape), shape);
      for (int i = 0; i < p; ++i) {
        CHECK(gpipe[i] == m);
        CHECK(one[i] == std::min(p - i, m));
        CHECK(zb[i] == std::min(p - i, m));  // counted to B; what W reads is deferred_bytes
      }
    }
  }
}

TEST_CASE("an interleaved device holds Megatron's count together: its first chunk holds the most") {
  int uneven = 0;
  for (int p : {2, 3, 4, 8}) {
    for (int v : {2, 3, 4}) {
      for (int m = p; m <= 4 * p; m += p) {
        PipelineShape shape{p, v, m, true};
        Schedule schedule = build_schedule(ScheduleKind::kInterleaved, shape);
        std::vector<int64_t> per_stage = stage_in_flight_peaks(schedule, shape);
        std::vector<double> together =
            activation_peaks(schedule, shape, std::vector<double>(p * v, 1.0), {});
        for (int i = 0; i < p; ++i) {
          CAPTURE(p);
          CAPTURE(v);
          CAPTURE(m);
          CAPTURE(i);
          CHECK(together[i] == megatron_interleaved(p, m, v, i));
          int64_t sum = 0;
          for (int c = 0; c < v; ++c) {
            sum += per_stage[c * p + i];
            CHECK(per_stage[i] >= per_stage[c * p + i]);
          }
          // The chunks peak at different times: their own peaks add up to more than the device's.
          CHECK(sum >= together[i]);
          if (sum > together[i]) ++uneven;
        }
      }
    }
  }
  CHECK(uneven > 0);
}

TEST_CASE("activation peaks are the simulator's peaks for the same bytes, one device at a time") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> bytes(1, 100);
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                            ScheduleKind::kZBH1}) {
    for (int p : {1, 2, 4}) {
      int v = kind == ScheduleKind::kInterleaved ? 2 : 1;
      PipelineShape shape{p, v, 2 * p, true};
      int stages = p * v;
      StageCosts costs;
      costs.forward_s.assign(stages, 1.0);
      costs.backward_input_s.assign(stages, 1.0);
      costs.backward_weight_s.assign(stages, 1.0);
      for (int k = 0; k < stages; ++k) {
        costs.activation_bytes.push_back(bytes(rng));
        costs.backward_bytes.push_back(bytes(rng));
      }
      Schedule schedule = build_schedule(kind, shape);
      SimResult sim = simulate(schedule, shape, costs);
      std::vector<double> walked =
          activation_peaks(schedule, shape, costs.activation_bytes, costs.backward_bytes);
      for (int d = 0; d < p; ++d) {
        CAPTURE(to_string(kind));
        CAPTURE(p);
        CAPTURE(d);
        // ZB-H1: the simulator keeps a microbatch's activations until its W, the walk until B.
        if (kind == ScheduleKind::kZBH1)
          CHECK(walked[d] <= sim.device_peak_bytes[d] + 1e-9);
        else
          CHECK(walked[d] == doctest::Approx(sim.device_peak_bytes[d]));
        std::vector<double> alone =
            activation_peaks(schedule, shape, costs.activation_bytes, costs.backward_bytes, d);
        CHECK(alone[d] == doctest::Approx(walked[d]));
      }
    }
  }
}

TEST_CASE("activation moments give the walk's device peaks to the bit, for any bytes") {
  // The split search weighs recomputation with activation_peaks over precomputed moments: every
  // schedule kind, bytes random per stage (some zero), each device alone and all together.
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> bytes(0.0, 1e9);
  int moments_kept = 0, points = 0;
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved, ScheduleKind::kZBH1,
        ScheduleKind::kZBV, ScheduleKind::kDualPipeV, ScheduleKind::kInference}) {
    const bool two = kind == ScheduleKind::kInterleaved || kind == ScheduleKind::kZBV ||
                     kind == ScheduleKind::kDualPipeV;
    for (int p : {1, 2, 4, 5}) {
      for (int m : {1, 3, 8, 10}) {
        if (kind == ScheduleKind::kDualPipeV && m < 2 * p) continue;
        if (kind == ScheduleKind::kInterleaved && m % p != 0) continue;
        PipelineShape shape{p, two ? (kind == ScheduleKind::kInterleaved ? 3 : 2) : 1, m,
                            kind != ScheduleKind::kInference};
        shape.placement = placement_of(kind);
        const Schedule schedule = build_schedule(kind, shape);
        const ActivationMoments moments = activation_moments(schedule, shape);
        const int stages = stage_count(shape);
        for (int round = 0; round < 5; ++round) {
          std::vector<double> kept, rebuilt;
          for (int k = 0; k < stages; ++k) {
            kept.push_back(round == 1 && k % 2 ? 0.0 : bytes(rng));
            rebuilt.push_back(round == 2 ? 0.0 : bytes(rng) / (1 + k));
          }
          CAPTURE(to_string(kind));
          CAPTURE(p);
          CAPTURE(m);
          const std::vector<double> walked = activation_peaks(schedule, shape, kept, rebuilt);
          CHECK(activation_peaks(moments, kept, rebuilt) == walked);
          for (int d = 0; d < p; ++d)
            CHECK(activation_peaks(moments, kept, rebuilt, d)[d] == walked[d]);
          // Without bytes of one kind or the other.
          CHECK(activation_peaks(moments, kept, {}) == activation_peaks(schedule, shape, kept, {}));
          CHECK(activation_peaks(moments, {}, rebuilt) ==
                activation_peaks(schedule, shape, {}, rebuilt));
        }
        for (const auto& device : moments.moments) moments_kept += static_cast<int>(device.size());
        for (const auto& list : schedule) points += static_cast<int>(list.size());
      }
    }
  }
  // The moments are far fewer than the instructions they stand for.
  CHECK(moments_kept * 4 < points);
}

}  // namespace
}  // namespace stagecraft::schedule
