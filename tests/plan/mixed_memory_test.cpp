// Mixed-precision training keeps each weight's 16-bit copy with every microbatch in flight (the
// backward reads it). The split search and --recompute auto must count those copies while they
// choose, not only once the stage graphs are converted: a plan that fits with recomputation is
// never refused because the search thought it fit without.
#include <doctest/doctest.h>

#include <algorithm>

#include "compiler/plan/planner.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::plan {
namespace {

/// The GPT sample trained in mixed precision under 1F1B on 4 devices, 8 microbatches of one
/// short sequence: small activations, so the weight copies are most of what a microbatch keeps.
PlanOptions mixed_gpt() {
  PlanOptions o;
  o.model_path = std::string(STAGECRAFT_SAMPLES) + "/gpt_tiny.onnx";
  o.devices = 4;
  o.schedule = ScheduleKind::k1F1B;
  o.training = true;
  o.precision = Precision::kMixed;
  o.microbatches = 8;
  o.batch = 8;
  o.dims["seq"] = 4;
  o.device_spec = "cpu";
  return o;
}

int64_t max_peak(const Plan& p) {
  return *std::max_element(p.predicted.device_peak_bytes.begin(),
                           p.predicted.device_peak_bytes.end());
}

TEST_CASE("mixed-precision training: the 16-bit weight copies are counted per microbatch in "
          "flight") {
  PlanOptions o = mixed_gpt();
  const Plan none = make_plan(o).plan;
  o.split_after = none.predicted.split_after;
  o.recompute = Recompute::kAll;
  const Plan all = make_plan(o).plan;
  REQUIRE(none.stages.size() == 4);
  REQUIRE(all.stages.size() == 4);
  // 1F1B's first stage keeps 4 microbatches, so 4 copies of its weights; recomputing, one (the
  // microbatch rebuilt for its backward). A copy is 2 bytes a parameter; the weights keep the
  // float32 master (4 B/param with mixed AdamW's state apart).
  const Stage& first = none.stages[0];
  REQUIRE(first.in_flight == 4);
  CHECK(first.memory.weights == 4 * first.params);
  CHECK(all.stages[0].memory.weights == 4 * first.params);
  CHECK(first.memory.activations - all.stages[0].memory.activations >= 3 * 2 * first.params);
}

TEST_CASE("mixed-precision training: --recompute auto fits a device that recomputation fits") {
  // GPipe keeps all 8 microbatches in flight on every stage: 8 copies of each stage's weights
  // without recomputation, 1 with it.
  PlanOptions o = mixed_gpt();
  o.schedule = ScheduleKind::kGPipe;
  const Plan none = make_plan(o).plan;
  o.split_after = none.predicted.split_after;
  o.recompute = Recompute::kAll;
  const Plan all = make_plan(o).plan;
  const int64_t with = max_peak(all), without = max_peak(none);
  CAPTURE(with);
  CAPTURE(without);
  REQUIRE(with < without);
  // Between the two: recomputing nothing overflows, so auto must recompute where the copies
  // and activations of the microbatches in flight do not fit.
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
