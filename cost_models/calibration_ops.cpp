// Factors that follow the ops (cost_models/calibration.h, "Factors that follow the ops"): the
// fit from stage factors to op-type or per-op factors, and what a split of the ops charges.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cost_models/calibration.h"

namespace stagecraft::cost {
namespace {

using schedule::Op;

const std::string& kind_name(Op op) {
  static const std::string forward = schedule::to_string(Op::kForward),
                           backward = schedule::to_string(Op::kBackward),
                           input = schedule::to_string(Op::kBackwardInput),
                           weight = schedule::to_string(Op::kBackwardWeight),
                           optimizer = schedule::to_string(Op::kOptimizerStep);
  switch (op) {
    case Op::kForward:
      return forward;
    case Op::kBackward:
      return backward;
    case Op::kBackwardInput:
      return input;
    case Op::kBackwardWeight:
      return weight;
    default:
      return optimizer;
  }
}

/// The predicted time of `op` that instructions of `kind` run: its forward for FWD, else its
/// backward (with the forward a recomputing stage re-runs before it, for BWD).
double op_ms(const OpPrediction& op, const std::string& kind, bool recompute) {
  if (kind == kind_name(Op::kForward)) return op.forward_ms;
  if (kind == kind_name(Op::kBackward)) return op.backward_ms + (recompute ? op.forward_ms : 0.0);
  return op.backward_ms;
}

/// The least-squares solution of rows x = rhs (rows: equations, columns: unknowns) through its
/// normal equations, by Gaussian elimination with partial pivoting; nullopt when it is not
/// determined: fewer equations than unknowns, or a pivot below 1/100 of the normal matrix's
/// largest diagonal entry. Below that the columns (op types) are too alike across the equations
/// (stages) to tell apart, and the noise of a measured stage factor would come out many times
/// over in the op types' factors: two stages of one op type each, one of them with 5% of another
/// op type's time, would give that type the whole difference of the two stages, times 20.
std::optional<std::vector<double>> least_squares(const std::vector<std::vector<double>>& rows,
                                                 const std::vector<double>& rhs) {
  const std::size_t n = rows.empty() ? 0 : rows.front().size();
  if (n == 0 || rows.size() < n) return std::nullopt;
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0.0));  // [A^T A | A^T y]
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) a[i][j] += rows[r][i] * rows[r][j];
      a[i][n] += rows[r][i] * rhs[r];
    }
  double largest = 0;
  for (std::size_t i = 0; i < n; ++i) largest = std::max(largest, a[i][i]);
  for (std::size_t col = 0; col < n; ++col) {
    std::size_t pivot = col;
    for (std::size_t r = col + 1; r < n; ++r)
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    if (!(std::fabs(a[pivot][col]) >= 1e-2 * largest)) return std::nullopt;
    std::swap(a[col], a[pivot]);
    for (std::size_t r = 0; r < n; ++r) {
      if (r == col) continue;
      const double m = a[r][col] / a[col][col];
      for (std::size_t j = col; j <= n; ++j) a[r][j] -= m * a[col][j];
    }
  }
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = a[i][n] / a[i][i];
  return x;
}

/// Per op type, the factor of `kind` (FWD or BWD) that explains every stage's factor as the
/// mix of its op types' (the file comment); nullopt where the stages do not determine it.
std::optional<std::map<std::string, double>> fit_by_op_type(
    const std::string& kind, const std::vector<std::map<std::string, double>>& stage_factors,
    const std::vector<StagePrediction>& predicted) {
  std::vector<std::map<std::string, double>> shares;  // per equation: op type -> share
  std::vector<double> rhs;
  std::set<std::string> types;
  for (std::size_t s = 0; s < predicted.size() && s < stage_factors.size(); ++s) {
    const auto factor = stage_factors[s].find(kind);
    if (factor == stage_factors[s].end()) continue;
    std::map<std::string, double> share;
    double total = 0;
    for (const OpPrediction& op : predicted[s].ops) {
      const double ms = op_ms(op, kind, predicted[s].recompute);
      if (!(ms > 0)) continue;
      share[op.op_type] += ms;
      total += ms;
    }
    if (!(total > 0)) continue;
    for (auto& [type, ms] : share) {
      ms /= total;
      types.insert(type);
    }
    shares.push_back(std::move(share));
    rhs.push_back(factor->second);
  }
  std::vector<std::vector<double>> rows;
  for (const auto& share : shares) {
    rows.emplace_back();
    for (const std::string& type : types) {
      auto it = share.find(type);
      rows.back().push_back(it == share.end() ? 0.0 : it->second);
    }
  }
  const auto solution = least_squares(rows, rhs);
  if (!solution) return std::nullopt;
  std::map<std::string, double> out;
  std::size_t i = 0;
  for (const std::string& type : types) {
    const double f = (*solution)[i++];
    if (!std::isfinite(f) || !(f > 0)) return std::nullopt;
    out[type] = f;
  }
  return out;
}

}  // namespace

std::map<std::string, OpFactorTable> fit_op_factors(
    const std::vector<std::map<std::string, double>>& stage_factors,
    const std::map<std::string, double>& kind_factors,
    const std::vector<StagePrediction>& predicted) {
  std::map<std::string, OpFactorTable> out;
  bool listed = false;
  for (const StagePrediction& stage : predicted) listed = listed || !stage.ops.empty();
  if (!listed) return out;
  for (const auto& [kind, other] : kind_factors) {
    OpFactorTable table;
    table.other = other;
    // The plan's ops split neither B from W nor carry the optimizer step: only FWD and BWD can
    // be fitted by op type.
    const bool by_op_type = kind == kind_name(Op::kForward) || kind == kind_name(Op::kBackward);
    std::optional<std::map<std::string, double>> by_type;
    if (by_op_type) by_type = fit_by_op_type(kind, stage_factors, predicted);
    if (kind == kind_name(Op::kOptimizerStep)) {
      table.basis = "kind";
    } else if (by_type) {
      table.basis = "op type";
      table.factors = std::move(*by_type);
    } else {
      table.basis = "op";
      for (std::size_t s = 0; s < predicted.size() && s < stage_factors.size(); ++s) {
        const auto factor = stage_factors[s].find(kind);
        if (factor == stage_factors[s].end()) continue;
        for (const OpPrediction& op : predicted[s].ops)
          if (op_ms(op, kind, predicted[s].recompute) > 0) table.factors[op.name] = factor->second;
      }
    }
    out[kind] = std::move(table);
  }
  return out;
}

OpFactors InstructionTerms::factors_of(const std::string& name, const std::string& op_type) const {
  auto lookup = [&](Op op) {
    auto table = op_factors.find(kind_name(op));
    if (table == op_factors.end()) return 1.0;
    const OpFactorTable& t = table->second;
    if (t.basis == "kind") return t.other;
    auto it = t.factors.find(t.basis == "op type" ? op_type : name);
    return it == t.factors.end() ? t.other : it->second;
  };
  return {lookup(Op::kForward), lookup(Op::kBackward), lookup(Op::kBackwardInput),
          lookup(Op::kBackwardWeight)};
}

InstructionTerms InstructionTerms::for_split(const std::vector<StageFactorSum>& stages) const {
  if (!follows_ops()) return *this;
  InstructionTerms out;
  out.instruction_ms = instruction_ms;
  out.source = source;
  out.device_start_ms = device_start_ms;
  out.trace = trace;
  out.measured_step_ms = measured_step_ms;
  out.step_overhead_ms = step_overhead_ms;
  out.steps = steps;
  for (const StageFactorSum& stage : stages) out.stage_factors.push_back(stage.factors(*this));
  return out;
}

void StageFactorSum::add(const OpFactors& factors, double forward, double backward_input,
                         double backward_weight) {
  forward_ += forward;
  forward_weighted_ += factors.forward * forward;
  backward_ += backward_input + backward_weight;
  backward_weighted_ += factors.backward * (backward_input + backward_weight);
  input_ += backward_input;
  input_weighted_ += factors.backward_input * backward_input;
  weight_ += backward_weight;
  weight_weighted_ += factors.backward_weight * backward_weight;
}

std::map<std::string, double> StageFactorSum::factors(const InstructionTerms& terms) const {
  std::map<std::string, double> out;
  auto mean = [](double time, double weighted, double other) {
    return time > 0 ? weighted / time : other;
  };
  for (const auto& [kind, table] : terms.op_factors) {
    if (kind == kind_name(Op::kForward))
      out[kind] = mean(forward_, forward_weighted_, table.other);
    else if (kind == kind_name(Op::kBackward))
      out[kind] = mean(backward_, backward_weighted_, table.other);
    else if (kind == kind_name(Op::kBackwardInput))
      out[kind] = mean(input_, input_weighted_, table.other);
    else if (kind == kind_name(Op::kBackwardWeight))
      out[kind] = mean(weight_, weight_weighted_, table.other);
    else
      out[kind] = table.other;
  }
  return out;
}

}  // namespace stagecraft::cost
