// Calibration factors that follow the ops (cost_models/calibration.h): fitted per op type from a
// synthetic trace whose op types run known factors slower, or per op where the stages do not
// determine that, and applied to a split with other cuts.
#include <doctest/doctest.h>

#include <random>

#include "cost_models/calibration.h"

namespace stagecraft::cost {
namespace {

using schedule::Op;

/// A synthetic run of a pipeline of `stages` (stage s on device s): `steps` steps of
/// `microbatches` forwards then as many backwards per stage, each instruction taking its ops'
/// predicted times times their op type's factor, with +-`noise` (relative, uniform) jitter and
/// a gap of 0.01 ms before it.
struct OpTypeRun {
  std::vector<StagePrediction> predicted;
  std::map<std::string, double> forward_factor, backward_factor;

  std::vector<TracedStep> run(int steps, int microbatches, double noise) const {
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> jitter(1 - noise, 1 + noise);
    std::vector<TracedStep> out;
    for (int step = 0; step < steps; ++step) {
      TracedStep events;
      for (std::size_t s = 0; s < predicted.size(); ++s) {
        double forward = 0, backward = 0;
        for (const OpPrediction& op : predicted[s].ops) {
          forward += forward_factor.at(op.op_type) * op.forward_ms;
          backward += backward_factor.at(op.op_type) * op.backward_ms;
        }
        double now_ms = 1000.0 * step;
        const int stage = static_cast<int>(s);
        auto add = [&](Op op, int mb, double ms) {
          const double start = now_ms + 0.01;
          now_ms = start + ms * jitter(rng);
          events.push_back({op, stage, stage, mb, start * 1e-3, now_ms * 1e-3, false});
        };
        for (int mb = 0; mb < microbatches; ++mb) add(Op::kForward, mb, forward);
        for (int mb = 0; mb < microbatches; ++mb) add(Op::kBackward, mb, backward);
      }
      out.push_back(std::move(events));
    }
    return out;
  }
};

/// A stage of `ops`, its times their sums (a full backward: all of it in B).
StagePrediction stage_of(std::vector<OpPrediction> ops) {
  StagePrediction p;
  for (const OpPrediction& op : ops) {
    p.forward_ms += op.forward_ms;
    p.backward_input_ms += op.backward_ms;
  }
  p.ops = std::move(ops);
  return p;
}

/// Conv 2x slower than predicted forward, MatMul 1.3x, Relu as predicted (backward: 1.5, 0.9,
/// 1.2), over three stages that mix the three op types differently.
OpTypeRun three_op_types() {
  OpTypeRun r;
  r.predicted = {
      stage_of({{"conv0", "Conv", 4.0, 8.0}, {"relu0", "Relu", 1.0, 1.0}}),
      stage_of(
          {{"conv1", "Conv", 1.0, 2.0}, {"mm1", "MatMul", 3.0, 6.0}, {"relu1", "Relu", 0.5, 0.5}}),
      stage_of({{"mm2", "MatMul", 1.0, 2.0}, {"relu2", "Relu", 3.0, 3.0}})};
  r.forward_factor = {{"Conv", 2.0}, {"MatMul", 1.3}, {"Relu", 1.0}};
  r.backward_factor = {{"Conv", 1.5}, {"MatMul", 0.9}, {"Relu", 1.2}};
  return r;
}

/// The factors a split gives the stage holding `ops` (name, type, forward, backward).
std::map<std::string, double> stage_factors_of(const InstructionTerms& terms,
                                               const std::vector<OpPrediction>& ops) {
  StageFactorSum sum;
  for (const OpPrediction& op : ops)
    sum.add(terms.factors_of(op.name, op.op_type), op.forward_ms, op.backward_ms, 0.0);
  return terms.for_split({sum}).stage_factors.at(0);
}

TEST_CASE(
    "calibration recovers known per-op-type slowdowns within 5% where the stages determine "
    "them") {
  const OpTypeRun r = three_op_types();
  const InstructionTerms terms = fit_calibration(r.run(8, 4, 0.05), r.predicted, 2);
  REQUIRE(terms.follows_ops());
  const OpFactorTable& forward = terms.op_factors.at("FWD");
  const OpFactorTable& backward = terms.op_factors.at("BWD");
  CHECK(forward.basis == "op type");
  CHECK(backward.basis == "op type");
  REQUIRE(forward.factors.size() == 3);
  REQUIRE(backward.factors.size() == 3);
  for (const auto& [type, factor] : r.forward_factor)
    CHECK(forward.factors.at(type) == doctest::Approx(factor).epsilon(0.05));
  for (const auto& [type, factor] : r.backward_factor)
    CHECK(backward.factors.at(type) == doctest::Approx(factor).epsilon(0.05));
}

TEST_CASE("a calibration applied to other cuts gives each stage the factors of its own ops") {
  const OpTypeRun r = three_op_types();
  const InstructionTerms terms = fit_calibration(r.run(8, 4, 0.0), r.predicted, 2);
  REQUIRE(terms.op_factors.at("FWD").basis == "op type");
  // New cuts: the Convs alone, then the rest. By stage index the first stage would get the
  // calibrated stage 0's mix (conv0 and relu0: (8 + 1) / 5 = 1.8 forward); its own ops give 2.
  const std::map<std::string, double> convs =
      stage_factors_of(terms, {{"conv0", "Conv", 4.0, 8.0}, {"conv1", "Conv", 1.0, 2.0}});
  CHECK(convs.at("FWD") == doctest::Approx(2.0).epsilon(1e-6));
  CHECK(convs.at("BWD") == doctest::Approx(1.5).epsilon(1e-6));
  const std::map<std::string, double> rest = stage_factors_of(
      terms, {{"mm1", "MatMul", 3.0, 6.0}, {"relu2", "Relu", 3.0, 3.0}, {"new", "Gemm", 2.0, 0.0}});
  // Weighted by the ops' times; the Gemm, which no calibrated stage held, gets the forward
  // factor over all stages.
  const double other = terms.op_factors.at("FWD").other;
  CHECK(other > 1.0);
  CHECK(rest.at("FWD") == doctest::Approx((3.0 * 1.3 + 3.0 * 1.0 + 2.0 * other) / 8.0));
  CHECK(rest.at("BWD") == doctest::Approx((6.0 * 0.9 + 3.0 * 1.2) / 9.0));
}

TEST_CASE(
    "with fewer stages than op types each op takes its stage's factor, and keeps it when "
    "the cuts move") {
  OpTypeRun r = three_op_types();
  r.predicted = {stage_of({{"conv0", "Conv", 4.0, 8.0}, {"relu0", "Relu", 1.0, 1.0}}),
                 stage_of({{"mm1", "MatMul", 3.0, 6.0}, {"relu1", "Relu", 1.0, 1.0}})};
  const InstructionTerms terms = fit_calibration(r.run(4, 4, 0.0), r.predicted, 2);
  const OpFactorTable& forward = terms.op_factors.at("FWD");
  CHECK(forward.basis == "op");
  const double stage0 = terms.stage_factors.at(0).at("FWD"),
               stage1 = terms.stage_factors.at(1).at("FWD");
  CHECK(stage0 == doctest::Approx((4.0 * 2.0 + 1.0) / 5.0));
  CHECK(stage1 == doctest::Approx((3.0 * 1.3 + 1.0) / 4.0));
  CHECK(forward.factors.at("conv0") == doctest::Approx(stage0));
  CHECK(forward.factors.at("relu0") == doctest::Approx(stage0));
  CHECK(forward.factors.at("mm1") == doctest::Approx(stage1));
  // The same cuts get the stage factors back; relu0 moved to the second stage takes its own.
  CHECK(stage_factors_of(terms, r.predicted[0].ops).at("FWD") == doctest::Approx(stage0));
  const std::map<std::string, double> moved = stage_factors_of(
      terms,
      {{"relu0", "Relu", 1.0, 1.0}, {"mm1", "MatMul", 3.0, 6.0}, {"relu1", "Relu", 1.0, 1.0}});
  CHECK(moved.at("FWD") == doctest::Approx((1.0 * stage0 + 4.0 * stage1) / 5.0));
}

TEST_CASE("stages that mix the op types too alike to tell them apart get factors per op") {
  // Two stages, two op types, but the second's Relu is 5% of its time: the least-squares factor
  // of Relu would take the whole difference of the stages, times 20.
  OpTypeRun r = three_op_types();
  r.predicted = {stage_of({{"mm0", "MatMul", 2.0, 4.0}}),
                 stage_of({{"mm1", "MatMul", 1.9, 3.8}, {"relu1", "Relu", 0.1, 0.2}})};
  const InstructionTerms terms = fit_calibration(r.run(4, 4, 0.0), r.predicted, 2);
  CHECK(terms.op_factors.at("FWD").basis == "op");
  CHECK(terms.op_factors.at("BWD").basis == "op");
}

TEST_CASE("without the plan's ops, or kept before op factors, factors apply by stage index") {
  const OpTypeRun r = three_op_types();
  std::vector<StagePrediction> bare = r.predicted;
  for (StagePrediction& stage : bare) stage.ops.clear();
  const InstructionTerms terms = fit_calibration(r.run(3, 2, 0.0), bare, 2);
  CHECK_FALSE(terms.follows_ops());
  CHECK(terms.for_split({StageFactorSum{}}).stage_factors == terms.stage_factors);
  CHECK(terms.factor(0, Op::kForward) == doctest::Approx((4.0 * 2.0 + 1.0) / 5.0));
}

}  // namespace
}  // namespace stagecraft::cost
