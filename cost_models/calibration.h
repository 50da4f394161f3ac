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
///   (`device_start_ms`: the wake-up from the barrier between steps).

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/format/schedule.h"

namespace stagecraft::cost {

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
  int steps = 0;  ///< Calibration: steady steps fitted.

  bool empty() const { return instruction_ms.empty() && stage_factors.empty(); }
  /// instruction_ms of `op`, 0 when absent.
  double fixed_ms(schedule::Op op) const;
  /// The factor of `stage` for compute kind `op`, 1 when absent.
  double factor(int stage, schedule::Op op) const;
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

/// The plan's prediction of one stage's instructions, milliseconds: the ops' times the
/// simulator plays before any calibration (plan.json's stage times).
struct StagePrediction {
  double forward_ms = 0;
  double backward_input_ms = 0;   ///< B (a full BWD is B + W).
  double backward_weight_ms = 0;  ///< W.
  double optimizer_ms = 0;
};

/// Fits `InstructionTerms` (source "calibration") to `steps` (the steady steps only: the caller
/// leaves the first out) of a run of a plan whose stages `predicted` describes, as the file
/// comment says; `capacity` is the messages a link holds (schedule::link_capacity). A kind with
/// no instruction in the trace keeps `fallback`'s fixed cost; a
/// (stage, kind) with no instruction or a prediction of 0 gets no factor. Throws `Error(kUsage)`
/// when `steps` is empty or an instruction names a stage outside `predicted`.
InstructionTerms fit_calibration(const std::vector<TracedStep>& steps,
                                 const std::vector<StagePrediction>& predicted, int capacity,
                                 const InstructionTerms& fallback = {});

/// The key under which a calibration is kept in the profile database, from what decides which
/// instructions a plan runs: "fnv1a64:...|train|1f1b|2x1 stages|4 microbatches|batch 8".
std::string calibration_key(const std::string& model_hash, bool training,
                            const std::string& schedule, int devices, int chunks, int microbatches,
                            long long batch);

}  // namespace stagecraft::cost
