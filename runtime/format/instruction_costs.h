#pragma once
/// \file
/// What the plan's prediction charged beyond the ops' times (plan.json "instruction_costs",
/// absent when nothing was): a fixed cost per instruction kind (measured for empty instructions
/// by stagec --profile, or fitted from a measured run by stagec --calibrate) and, for a
/// calibrated plan, a factor per (stage, compute kind) on the stage's predicted op times (from
/// factors that follow the ops, per op type or op, where the calibration has them). The
/// stages' own times (fwd_ms, backward_input_ms, ...) stay the ops' times before any factor.

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace stagecraft {
class JsonObject;
class JsonValue;
}

namespace stagecraft::plan {

/// One compute kind's calibration factors that follow the ops (cost_models/calibration.h says
/// how they are fitted): a later plan gives each stage its own ops' factors.
struct OpFactorTable {
  /// What `factors` is keyed by: "op type" (a least-squares fit over the calibrated stages),
  /// "op" (a node name: each op took the factor of the stage that held it) or "kind" (none:
  /// `other` for every op).
  std::string basis;
  std::map<std::string, double> factors;
  /// The kind's factor over all calibrated stages: what an op not in `factors` gets.
  double other = 1;

  bool operator==(const OpFactorTable&) const = default;
};

struct PlanInstructionCosts {
  /// "" (none: the section is not written), "profile" or "calibration".
  std::string source;
  /// Milliseconds per instruction by kind name (FWD, SEND_ACT, ...: schedule.json's names).
  std::map<std::string, double> instruction_ms;
  /// Calibration: per stage, the factor on its op times by compute kind name (where
  /// `op_factors` is set, its ops' factors weighted by their times).
  std::vector<std::map<std::string, double>> stage_factors;
  /// Calibration: by compute kind name, factors that follow the ops; empty for a calibration
  /// whose factors apply by stage index (kept before op factors existed).
  std::map<std::string, OpFactorTable> op_factors;
  /// Calibration: per device, its delay at a step's start, milliseconds.
  std::vector<double> device_start_ms;
  std::string trace;            ///< Calibration: the measured run it was fitted from.
  double measured_step_ms = 0;  ///< Calibration: that run's median steady step.
  /// Calibration: milliseconds a step takes beyond its instructions (its barriers, its inputs
  /// handed to the devices), added to the simulated step.
  double step_overhead_ms = 0;
  /// Calibration: the step the same split simulates without it (profiled instruction costs
  /// only), milliseconds: what the plan would predict uncalibrated.
  double uncalibrated_step_ms = 0;

  bool empty() const { return source.empty(); }
};

/// One or two lines for stagec's summary and stagedump (each line starting with two spaces and
/// ending in a newline), "" for none: the fixed costs by kind and, for a calibration, the
/// trace, the measured step, and the calibrated (`predicted_step_ms`) against the uncalibrated
/// prediction.
std::string describe_instruction_costs(const PlanInstructionCosts& costs, double predicted_step_ms);

nlohmann::ordered_json instruction_costs_json(const PlanInstructionCosts& costs);

/// One line: "FWD per op type: Conv x1.300 Relu x0.900 (others x1.100); BWD per op: 41 ops took
/// their stage's factor (others x1.200); OPT_STEP x2.000 on every stage".
std::string describe_op_factors(const std::map<std::string, OpFactorTable>& op_factors);

/// "op_factors" as plan.json and the profile database write them: {KIND: {"basis": ...,
/// "other": ..., "factors": {KEY: ...}}}.
nlohmann::ordered_json op_factors_json(const std::map<std::string, OpFactorTable>& op_factors);

/// Reads "op_factors" (`op_factors_json`); throws Error(kFormat) naming the field for a key
/// that is not a compute kind, an unknown basis or a factor that is not > 0.
std::map<std::string, OpFactorTable> read_op_factors(const JsonValue& value);

/// Reads plan.json's optional "instruction_costs" (empty when absent); throws Error(kFormat)
/// naming the field for a malformed one.
PlanInstructionCosts read_instruction_costs(const JsonObject& top);

}  // namespace stagecraft::plan
