#pragma once
/// \file
/// What the plan's prediction charged beyond the ops' times (plan.json "instruction_costs",
/// absent when nothing was): a fixed cost per instruction kind (measured for empty instructions
/// by stagec --profile, or fitted from a measured run by stagec --calibrate) and, for a
/// calibrated plan, a factor per (stage, compute kind) on the stage's predicted op times. The
/// stages' own times (fwd_ms, backward_input_ms, ...) stay the ops' times before any factor.

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace stagecraft {
class JsonObject;
}

namespace stagecraft::plan {

struct PlanInstructionCosts {
  /// "" (none: the section is not written), "profile" or "calibration".
  std::string source;
  /// Milliseconds per instruction by kind name (FWD, SEND_ACT, ...: schedule.json's names).
  std::map<std::string, double> instruction_ms;
  /// Calibration: per stage, the factor on its op times by compute kind name.
  std::vector<std::map<std::string, double>> stage_factors;
  /// Calibration: per device, its delay at a step's start, milliseconds.
  std::vector<double> device_start_ms;
  std::string trace;            ///< Calibration: the measured run it was fitted from.
  double measured_step_ms = 0;  ///< Calibration: that run's median steady step.
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

/// Reads plan.json's optional "instruction_costs" (empty when absent); throws Error(kFormat)
/// naming the field for a malformed one.
PlanInstructionCosts read_instruction_costs(const JsonObject& top);

}  // namespace stagecraft::plan
