#include "runtime/format/instruction_costs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "runtime/format/json_reader.h"
#include "runtime/format/schedule.h"

namespace stagecraft::plan {
namespace {

/// Kind name -> a number >= 0, each key an instruction kind.
std::map<std::string, double> read_kind_map(const JsonValue& value) {
  std::map<std::string, double> out;
  for (const auto& [kind, number] : value.object().entries()) {
    schedule::parse_op(kind);  // refuses an unknown kind
    const double v = number.number();
    if (!(v >= 0) || !std::isfinite(v)) number.fail(fmt::format("is {}; it must be >= 0", v));
    out[kind] = v;
  }
  return out;
}

}  // namespace

std::string describe_instruction_costs(const PlanInstructionCosts& c, double predicted_step_ms) {
  if (c.empty()) return "";
  std::vector<std::string> kinds;
  for (const auto& [kind, ms] : c.instruction_ms)
    kinds.push_back(fmt::format("{} {:.4f}", kind, ms));
  std::string out =
      fmt::format("  instruction costs ({}, ms each): {}\n",
                  c.source == "calibration" ? "calibrated" : "profiled", fmt::join(kinds, ", "));
  if (c.source != "calibration") return out;
  std::vector<std::string> stages;
  for (std::size_t k = 0; k < c.stage_factors.size(); ++k) {
    std::vector<std::string> factors;
    for (const auto& [kind, f] : c.stage_factors[k])
      factors.push_back(fmt::format("{} x{:.3f}", kind, f));
    stages.push_back(fmt::format(
        "stage {}: {}", k, factors.empty() ? "-" : fmt::format("{}", fmt::join(factors, " "))));
  }
  out += fmt::format(
      "  calibrated from {} (measured step {:.3f} ms): predicted {:.3f} ms, from the profile alone "
      "{:.3f} ms; factors {}\n",
      c.trace, c.measured_step_ms, predicted_step_ms, c.uncalibrated_step_ms,
      fmt::join(stages, "; "));
  return out;
}

nlohmann::ordered_json instruction_costs_json(const PlanInstructionCosts& c) {
  nlohmann::ordered_json out{{"source", c.source}, {"instruction_ms", c.instruction_ms}};
  if (c.source == "calibration") {
    nlohmann::ordered_json stages = nlohmann::ordered_json::array();
    for (const auto& factors : c.stage_factors) stages.push_back(factors);
    out["stage_factors"] = std::move(stages);
    out["device_start_ms"] = c.device_start_ms;
    out["trace"] = c.trace;
    out["measured_step_ms"] = c.measured_step_ms;
    out["uncalibrated_step_ms"] = c.uncalibrated_step_ms;
  }
  return out;
}

PlanInstructionCosts read_instruction_costs(const JsonObject& top) {
  PlanInstructionCosts c;
  auto found = top.find("instruction_costs");
  if (!found) return c;
  JsonObject f = found->object({"source", "instruction_ms", "stage_factors", "device_start_ms",
                                "trace", "measured_step_ms", "uncalibrated_step_ms"});
  c.source = f.nonempty_string("source");
  if (c.source != "profile" && c.source != "calibration")
    f.fail("source", fmt::format("is \"{}\", not \"profile\" or \"calibration\"", c.source));
  c.instruction_ms = read_kind_map(f.at("instruction_ms"));
  if (c.source == "calibration") {
    c.stage_factors = f.array("stage_factors", [](const JsonValue& v) { return read_kind_map(v); });
    if (f.has("device_start_ms")) c.device_start_ms = f.at("device_start_ms").numbers();
    c.trace = f.string("trace");
    c.measured_step_ms = f.number("measured_step_ms");
    c.uncalibrated_step_ms = f.number("uncalibrated_step_ms");
  }
  return c;
}

}  // namespace stagecraft::plan
