// The memory anchors of DESIGN.md: bytes per parameter, microbatches in flight per schedule,
// recomputation, and the one-line description used in plans and memory errors.
#include "cost_models/memory.h"

#include <doctest/doctest.h>

#include "runtime/format/error.h"

namespace stagecraft::cost {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

double training_bytes_per_param(OptimizerKind optimizer, Precision precision) {
  return weight_bytes_per_param(precision, true) + gradient_bytes_per_param(precision) +
         optimizer_state_bytes_per_param(optimizer, precision);
}

TEST_CASE("bytes per parameter follow the anchors") {
  CHECK(training_bytes_per_param(OptimizerKind::kAdamW, Precision::kMixed) == 18);
  CHECK(weight_bytes_per_param(Precision::kMixed, true) == 6);
  CHECK(weight_bytes_per_param(Precision::kMixed, false) == 2);
  CHECK(weight_bytes_per_param(Precision::kFp32, true) == 4);
  CHECK(weight_bytes_per_param(Precision::kFp32, false) == 4);
  CHECK(gradient_bytes_per_param(Precision::kMixed) == 4);
  CHECK(gradient_bytes_per_param(Precision::kFp32) == 4);
  for (Precision p : {Precision::kFp32, Precision::kMixed}) {
    CHECK(optimizer_state_bytes_per_param(OptimizerKind::kNone, p) == 0);
    CHECK(optimizer_state_bytes_per_param(OptimizerKind::kSgd, p) == 0);
    CHECK(optimizer_state_bytes_per_param(OptimizerKind::kMomentum, p) == 4);
    CHECK(optimizer_state_bytes_per_param(OptimizerKind::kAdam, p) == 8);
    CHECK(optimizer_state_bytes_per_param(OptimizerKind::kAdamW, p) == 8);
    CHECK(optimizer_state_bytes_per_param(OptimizerKind::kAdam8bit, p) == 2);
  }
  CHECK(training_bytes_per_param(OptimizerKind::kAdam, Precision::kFp32) == 16);
}

TEST_CASE("stage memory: a billion parameters under mixed AdamW take 18 GB") {
  const int64_t params = 1'000'000'000;
  auto m = stage_memory(params, params, 0, 0, 0, 1, OptimizerKind::kAdamW, Precision::kMixed, true,
                        false, 0);
  CHECK(m.weights == 6 * params);
  CHECK(m.gradients == 4 * params);
  CHECK(m.optimizer == 8 * params);
  CHECK(m.total() == 18 * params);

  auto inference = stage_memory(params, params, 100, 0, 0, 1, OptimizerKind::kAdamW,
                                Precision::kMixed, false, false, 0);
  CHECK(inference.weights == 2 * params);
  CHECK(inference.gradients == 0);
  CHECK(inference.optimizer == 0);
  CHECK(inference.activations == 100);

  auto sgd = stage_memory(params, params, 0, 0, 0, 1, OptimizerKind::kSgd, Precision::kFp32, true,
                          false, 0);
  CHECK(sgd.total() == 8 * params);

  // Frozen weights (and buffers such as running statistics) keep their weight bytes but have
  // no gradient and no optimizer state.
  auto frozen = stage_memory(params, params / 4, 0, 0, 0, 1, OptimizerKind::kAdamW,
                             Precision::kFp32, true, false, 0);
  CHECK(frozen.weights == 4 * params);
  CHECK(frozen.gradients == params);
  CHECK(frozen.optimizer == 2 * params);
  CHECK_THROWS_AS(
      stage_memory(10, 11, 0, 0, 0, 1, OptimizerKind::kSgd, Precision::kFp32, true, false, 0),
      Error);
}

TEST_CASE("activations scale with the microbatches in flight, recompute keeps stage inputs") {
  auto plain =
      stage_memory(0, 0, 1000, 7, 3, 4, OptimizerKind::kAdamW, Precision::kMixed, true, false, 10);
  CHECK(plain.activations == 4000);
  CHECK(plain.temporary == 7);
  CHECK(plain.communication == 3);
  CHECK(plain.total() == 4010);
  auto recompute =
      stage_memory(0, 0, 1000, 0, 0, 4, OptimizerKind::kAdamW, Precision::kMixed, true, true, 10);
  CHECK(recompute.activations == 4 * 10 + 1000);
  CHECK_THROWS_AS(
      stage_memory(-1, 0, 0, 0, 0, 1, OptimizerKind::kSgd, Precision::kFp32, true, false, 0),
      Error);
  CHECK_THROWS_AS(stage_memory(0, 0, int64_t{1} << 62, 0, 0, 8, OptimizerKind::kSgd,
                               Precision::kFp32, true, false, 0),
                  Error);
}

TEST_CASE("GPipe keeps every microbatch, 1F1B keeps min(P - i, M), the first stage heaviest") {
  const int p = 4;
  for (int i = 0; i < p; ++i) {
    CHECK(microbatches_in_flight(ScheduleKind::kGPipe, p, i, 8, 1) == 8);
    CHECK(microbatches_in_flight(ScheduleKind::k1F1B, p, i, 8, 1) == p - i);
    CHECK(microbatches_in_flight(ScheduleKind::kZBH1, p, i, 8, 1) == p - i);
    CHECK(microbatches_in_flight(ScheduleKind::kInference, p, i, 8, 1) == 1);
  }
  CHECK(microbatches_in_flight(ScheduleKind::k1F1B, p, 0, 2, 1) == 2);
  CHECK(microbatches_in_flight(ScheduleKind::k1F1B, p, 3, 2, 1) == 1);
  for (int i = 1; i < p; ++i) {
    CHECK(microbatches_in_flight(ScheduleKind::k1F1B, p, i, 8, 1) <
          microbatches_in_flight(ScheduleKind::k1F1B, p, i - 1, 8, 1));
  }
}

TEST_CASE("interleaved: Megatron's warm-up count in chunk-microbatches") {
  // P = 4, V = 2, M = 8: stage 0 runs 2*3 + 1*4 = 10 warm-up forwards, then holds 11.
  CHECK(microbatches_in_flight(ScheduleKind::kInterleaved, 4, 0, 8, 2) == 11);
  CHECK(microbatches_in_flight(ScheduleKind::kInterleaved, 4, 3, 8, 2) == 5);
  // 11 chunk-microbatches are 5.5 device-microbatches: P * (1 + (P - 1) / (P * V)).
  CHECK(11.0 / 2 == doctest::Approx(4 * (1 + 3.0 / 8)));
  // Capped by the M * V chunk-microbatches of a step.
  CHECK(microbatches_in_flight(ScheduleKind::kInterleaved, 4, 0, 2, 2) == 4);
  // One chunk per device is plain 1F1B.
  CHECK(microbatches_in_flight(ScheduleKind::kInterleaved, 4, 1, 8, 1) == 3);
}

TEST_CASE("zb-v: min(2P, 2M, M + i + 1) chunk-microbatches, 2P on every device from M = 2P - 1") {
  // The counts tests/schedule/zb_v_test.cpp finds in the built order.
  for (int i = 0; i < 4; ++i) {
    CHECK(microbatches_in_flight(ScheduleKind::kZBV, 4, i, 8, 2) == 8);
    CHECK(microbatches_in_flight(ScheduleKind::kZBV, 4, i, 7, 2) == 8);
    CHECK(microbatches_in_flight(ScheduleKind::kZBV, 4, i, 2, 2) == (i == 0 ? 3 : 4));
  }
  CHECK(microbatches_in_flight(ScheduleKind::kZBV, 8, 0, 8, 2) == 9);
}

TEST_CASE("dualpipev: 2P + 1 chunk-microbatches on every device, one above zb-v") {
  // The counts tests/schedule/dualpipev_test.cpp finds in the built order (M >= 2P).
  for (int p : {1, 2, 4, 8}) {
    for (int i = 0; i < p; ++i) {
      CHECK(microbatches_in_flight(ScheduleKind::kDualPipeV, p, i, 2 * p, 2) == 2 * p + 1);
      CHECK(microbatches_in_flight(ScheduleKind::kDualPipeV, p, i, 4 * p + 3, 2) == 2 * p + 1);
      CHECK(microbatches_in_flight(ScheduleKind::kDualPipeV, p, i, 4 * p, 2) >
            microbatches_in_flight(ScheduleKind::kZBV, p, i, 4 * p, 2));
    }
  }
}

TEST_CASE("bad pipeline shapes are usage errors") {
  CHECK_THROWS_AS(microbatches_in_flight(ScheduleKind::k1F1B, 0, 0, 8, 1), Error);
  CHECK_THROWS_AS(microbatches_in_flight(ScheduleKind::k1F1B, 4, 4, 8, 1), Error);
  CHECK_THROWS_AS(microbatches_in_flight(ScheduleKind::k1F1B, 4, -1, 8, 1), Error);
  CHECK_THROWS_AS(microbatches_in_flight(ScheduleKind::kGPipe, 4, 0, 0, 1), Error);
  CHECK_THROWS_WITH_AS(microbatches_in_flight(ScheduleKind::kInterleaved, 4, 0, 8, 0),
                       "microbatches in flight: need stages >= 1, 0 <= stage < stages, "
                       "microbatches >= 1 and chunks >= 1; got stages 4, stage 0, microbatches 8, "
                       "chunks 0",
                       Error);
}

TEST_CASE("describe prints the total and the parts in one unit") {
  MemoryBytes m;
  m.weights = 12 * kGiB;
  m.gradients = 6 * kGiB;
  m.optimizer = 24 * kGiB;
  m.activations = static_cast<int64_t>(5.2 * kGiB);
  CHECK(describe(m, 4) ==
        "47.2 GiB: weights 12.0, gradients 6.0, optimizer 24.0, activations 5.2 for 4 microbatches "
        "in flight");
  MemoryBytes small;
  small.weights = int64_t{512} * 1024;
  small.activations = 1024;
  small.temporary = 512;
  CHECK(describe(small, 1) ==
        "513.5 KiB: weights 512.0, activations 1.0 for 1 microbatch in flight, temporary 0.5");
  CHECK(describe(MemoryBytes{}, 1) == "0 B");
  MemoryBytes tiny;
  tiny.communication = 100;
  CHECK(describe(tiny, 1) == "100 B: communication 100");
}

TEST_CASE("names round-trip, unknown names list the valid ones") {
  for (auto s : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                 ScheduleKind::kZBH1, ScheduleKind::kZBV, ScheduleKind::kDualPipeV,
                 ScheduleKind::kInference}) {
    CHECK(parse_schedule(to_string(s)) == s);
  }
  for (auto o : {OptimizerKind::kNone, OptimizerKind::kSgd, OptimizerKind::kMomentum,
                 OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kAdam8bit}) {
    CHECK(parse_optimizer(to_string(o)) == o);
  }
  CHECK(parse_precision("mixed") == Precision::kMixed);
  CHECK(parse_precision("fp32") == Precision::kFp32);
  CHECK(to_string(ScheduleKind::kZBH1) == "zb-h1");
  CHECK(parse_schedule("1F1B") == ScheduleKind::k1F1B);  // the command line ignores case
  CHECK_THROWS_WITH_AS(parse_schedule("1f2b"),
                       "unknown schedule '1f2b' (did you mean '1f1b'?); valid: gpipe, 1f1b, "
                       "interleaved, zb-h1, zb-v, dualpipev, inference, custom",
                       Error);
  CHECK_THROWS_WITH_AS(parse_optimizer("lamb"),
                       "unknown optimizer 'lamb'; valid: none, sgd, momentum, nesterov, adam, "
                       "adamw, adam8bit, adagrad",
                       Error);
  CHECK_THROWS_WITH_AS(parse_precision("bf16"), "unknown precision 'bf16'; valid: fp32, mixed, fp16",
                       Error);
  try {
    parse_schedule("x");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
  }
}

}  // namespace
}  // namespace stagecraft::cost
