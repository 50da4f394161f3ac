// Calibration from measured runs (cost_models/calibration.h): the fit recovers known fixed costs
// and factors from a synthetic trace, and the profile database keeps both new sections.
#include "cost_models/calibration.h"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "cost_models/profile_db.h"
#include "runtime/format/error.h"

namespace stagecraft::cost {
namespace {

using schedule::Op;

/// A synthetic run of a 2-stage pipeline (stage s on device s), `steps` steps of `microbatches`
/// microbatches, each instruction's slice f_{s,k} x p_{s,k} and the gap before it c_k, both
/// with +-`noise` (relative, uniform) jitter.
struct Synthetic {
  std::vector<StagePrediction> predicted{{2.0, 3.0, 1.0, 0.5, {}, false},
                                          {4.0, 5.0, 2.0, 0.25, {}, false}};
  std::map<std::pair<int, Op>, double> factor{
      {{0, Op::kForward}, 1.3}, {{0, Op::kBackward}, 1.1}, {{0, Op::kOptimizerStep}, 2.0},
      {{1, Op::kForward}, 0.8}, {{1, Op::kBackward}, 1.6}, {{1, Op::kOptimizerStep}, 3.0}};
  std::map<Op, double> fixed_ms{{Op::kForward, 0.05},      {Op::kBackward, 0.08},
                                {Op::kSendAct, 0.03},      {Op::kSendGrad, 0.04},
                                {Op::kRecvAct, 0.02},      {Op::kRecvGrad, 0.025},
                                {Op::kOptimizerStep, 0.06}};

  std::vector<TracedStep> run(int steps, int microbatches, double noise) const {
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> jitter(1 - noise, 1 + noise);
    std::vector<TracedStep> out;
    for (int step = 0; step < steps; ++step) {
      TracedStep events;
      for (int stage = 0; stage < 2; ++stage) {
        double now_ms = 1000.0 * step;
        auto add = [&](Op op, int mb, double slice_ms) {
          const double gap = fixed_ms.count(op) && op != Op::kSendAct && op != Op::kSendGrad
                                 ? fixed_ms.at(op) * jitter(rng)
                                 : 0.0;
          const double start = now_ms + gap;
          now_ms = start + slice_ms;
          events.push_back({op, stage, stage, mb, start * 1e-3, now_ms * 1e-3, false});
        };
        auto compute = [&](Op op, int mb) {
          const StagePrediction& p = predicted[static_cast<size_t>(stage)];
          const double ms = op == Op::kForward    ? p.forward_ms
                            : op == Op::kBackward ? p.backward_input_ms + p.backward_weight_ms
                                                  : p.optimizer_ms;
          add(op, mb, factor.at({stage, op}) * ms * jitter(rng));
        };
        for (int mb = 0; mb < microbatches; ++mb) {
          if (stage == 1) add(Op::kRecvAct, mb, 0.0);
          compute(Op::kForward, mb);
          if (stage == 0) add(Op::kSendAct, mb, fixed_ms.at(Op::kSendAct) * jitter(rng));
        }
        for (int mb = 0; mb < microbatches; ++mb) {
          if (stage == 0) add(Op::kRecvGrad, mb, 0.0);
          compute(Op::kBackward, mb);
          if (stage == 1) add(Op::kSendGrad, mb, fixed_ms.at(Op::kSendGrad) * jitter(rng));
        }
        compute(Op::kOptimizerStep, -1);
      }
      out.push_back(std::move(events));
    }
    return out;
  }
};

TEST_CASE("calibration recovers known per-instruction costs and per-stage factors within 5%") {
  const Synthetic synthetic;
  const InstructionTerms terms =
      fit_calibration(synthetic.run(9, 4, 0.05), synthetic.predicted, 100);
  CHECK(terms.source == "calibration");
  CHECK(terms.steps == 9);
  REQUIRE(terms.stage_factors.size() == 2);
  for (const auto& [key, factor] : synthetic.factor) {
    INFO("stage ", key.first, " ", schedule::to_string(key.second));
    CHECK(terms.factor(key.first, key.second) == doctest::Approx(factor).epsilon(0.05));
  }
  for (const auto& [op, ms] : synthetic.fixed_ms) {
    INFO(schedule::to_string(op));
    // A receive that never waited (slice 0 here): the gap before it is its fixed cost.
    CHECK(terms.fixed_ms(op) == doctest::Approx(ms).epsilon(0.05));
  }
  // A kind the plan never ran keeps the fallback's cost; the fit of a kind replaces it.
  InstructionTerms fallback;
  fallback.instruction_ms = {{"BWD_INPUT", 0.5}, {"FWD", 9.0}};
  const InstructionTerms with =
      fit_calibration(synthetic.run(3, 2, 0), synthetic.predicted, 100, fallback);
  CHECK(with.fixed_ms(Op::kBackwardInput) == doctest::Approx(0.5));
  CHECK(with.fixed_ms(Op::kForward) == doctest::Approx(0.05));
}

TEST_CASE("calibration counts a recomputed forward in the backward after it") {
  std::vector<StagePrediction> predicted{{1.0, 3.0, 0.0, 0.0, {}, false}};
  TracedStep step{{Op::kForward, 0, 0, 0, 0.000, 0.001, false},
                  {Op::kForward, 0, 0, 0, 0.001, 0.002, true},
                  {Op::kBackward, 0, 0, 0, 0.002, 0.005, false}};
  const InstructionTerms terms = fit_calibration({step}, predicted, 2);
  CHECK(terms.factor(0, Op::kBackward) == doctest::Approx(4.0 / 3.0));
  CHECK(terms.factor(0, Op::kForward) == doctest::Approx(1.0));
}

TEST_CASE("a receive's fixed cost counts from its message's send, a device's delay from the step") {
  // Device 1 waits in RECV_ACT from 0 to 5 ms; device 0 starts 4 ms into the step and sends at
  // 4 ms: the receive's own part is 1 ms (the wake-up), the rest was device 0's.
  TracedStep step{{Op::kSendAct, 0, 0, 0, 0.004, 0.0041, false},
                  {Op::kRecvAct, 1, 1, 0, 0.000, 0.005, false}};
  const InstructionTerms terms =
      fit_calibration({step}, {{1, 0, 0, 0, {}, false}, {1, 0, 0, 0, {}, false}}, 1);
  CHECK(terms.fixed_ms(Op::kRecvAct) == doctest::Approx(1.0));
  CHECK(terms.fixed_ms(Op::kSendAct) == doctest::Approx(0.1));
  REQUIRE(terms.device_start_ms.size() == 2);
  CHECK(terms.device_start_ms[0] == doctest::Approx(4.0));
  CHECK(terms.device_start_ms[1] == doctest::Approx(0.0));
}

TEST_CASE("calibration fits what a step takes beyond its instructions") {
  // Three steps whose instructions span 5 ms each (device 1 starts 1 ms after device 0); the
  // measured steps are 5.4, 5.3 and 5.9 ms long: 0.4, 0.3 and 0.9 beyond, median 0.4.
  std::vector<TracedStep> steps;
  for (int s = 0; s < 3; ++s) {
    const double t0 = 0.010 * s;
    steps.push_back({{Op::kForward, 0, 0, 0, t0, t0 + 0.002, false},
                     {Op::kForward, 1, 1, 0, t0 + 0.001, t0 + 0.005, false}});
  }
  const std::vector<StagePrediction> predicted{{2, 0, 0, 0, {}, false}, {4, 0, 0, 0, {}, false}};
  const InstructionTerms terms = fit_calibration(steps, predicted, 1, {}, {5.4, 5.3, 5.9});
  CHECK(terms.step_overhead_ms == doctest::Approx(0.4));
  // Without the steps' lengths, and for steps shorter than their instructions (a clock that
  // disagrees), nothing.
  CHECK(fit_calibration(steps, predicted, 1).step_overhead_ms == 0);
  CHECK(fit_calibration(steps, predicted, 1, {}, {4.0, 4.5, 4.9}).step_overhead_ms == 0);
  CHECK_THROWS_WITH_AS(fit_calibration(steps, predicted, 1, {}, {5.0}),
                       doctest::Contains("1 step lengths for 3 traced steps"), Error);
}

TEST_CASE("calibration refuses no steps and a stage outside the plan") {
  CHECK_THROWS_WITH_AS(fit_calibration({}, {{1, 0, 0, 0, {}, false}}, 2),
                       doctest::Contains("at least one steady step"), Error);
  TracedStep step{{Op::kForward, 0, 3, 0, 0, 0.001, false}};
  CHECK_THROWS_WITH_AS(fit_calibration({step}, {{1, 0, 0, 0, {}, false}}, 2),
                       doctest::Contains("names stage 3; the plan has 1 stages"), Error);
}

TEST_CASE("the profile database keeps instruction costs and calibrations, and reads old files") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("stagecraft_calibration_db_" + std::to_string(std::random_device{}()));
  const std::string path = (dir / "db.json").string();
  ProfileDb db("cpu", 1);
  db.put("MatMul(x)", {"MatMul", 0.5, 10, {}});
  db.set_instruction_ms({{"FWD", 0.004}, {"SEND_ACT", 0.002}});
  InstructionTerms terms;
  terms.source = "calibration";
  terms.trace = "run.json";
  terms.measured_step_ms = 12.5;
  terms.steps = 9;
  terms.instruction_ms = {{"FWD", 0.05}, {"RECV_ACT", 0.01}};
  terms.stage_factors = {{{"FWD", 1.25}}, {{"BWD", 0.75}, {"OPT_STEP", 2.0}}};
  terms.device_start_ms = {0.0, 0.5};
  terms.step_overhead_ms = 0.07;
  terms.op_factors = {{"FWD", {"op type", {{"Conv", 2.0}, {"Relu", 1.0}}, 1.5}},
                      {"BWD", {"op", {{"conv0", 1.25}}, 1.1}},
                      {"OPT_STEP", {"kind", {}, 2.0}}};
  const std::string key = calibration_key("fnv1a64:00", true, "1f1b", 2, 1, 4, 8);
  CHECK(key == "fnv1a64:00|train|1f1b|2x1 stages|4 microbatches|batch 8");
  db.put_calibration(key, terms);
  db.save(path);
  const ProfileDb back = ProfileDb::load(path);
  CHECK(back.instruction_ms() == db.instruction_ms());
  REQUIRE(back.find_calibration(key) != nullptr);
  const InstructionTerms& got = *back.find_calibration(key);
  CHECK(got.trace == "run.json");
  CHECK(got.steps == 9);
  CHECK(got.measured_step_ms == doctest::Approx(12.5));
  CHECK(got.instruction_ms == terms.instruction_ms);
  CHECK(got.stage_factors == terms.stage_factors);
  CHECK(got.device_start_ms == terms.device_start_ms);
  CHECK(got.step_overhead_ms == doctest::Approx(0.07));
  CHECK(got.op_factors == terms.op_factors);
  CHECK(back.find_calibration("another") == nullptr);

  // A version-1 file and a version-2 file without the new sections are read as before.
  for (const char* text :
       {R"({"format": "stagecraft-profile", "version": 1, "backend": "cpu", "threads": 1,
            "entries": {"k": {"op": "Relu", "fwd_ms": 0.1, "runs": 3}}})",
        R"({"format": "stagecraft-profile", "version": 2, "backend": "cpu", "threads": 1,
            "entries": {"k": {"op": "Relu", "fwd_ms": 0.1, "runs": 3, "backward": {}}}})"}) {
    std::ofstream(path) << text;
    const ProfileDb old = ProfileDb::load(path);
    CHECK(old.size() == 1);
    CHECK(old.instruction_ms().empty());
    CHECK(old.calibrations().empty());
  }
  // A calibration kept before op factors existed applies by stage index.
  std::ofstream(path) << R"({"format": "stagecraft-profile", "version": 2, "backend": "cpu",
      "threads": 1, "entries": {}, "calibration": {"k": {"trace": "t", "measured_step_ms": 1,
      "steps": 2, "instruction_ms": {}, "stage_factors": [{"FWD": 1.5}]}}})";
  const ProfileDb old = ProfileDb::load(path);
  REQUIRE(old.find_calibration("k") != nullptr);
  CHECK_FALSE(old.find_calibration("k")->follows_ops());
  CHECK(old.find_calibration("k")->factor(0, schedule::Op::kForward) == 1.5);
  // A malformed section is refused naming the field.
  std::ofstream(path) << R"({"format": "stagecraft-profile", "version": 2, "backend": "cpu",
      "threads": 1, "entries": {}, "calibration": {"k": {"trace": "t", "measured_step_ms": 1,
      "steps": 2, "instruction_ms": {}, "stage_factors": [],
      "op_factors": {"FWD": {"basis": "signature", "other": 1, "factors": {}}}}}})";
  CHECK_THROWS_WITH_AS(ProfileDb::load(path),
                       doctest::Contains("op_factors[\"FWD\"].basis' is \"signature\""), Error);
  std::ofstream(path) << R"({"format": "stagecraft-profile", "version": 2, "backend": "cpu",
      "threads": 1, "entries": {}, "instruction_ms": {"FORWARD": 0.1}})";
  CHECK_THROWS_WITH_AS(ProfileDb::load(path), doctest::Contains("not an instruction kind"), Error);
  std::ofstream(path) << R"({"format": "stagecraft-profile", "version": 2, "backend": "cpu",
      "threads": 1, "entries": {}, "calibration": {"k": {"trace": "t", "measured_step_ms": 1,
      "steps": 2, "instruction_ms": {}, "stage_factors": [{"FWD": 0}]}}})";
  CHECK_THROWS_WITH_AS(ProfileDb::load(path), doctest::Contains("must be > 0"), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stagecraft::cost
