#pragma once
/// \file
/// Per-instruction costs and calibration from measured runs.
///
/// The simulator (compiler/schedule/simulator.h) plays each instruction for the time of its
/// stage's ops. What the runtime spends around those ops (handing an instruction to the device's
/// thread, assembling its arguments, pushing a message through the transport, popping one) is a
/// fixed cost per instruction kind: `InstructionTerms::instruction_ms`, measured by the profiler
/// (tools/profile/instruction_costs.h) for an empty instruction of each kind, or fitted from a
/// measured run. A measured run also shows how far the ops' summed times are from what a stage's
/// instruction really takes (caches, threads, the other stages computing beside it):
/// `stage_factors`, per stage and compute kind, fitted by `fit_calibration`.
///
/// The fit, over the traced instructions of the steady steps (the first step is left out): an
/// instruction i of kind k on stage s occupies its device for its slice d_i (start to end) plus
/// the gap g_i since the device's previous traced event ended (the runtime's dispatch: what it
/// does between instructions). The model is d_i + g_i = c_k + f_{s,k} p_{s,k}, with p the
/// plan's prediction of the instruction's ops. The gap is what separates c from f (with one
/// prediction per (stage, kind), c and f would otherwise not be identifiable):
/// - compute kinds (FWD, BWD, BWD_INPUT, BWD_WEIGHT, OPT_STEP): c_k is the least-squares constant
///   of the gaps (their mean), f_{s,k} the least-squares slope through the origin of the slices
///   against p (sum d p / sum p^2); a forward the runtime re-ran for recomputation counts in the
///   backward after it, as the plan's backward time includes it;
/// - SEND_ACT, SEND_GRAD, RECV_ACT, RECV_GRAD: c_k is the mean gap plus the mean time from the
///   moment the peer released the instruction (for a receive the start of the matching send:
///   SEND_ACT of stage s - 1, SEND_GRAD of stage s + 1, same microbatch and step; for a send the
///   end of the peer's receive of the message `capacity` before it, which made room on the
///   link), or its own start if later, to its end: the hand-off (a waiting thread's wake-up,
///   which a loaded machine delays, the push or the pop); the wait before that is the peer's
///   work, which the simulator plays itself;
/// - ALLREDUCE, ALLREDUCE_SHARED (and an exchange with no matching peer instruction): c_k is the
///   mean gap plus the 10th percentile of the slices (one that did not wait);
/// - per device, the mean delay of its first instruction after the step's first one
///   (`device_start_ms`: the wake-up from the barrier between steps);
/// - per step, what it takes beyond its instructions (`step_overhead_ms`): its measured length
///   (stagerun's step: the barriers at its start and end, the inputs handed to the devices)
///   less the span of its traced instructions, the median over the steps. The simulator adds
///   it to the step it plays.
///
/// Factors that follow the ops (`InstructionTerms::op_factors`). A factor indexed by stage
/// belongs to the ops that stage held: a plan with other cuts would apply it to other ops. The
/// trace times instructions, not ops: per compute kind it gives one measured factor per stage,
/// F_s, against the stage's ops' predicted times. When the plan lists its ops (plan.json "ops"),
/// `fit_calibration` turns the F_s into factors keyed by what a later plan finds again:
/// - by op type (FWD and BWD) where the stages determine them: with w_{s,g} the share of op type
///   g in stage s's predicted ops' time, F_s = sum_g f_g w_{s,g} for every stage is solved by
///   least squares when there are at least as many stages as op types, the stages mix the op
///   types differently enough to tell them apart (no pivot of the normal equations below 1/100
///   of their largest diagonal entry: else a stage factor's noise is amplified many times) and
///   every f_g comes out positive. A pipeline of a few stages over a model of many op types
///   is not determined; a model of few op types over more stages is;
/// - otherwise by op (node name): each op takes the factor of the stage that held it. The same
///   cuts get the same stage factors back, and a cut that moves takes each op's factor with it.
///   BWD_INPUT and BWD_WEIGHT always (the plan's ops do not split B from W);
/// - OPT_STEP, which no op's time predicts: one factor for every stage (basis "kind").
/// Each table's `other`, what an op not in it gets (a node the calibrated plan did not have),
/// is the kind's factor over all stages (sum d p / sum p^2). A later plan gives each stage, per
/// kind, its ops' factors weighted by their predicted times (`StageFactorSum`); a stage's extras
/// beyond its ops (gradient accumulation, a recomputed forward) take the same factor. A
/// calibration kept before op factors existed (no `op_factors`) applies by stage index.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/format/instruction_costs.h"
#include "runtime/format/schedule.h"

namespace stagecraft::cost {

/// One compute kind's factors that follow the ops (the file comment says how they are fitted):
/// plain data that plan.json carries too.
using OpFactorTable = plan::OpFactorTable;

/// One op's factors on its predicted times, by compute kind (1: none).
struct OpFactors {
  double forward = 1;
  double backward = 1;         ///< A full BWD.
  double backward_input = 1;   ///< B of a split backward.
  double backward_weight = 1;  ///< W of a split backward.
};

class StageFactorSum;

/// What the simulator charges beyond the ops' times: fixed costs by instruction kind and, after
/// a calibration, per-(stage, kind) factors on the ops' times.
struct InstructionTerms {
  /// Milliseconds per instruction, by kind name ("FWD", "SEND_ACT", ...: schedule::to_string);
  /// a kind not present costs 0.
  std::map<std::string, double> instruction_ms;
  /// Per stage, factor on its predicted op time by compute kind name ("FWD", "BWD",
  /// "BWD_INPUT", "BWD_WEIGHT", "OPT_STEP"); a kind not present, or a stage past the end, 1.
  std::vector<std::map<std::string, double>> stage_factors;
  /// Where they come from: "profile" (measured empty instructions) or "calibration".
  std::string source;
  /// Calibration: per device, when it starts its first instruction of a step after the step's
  /// first device, milliseconds (the wake-up from the step's barrier); empty: all at once.
  std::vector<double> device_start_ms;
  std::string trace;  ///< Calibration: the trace it was fitted from.
  /// Calibration: the median measured step of that trace (steady steps), milliseconds.
  double measured_step_ms = 0;
  /// Calibration: milliseconds a step takes beyond its instructions (the file comment).
  double step_overhead_ms = 0;
  int steps = 0;  ///< Calibration: steady steps fitted.
  /// Calibration: per compute kind name, factors that follow the ops, which a plan with other
  /// cuts applies to each stage's own ops (`StageFactorSum`) in place of `stage_factors`; empty
  /// in calibrations kept before them, and when the calibrated plan listed no ops.
  std::map<std::string, OpFactorTable> op_factors;

  bool empty() const { return instruction_ms.empty() && stage_factors.empty(); }
  /// instruction_ms of `op`, 0 when absent.
  double fixed_ms(schedule::Op op) const;
  /// The factor of `stage` for compute kind `op`, 1 when absent.
  double factor(int stage, schedule::Op op) const;
  /// Whether the factors follow the ops (`op_factors`) rather than the stage indices.
  bool follows_ops() const { return !op_factors.empty(); }
  /// The factors of the op `name` of type `op_type` (1 for a kind without a table).
  OpFactors factors_of(const std::string& name, const std::string& op_type) const;
  /// These terms for one split, whose stage k holds the ops `stages[k]` summed: `stage_factors`
  /// from `op_factors` (each stage its ops' factors weighted by their times), without
  /// `op_factors` (what the simulator reads, cheap to copy). Unchanged when !follows_ops().
  InstructionTerms for_split(const std::vector<StageFactorSum>& stages) const;
};

/// A stage's ops' factors weighted by their predicted times, summed op by op: what a plan with
/// other cuts than the calibrated one charges each stage (`InstructionTerms::for_split`).
class StageFactorSum {
 public:
  /// Adds one op: its factors and predicted times (any unit, the same for every op).
  void add(const OpFactors& factors, double forward, double backward_input,
           double backward_weight);
  /// The stage's factor by compute kind name, for each kind `terms.op_factors` has: the
  /// weighted mean of its ops' factors, or the kind's `other` when its ops take no time of it.
  std::map<std::string, double> factors(const InstructionTerms& terms) const;

 private:
  double forward_ = 0, forward_weighted_ = 0;
  double backward_ = 0, backward_weighted_ = 0;
  double input_ = 0, input_weighted_ = 0;
  double weight_ = 0, weight_weighted_ = 0;
};

/// What a plan charges: the profiled fixed costs, and the calibration the profile database
/// holds for the plan's key, if any (which then replaces them).
struct TermsChoice {
  InstructionTerms profiled;
  std::optional<InstructionTerms> calibrated;
};

/// One instruction of a traced run (seconds from the run's start).
struct TracedInstruction {
  schedule::Op op = schedule::Op::kForward;
  int device = 0;
  int stage = 0;
  int microbatch = 0;
  double start_s = 0;
  double end_s = 0;
  bool recompute = false;  ///< A forward re-run just before its backward (not in the schedule).
};

/// One step of a traced run: every device's instructions.
using TracedStep = std::vector<TracedInstruction>;

/// One op of a stage as the plan predicted it (plan.json "ops"), milliseconds.
struct OpPrediction {
  std::string name;     ///< The node's name.
  std::string op_type;  ///< "Conv", "MatMul", ...: the head of its signature key.
  double forward_ms = 0;
  double backward_ms = 0;  ///< B + W.
};

/// The plan's prediction of one stage's instructions, milliseconds: the ops' times the
/// simulator plays before any calibration (plan.json's stage times).
struct StagePrediction {
  double forward_ms = 0;
  double backward_input_ms = 0;   ///< B (a full BWD is B + W).
  double backward_weight_ms = 0;  ///< W.
  double optimizer_ms = 0;
  /// The stage's ops; none: the fit keeps only stage factors (no `op_factors`).
  std::vector<OpPrediction> ops;
  bool recompute = false;  ///< Its backward re-runs its forward first (plan.json "recompute").
};

/// Fits `InstructionTerms` (source "calibration") to `steps` (the steady steps only: the caller
/// leaves the first out) of a run of a plan whose stages `predicted` describes, as the file
/// comment says; `capacity` is the messages a link holds (schedule::link_capacity). A kind with
/// no instruction in the trace keeps `fallback`'s fixed cost; a
/// (stage, kind) with no instruction or a prediction of 0 gets no factor. `step_ms`: each
/// step's measured length, milliseconds, in the order of `steps` (empty: no step overhead).
/// Throws `Error(kUsage)` when `steps` is empty, an instruction names a stage outside
/// `predicted`, or `step_ms` is given for another number of steps.
InstructionTerms fit_calibration(const std::vector<TracedStep>& steps,
                                 const std::vector<StagePrediction>& predicted, int capacity,
                                 const InstructionTerms& fallback = {},
                                 const std::vector<double>& step_ms = {});

/// The factors that follow the ops (the file comment says which basis each kind gets), from
/// what `fit_calibration` measured: per stage its factor by compute kind name
/// (`stage_factors`), per kind its factor over all stages (`kind_factors`), and the stages' ops
/// (`predicted`). Empty when no stage lists its ops.
std::map<std::string, OpFactorTable> fit_op_factors(
    const std::vector<std::map<std::string, double>>& stage_factors,
    const std::map<std::string, double>& kind_factors,
    const std::vector<StagePrediction>& predicted);

/// The key under which a calibration is kept in the profile database, from what decides which
/// instructions a plan runs: "fnv1a64:...|train|1f1b|2x1 stages|4 microbatches|batch 8".
std::string calibration_key(const std::string& model_hash, bool training,
                            const std::string& schedule, int devices, int chunks, int microbatches,
                            long long batch);

}  // namespace stagecraft::cost
