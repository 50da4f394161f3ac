// Mixed-precision training's memory: a stage holds its weights' float32 masters and one 16-bit
// copy of each weight its backward reads, for the whole step (the runtime shares the step's
// first copy among its microbatches: runtime/exec/device_worker.cpp share_step_copies), not a
// copy per microbatch in flight. tests/runtime/mixed_precision_test.cpp checks the runtime's
// measured peaks against these predictions.
#include <doctest/doctest.h>

#include <algorithm>

#include "compiler/plan/planner.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::plan {
namespace {

/// The GPT sample trained in mixed precision under GPipe on 2 devices, `microbatches` of one
/// short sequence each: small activations, so a copy per microbatch would show.
PlanOptions mixed_gpt(int microbatches) {
  PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx";
  o.devices = 2;
  o.schedule = ScheduleKind::kGPipe;
  o.training = true;
  o.precision = Precision::kMixed;
  o.microbatches = microbatches;
  o.batch = microbatches;
  o.dims["seq"] = 4;
  o.device_spec = "cpu";
  return o;
}

int64_t max_peak(const Plan& p) {
  return *std::max_element(p.predicted.device_peak_bytes.begin(),
                           p.predicted.device_peak_bytes.end());
}

TEST_CASE("mixed-precision training holds one 16-bit weight copy per stage, whatever is in "
          "flight") {
  PlanOptions o = mixed_gpt(8);
  const Plan eight = make_plan(o).plan;
  o = mixed_gpt(2);
  o.split_after = eight.predicted.split_after;
  const Plan two = make_plan(o).plan;
  REQUIRE(eight.stages.size() == 2);
  REQUIRE(two.stages.size() == 2);
  for (std::size_t k = 0; k < 2; ++k) {
    CAPTURE(k);
    const Stage& a = eight.stages[k];
    const Stage& b = two.stages[k];
    REQUIRE(a.in_flight == 8);
    REQUIRE(b.in_flight == 2);
    // The float32 masters and the copies (2 B a parameter at most: Conv's weights and those
    // the backward does not read, a bias, have none to keep), the same with 2 or 8 in flight.
    const int64_t copies = a.memory.weights - 4 * a.params;
    CHECK(copies > a.params);
    CHECK(copies <= 2 * a.params);
    CHECK(b.memory.weights == a.memory.weights);
    // What a microbatch keeps is the same with 2 or 8 in flight, and no copy of the weights.
    CHECK(a.memory.activations * 2 == b.memory.activations * 8);
    CHECK(a.memory.activations / 8 < copies);
  }
}

TEST_CASE("mixed-precision training: --recompute auto fits a device that recomputation fits") {
  PlanOptions o = mixed_gpt(8);
  const Plan none = make_plan(o).plan;
  o.split_after = none.predicted.split_after;
  o.recompute = Recompute::kAll;
  const Plan all = make_plan(o).plan;
  const int64_t with = max_peak(all), without = max_peak(none);
  CAPTURE(with);
  CAPTURE(without);
  REQUIRE(with < without);
  // Between the two: recomputing nothing overflows, so auto must recompute where the values of
  // the microbatches in flight do not fit.
  testing::TempDir dir;
  const int64_t capacity = (with + without) / 2;
  o.device_spec = testing::device_file(dir, capacity);
  o.recompute = Recompute::kNone;
  CHECK_THROWS_WITH_AS(make_plan(o), doctest::Contains("device has"), Error);
  o.recompute = Recompute::kAuto;
  const Plan picked = make_plan(o).plan;
  CHECK(picked.predicted.fits);
  CHECK(max_peak(picked) <= capacity);
  CHECK(std::any_of(picked.stages.begin(), picked.stages.end(),
                    [](const Stage& st) { return st.recompute; }));
  // Left to choose its own split as well, it still finds one that fits.
  o.split_after.clear();
  const Plan free = make_plan(o).plan;
  CHECK(free.predicted.fits);
  CHECK(max_peak(free) <= capacity);
}

}  // namespace
}  // namespace stagecraft::plan
