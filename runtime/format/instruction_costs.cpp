#include "runtime/format/instruction_costs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "runtime/format/error.h"
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

/// A factor: a finite number > 0, else a failure naming its field.
double read_factor(const JsonValue& number) {
  const double v = number.number();
  if (!(v > 0) || !std::isfinite(v)) number.fail(fmt::format("is {}; a factor must be > 0", v));
  return v;
}

/// "FWD per op type: Conv x1.300 Relu x0.900 (others x1.100)" and the like.
std::string describe_table(const std::string& kind, const OpFactorTable& table) {
  if (table.basis == "kind") return fmt::format("{} x{:.3f} on every stage", kind, table.other);
  if (table.basis == "op")
    return fmt::format("{} per op: {} op{} took their stage's factor (others x{:.3f})", kind,
                       table.factors.size(), table.factors.size() == 1 ? "" : "s", table.other);
  std::vector<std::string> types;
  for (const auto& [type, f] : table.factors) types.push_back(fmt::format("{} x{:.3f}", type, f));
  return fmt::format("{} per op type: {} (others x{:.3f})", kind, fmt::join(types, " "),
                     table.other);
}

}  // namespace

std::string describe_op_factors(const std::map<std::string, OpFactorTable>& op_factors) {
  std::vector<std::string> kinds;
  for (const auto& [kind, table] : op_factors) kinds.push_back(describe_table(kind, table));
  return fmt::format("{}", fmt::join(kinds, "; "));
}

nlohmann::ordered_json op_factors_json(const std::map<std::string, OpFactorTable>& op_factors) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [kind, table] : op_factors)
    out[kind] = {{"basis", table.basis}, {"other", table.other}, {"factors", table.factors}};
  return out;
}

std::map<std::string, OpFactorTable> read_op_factors(const JsonValue& value) {
  std::map<std::string, OpFactorTable> out;
  for (const auto& [kind, table_json] : value.object().entries()) {
    schedule::Op op = schedule::Op::kSendAct;  // not a compute kind
    try {
      op = schedule::parse_op(kind);
    } catch (const Error&) {
    }
    if (op != schedule::Op::kForward && op != schedule::Op::kBackward &&
        op != schedule::Op::kBackwardInput && op != schedule::Op::kBackwardWeight &&
        op != schedule::Op::kOptimizerStep)
      value.fail(fmt::format(
          "has the key \"{}\", not a compute kind (FWD, BWD, BWD_INPUT, BWD_WEIGHT, OPT_STEP)",
          kind));
    JsonObject t = table_json.object({"basis", "other", "factors"});
    OpFactorTable table;
    table.basis = t.nonempty_string("basis");
    if (table.basis != "op type" && table.basis != "op" && table.basis != "kind")
      t.fail("basis",
             fmt::format("is \"{}\", not \"op type\", \"op\" or \"kind\"", table.basis));
    table.other = read_factor(t.at("other"));
    for (const auto& [key, number] : t.at("factors").object().entries())
      table.factors[key] = read_factor(number);
    out[kind] = std::move(table);
  }
  return out;
}

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
      "{:.3f} ms; {:.3f} ms a step beyond its instructions; factors {}\n",
      c.trace, c.measured_step_ms, predicted_step_ms, c.uncalibrated_step_ms, c.step_overhead_ms,
      fmt::join(stages, "; "));
  if (!c.op_factors.empty())
    out += fmt::format("  the factors follow the ops: {}\n", describe_op_factors(c.op_factors));
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
    out["step_overhead_ms"] = c.step_overhead_ms;
    out["uncalibrated_step_ms"] = c.uncalibrated_step_ms;
    if (!c.op_factors.empty()) out["op_factors"] = op_factors_json(c.op_factors);
  }
  return out;
}

PlanInstructionCosts read_instruction_costs(const JsonObject& top) {
  PlanInstructionCosts c;
  auto found = top.find("instruction_costs");
  if (!found) return c;
  JsonObject f = found->object({"source", "instruction_ms", "stage_factors", "device_start_ms",
                                "trace", "measured_step_ms", "uncalibrated_step_ms",
                                "op_factors", "step_overhead_ms"});
  c.source = f.nonempty_string("source");
  if (c.source != "profile" && c.source != "calibration")
    f.fail("source", fmt::format("is \"{}\", not \"profile\" or \"calibration\"", c.source));
  c.instruction_ms = read_kind_map(f.at("instruction_ms"));
  if (c.source == "calibration") {
    c.stage_factors = f.array("stage_factors", [](const JsonValue& v) { return read_kind_map(v); });
    if (f.has("device_start_ms")) c.device_start_ms = f.at("device_start_ms").numbers();
    c.trace = f.string("trace");
    c.measured_step_ms = f.number("measured_step_ms");
    if (f.has("step_overhead_ms")) c.step_overhead_ms = f.number("step_overhead_ms");
    c.uncalibrated_step_ms = f.number("uncalibrated_step_ms");
    if (auto ops = f.find("op_factors")) c.op_factors = read_op_factors(*ops);
  }
  return c;
}

}  // namespace stagecraft::plan
