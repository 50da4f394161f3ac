// ZB-V (issue 34): the V placement, the shape rules and their refusals, the builder's order
// against torch's ScheduleZBVZeroBubble on a small case, its validity for many shapes, the
// activations in flight counted from its order, and its simulated bubble against 1F1B and ZB-H1
// at the same peak.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "compiler/schedule/build_schedule.h"
#include "compiler/schedule/simulator.h"
#include "compiler/schedule/torch_csv.h"
#include "runtime/format/error.h"

namespace stagecraft::schedule {
namespace {

PipelineShape v_shape(int devices, int microbatches) {
  PipelineShape shape{devices, 2, microbatches, true};
  shape.placement = Placement::kV;
  return shape;
}

std::string usage_error(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
    return e.what();
  }
  return "no error";
}

/// One device's compute ops as torch's CSV writes them: "0F0 7F0 7I0 7W0 ...".
std::string compute_row(const std::vector<Instruction>& program) {
  std::string out;
  for (const Instruction& in : program) {
    const char* type = in.op == Op::kForward          ? "F"
                       : in.op == Op::kBackwardInput  ? "I"
                       : in.op == Op::kBackwardWeight ? "W"
                                                      : nullptr;
    if (type == nullptr) continue;
    if (!out.empty()) out += ' ';
    out += std::to_string(in.stage) + type + std::to_string(in.microbatch);
  }
  return out;
}

TEST_CASE("the V placement puts stages i and 2P-1-i on device i") {
  const PipelineShape shape = v_shape(4, 8);
  const int expected[] = {0, 1, 2, 3, 3, 2, 1, 0};
  for (int s = 0; s < 8; ++s) CHECK(device_of_stage(s, shape) == expected[s]);
  for (int d = 0; d < 4; ++d) {
    CHECK(stage_of_chunk(d, 0, shape) == d);
    CHECK(stage_of_chunk(d, 1, shape) == 7 - d);
  }
  CHECK(device_of_stage(5, 4, ScheduleKind::kZBV) == 2);
  CHECK(device_of_stage(5, 4, ScheduleKind::kInterleaved) == 1);
  CHECK(placement_of(ScheduleKind::kZBV) == Placement::kV);
  CHECK(placement_of(ScheduleKind::kZBH1) == Placement::kRoundRobin);
  CHECK(fixed_chunks(ScheduleKind::kZBV) == 2);
  CHECK(fixed_chunks(ScheduleKind::kInterleaved) == 0);
}

TEST_CASE("zb-v refuses other chunk counts, inference and a round-robin shape in one line") {
  PipelineShape three = v_shape(2, 4);
  three.chunks = 3;
  CHECK(usage_error([&] { build_schedule(ScheduleKind::kZBV, three); }) ==
        "schedule 'zb-v' runs 2 chunks per device (device i holds stages i and 2P-1-i), not 3");
  PipelineShape inference = v_shape(2, 4);
  inference.training = false;
  CHECK(usage_error([&] { build_schedule(ScheduleKind::kZBV, inference); }) ==
        "schedule 'zb-v' is for training; an inference plan uses 'inference'");
  CHECK(usage_error([&] {
          build_schedule(ScheduleKind::kZBV, {2, 2, 4, true});
        }) ==
        "schedule 'zb-v' places its stages in a V, but the pipeline's placement is round-robin");
  CHECK(usage_error([&] { build_schedule(ScheduleKind::kInterleaved, v_shape(2, 4)); }) ==
        "schedule 'interleaved' places its stages round-robin, but the pipeline's placement is a "
        "V");
}

TEST_CASE("zb-v on 2 devices and 4 microbatches runs torch's order") {
  // torch's ScheduleZBVZeroBubble(P = 2, M = 4), _calculate_single_rank_operations by hand:
  // rank 0 warms up with 3 forwards of stage 0, then F/I/W of stage 3 twice; rank 1 with one
  // forward of stage 1, one of stage 2 and one of stage 1, then stage 2's F/I/W once; the
  // cool-down's deferred W come last.
  Schedule schedule = build_schedule(ScheduleKind::kZBV, v_shape(2, 4));
  CHECK(compute_row(schedule[0]) ==
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 "
        "0I3 0W3");
  CHECK(compute_row(schedule[1]) ==
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 "
        "2W3 1W3");
}

TEST_CASE("a zb-v schedule is written in torch's CSV with torch's V stage numbers") {
  const std::string csv =
      to_torch_csv(build_schedule(ScheduleKind::kZBV, v_shape(2, 4)), TorchCsvForm::kComputeOnly);
  CHECK(csv.starts_with("0F0,0F1,0F2,3F0,3I0,3W0,3F1,3I1,3W1,0F3,"));
  CHECK(csv.find("\r\n1F0,2F0,1F1,2F1,2I0,2W0,") != std::string::npos);
  // Read back as a custom schedule it is refused: custom schedules place stages round-robin.
  CHECK_THROWS_WITH_AS(read_torch_csv(csv, "zbv.csv"),
                       doctest::Contains("row 1 (rank 0) runs stage 3, which stagecraft places on "
                                         "rank 1"),
                       Error);
}

TEST_CASE("zb-v schedules are valid for 1 to 8 devices and 1 to 20 microbatches") {
  for (int p : {1, 2, 3, 4, 5, 8}) {
    for (int m = 1; m <= 20; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      PipelineShape shape = v_shape(p, m);
      Schedule schedule = build_schedule(ScheduleKind::kZBV, shape);
      CHECK_NOTHROW(validate_schedule(schedule, shape));
      shape.data_parallel = 2;
      shape.shared_groups = {{0, 2 * p - 1}};  // a tied embedding: stages 0 and 2P-1 on device 0
      CHECK_NOTHROW(validate_schedule(build_schedule(ScheduleKind::kZBV, shape), shape));
    }
  }
}

TEST_CASE("zb-v stage s holds min(2P - s, M), device d min(2P, 2M, M + d + 1) together") {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m = 1; m <= 20; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      const PipelineShape shape = v_shape(p, m);
      const Schedule schedule = build_schedule(ScheduleKind::kZBV, shape);
      const std::vector<int64_t> per_stage = stage_in_flight_peaks(schedule, shape);
      for (int s = 0; s < 2 * p; ++s) CHECK(per_stage[s] == std::min(2 * p - s, m));
      const std::vector<double> together =
          activation_peaks(schedule, shape, std::vector<double>(2 * p, 1.0), {});
      for (int d = 0; d < p; ++d) {
        CAPTURE(d);
        CHECK(together[d] == std::min({2 * p, 2 * m, m + d + 1}));
        // cost_models' microbatches_in_flight(kZBV) states the same (memory_test.cpp).
      }
    }
  }
}

StageCosts equal_stages(int stages, double each) {
  StageCosts costs;
  costs.forward_s.assign(stages, each);
  costs.backward_input_s.assign(stages, each);
  costs.backward_weight_s.assign(stages, each);
  costs.send_s.assign(stages - 1, 0.0);
  costs.activation_bytes.assign(stages, 1.0);
  return costs;
}

TEST_CASE("zb-v idles less than zb-h1 and 1f1b on the same layers at 1f1b's peak") {
  // The same model on P devices: 1F1B and ZB-H1 run P stages of F = B = W = 2, ZB-V 2P chunks
  // of 1 each (half the layers) with half the activations per chunk.
  for (int p : {2, 4}) {
    for (int m : {2 * p, 4 * p}) {
      CAPTURE(p);
      CAPTURE(m);
      PipelineShape plain{p, 1, m, true};
      StageCosts whole = equal_stages(p, 2.0);
      whole.activation_bytes.assign(p, 2.0);
      const SimResult one = simulate(build_schedule(ScheduleKind::k1F1B, plain), plain, whole);
      const SimResult zb = simulate(build_schedule(ScheduleKind::kZBH1, plain), plain, whole);
      const PipelineShape shape = v_shape(p, m);
      const SimResult v =
          simulate(build_schedule(ScheduleKind::kZBV, shape), shape, equal_stages(2 * p, 1.0));
      MESSAGE("P=", p, " M=", m, ": bubble 1f1b ", one.bubble_fraction, ", zb-h1 ",
              zb.bubble_fraction, ", zb-v ", v.bubble_fraction, "; peak 1f1b ",
              *std::max_element(one.device_peak_bytes.begin(), one.device_peak_bytes.end()),
              ", zb-v ", *std::max_element(v.device_peak_bytes.begin(), v.device_peak_bytes.end()));
      CHECK(v.bubble_fraction < zb.bubble_fraction);
      CHECK(zb.bubble_fraction < one.bubble_fraction);
      CHECK(v.step_s < zb.step_s);
      // Qi et al. 2024: with F = B = W ZB-V's bubble is near zero once M >= 2P.
      CHECK(v.bubble_fraction < 0.1);
      CHECK(*std::max_element(v.device_peak_bytes.begin(), v.device_peak_bytes.end()) <=
            *std::max_element(one.device_peak_bytes.begin(), one.device_peak_bytes.end()));
    }
  }
}

}  // namespace
}  // namespace stagecraft::schedule
