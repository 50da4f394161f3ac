// stagec --auto (issue 34, item 2) on the samples: the choice against every explicit
// configuration of its space, held-fixed choices, memory limits, and plan.json's auto_search.
#include "compiler/plan/auto_search.h"

#include <doctest/doctest.h>

#include <limits>

#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::plan {
namespace {

std::string sample(const std::string& name) { return std::string(STAGECRAFT_SAMPLES) + "/" + name; }

/// `model` trained with an MSE loss (or for inference) on `devices` devices at global batch
/// `batch`, nothing of the searched choices given.
PlanOptions options(const std::string& model, int devices, int64_t batch, bool training) {
  PlanOptions o;
  o.model_path = sample(model);
  o.devices = devices;
  o.batch = batch;
  o.training = training;
  if (training) o.loss.kind = "mse";
  if (model == "gpt_tiny.onnx") o.dims["seq"] = 16;
  return o;
}

/// A device spec like the CPU's with `bytes` of memory, written into `dir`.
/// The options a user would give for configuration `c` of the space, explicitly.
PlanOptions explicit_options(PlanOptions o, const AutoCandidate& c) {
  o.schedule = parse_schedule(c.schedule);
  o.chunks = c.chunks;
  o.microbatches = c.microbatches;
  o.data_parallel = c.data_parallel;
  o.recompute = parse_recompute(c.recompute);
  return o;
}

/// The best fitting step (or peak, with the memory objective) of every configuration of the
/// space planned explicitly, one make_plan each; infinity when none fits.
double best_explicit(const PlanOptions& o, const AutoFixed& fixed, int* planned) {
  double best = std::numeric_limits<double>::infinity();
  for (const AutoCandidate& c : auto_space(o, fixed)) {
    if (c.microbatch_size == 0) continue;  // the batch does not split so
    try {
      const Prediction p = make_plan(explicit_options(o, c)).plan.predicted;
      ++*planned;
      const double key =
          o.objective == Objective::kMemory ? static_cast<double>(p.peak_memory_bytes) : p.step_ms;
      best = std::min(best, key);
    } catch (const Error& e) {
      // Refused: over memory, or a shape the schedule does not take; --auto records those too.
      CHECK((e.kind() == ErrorKind::kPlan || e.kind() == ErrorKind::kUsage));
    }
  }
  return best;
}

TEST_CASE("--auto is never worse, predicted, than an explicit configuration of its space") {
  struct Case {
    const char* model;
    int devices;
    int64_t batch;
    bool training;
    Objective objective;
  };
  for (const Case& k : {Case{"gpt_tiny.onnx", 2, 4, true, Objective::kSpeed},
                        Case{"mnist_cnn.onnx", 2, 8, true, Objective::kSpeed},
                        Case{"resnet_small.onnx", 2, 8, false, Objective::kSpeed},
                        Case{"gpt_tiny.onnx", 2, 4, true, Objective::kMemory}}) {
    CAPTURE(k.model);
    CAPTURE(k.training);
    CAPTURE(to_string(k.objective));
    PlanOptions o = options(k.model, k.devices, k.batch, k.training);
    o.objective = k.objective;
    int planned = 0;
    const double best = best_explicit(o, {}, &planned);
    REQUIRE(planned > 3);  // a space with choices in it
    const PlannedModel chosen = auto_plan(o, {});
    const Plan& p = chosen.plan;
    const double key = k.objective == Objective::kMemory
                           ? static_cast<double>(p.predicted.peak_memory_bytes)
                           : p.predicted.step_ms;
    CHECK(key <= best * (1 + 1e-12));
    CHECK(key >= best * (1 - 1e-12));  // and it is one of them
    // Every configuration is recorded, the plan's own first, and the plan validates with it.
    REQUIRE(p.auto_search.size() == auto_space(o, {}).size());
    CHECK(p.auto_search.front().status == "chosen");
    CHECK(p.auto_search.front().step_ms == doctest::Approx(p.predicted.step_ms));
    CHECK_NOTHROW(validate_plan(p, "plan.json"));
    // The lower bound prunes only what cannot win: a planned step is never below it, so a
    // pruned configuration's note names a bound no shorter than the best step.
    for (const AutoCandidate& c : p.auto_search) {
      if (c.status == "fits" && k.objective == Objective::kSpeed)
        CHECK(c.step_ms >= p.predicted.step_ms * (1 - 1e-12));
      if (c.status == "fits" && k.objective == Objective::kMemory)
        CHECK(c.peak_memory_bytes >= p.predicted.peak_memory_bytes);
      if (k.training && k.objective == Objective::kSpeed) CHECK(c.status != "over_memory");
    }
  }
}

TEST_CASE("--auto holds the choices given fixed and searches the rest") {
  PlanOptions o = options("gpt_tiny.onnx", 4, 8, true);
  o.schedule = ScheduleKind::k1F1B;
  o.microbatches = 2;
  const Plan p = auto_plan(o, {.schedule = true, .microbatches = true}).plan;
  CHECK(p.schedule == ScheduleKind::k1F1B);
  CHECK(p.microbatches == 2);
  bool replicas_searched = false;
  for (const AutoCandidate& c : p.auto_search) {
    CHECK(c.schedule == "1f1b");
    CHECK(c.microbatches == 2);
    replicas_searched = replicas_searched || c.data_parallel > 1;
  }
  CHECK(replicas_searched);
  // The data-parallel degree held fixed too: nothing but R = 2 (and recomputation) is left.
  o.data_parallel = 2;
  const Plan q = auto_plan(o, {.schedule = true, .microbatches = true, .data_parallel = true}).plan;
  CHECK(q.data_parallel == 2);
  CHECK(q.auto_search.size() == 2);  // recompute none and auto
  // The chunks held at 3: only interleaved runs 3 chunks.
  PlanOptions v = options("gpt_tiny.onnx", 2, 4, true);
  v.chunks = 3;
  for (const AutoCandidate& c : auto_space(v, {.chunks = true})) {
    CHECK(c.schedule == "interleaved");
    CHECK(c.chunks == 3);
  }
  // Inference searches only the schedules without a backward.
  for (const AutoCandidate& c : auto_space(options("mnist_cnn.onnx", 2, 8, false), {}))
    CHECK(c.schedule == "inference");
}

TEST_CASE("a memory limit that excludes the fastest configuration makes --auto choose another") {
  testing::TempDir dir;
  PlanOptions o = options("gpt_tiny.onnx", 2, 4, true);
  o.device_spec = testing::device_file(dir, int64_t{1} << 40);
  const Plan fastest = auto_plan(o, {}).plan;
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (const AutoCandidate& c : fastest.auto_search)
    if (c.status == "fits" || c.status == "chosen")
      smallest = std::min(smallest, c.peak_memory_bytes);
  const int64_t peak = fastest.predicted.peak_memory_bytes;
  REQUIRE(smallest < peak);  // another configuration needs less than the fastest
  o.device_spec = testing::device_file(dir, peak - 1);
  const Plan other = auto_plan(o, {}).plan;
  CHECK(other.predicted.peak_memory_bytes < peak);
  CHECK(other.predicted.step_ms >= fastest.predicted.step_ms);
  const AutoCandidate& a = fastest.auto_search.front();
  const AutoCandidate& b = other.auto_search.front();
  CHECK((a.schedule != b.schedule || a.chunks != b.chunks || a.microbatches != b.microbatches ||
         a.data_parallel != b.data_parallel || a.recompute != b.recompute));

  // Below every configuration's peak: refused, naming the smallest peak found and the limit.
  o.device_spec = testing::device_file(dir, 4096);
  try {
    auto_plan(o, {});
    FAIL("a space where nothing fits was planned");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kPlan);
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("the smallest peak found is") != std::string::npos, what);
    CHECK_MESSAGE(what.find("against 4.00 KiB per device") != std::string::npos, what);
    CHECK(what.find('\n') == std::string::npos);
  }
}

TEST_CASE("--auto's search survives plan.json and is refused when it contradicts the plan") {
  PlanOptions o = options("mnist_cnn.onnx", 2, 8, true);
  Plan p = auto_plan(o, {}).plan;
  const Plan back = plan_from_json(nlohmann::json::parse(to_json(p).dump()), "plan.json");
  REQUIRE(back.auto_search.size() == p.auto_search.size());
  CHECK(back.auto_search[1].step_ms == p.auto_search[1].step_ms);
  CHECK(back.auto_search[1].status == p.auto_search[1].status);
  Plan bad = p;
  bad.auto_search[0].status = "fits";
  CHECK_THROWS_WITH_AS(validate_plan(bad, "plan.json"), doctest::Contains("auto_search[0].status"),
                       Error);
  bad = p;
  bad.auto_search[1].microbatch_size += 1;
  CHECK_THROWS_WITH_AS(validate_plan(bad, "plan.json"),
                       doctest::Contains("auto_search[1].microbatch_size"), Error);
  bad = p;
  bad.auto_search[0].schedule = p.schedule == ScheduleKind::kGPipe ? "1f1b" : "gpipe";
  CHECK_THROWS_WITH_AS(validate_plan(bad, "plan.json"),
                       doctest::Contains("auto_search[0].schedule"), Error);
}

}  // namespace
}  // namespace stagecraft::plan
