#include "cost_models/calibration.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "runtime/format/error.h"

namespace stagecraft::cost {
namespace {

using schedule::Op;

bool is_compute_kind(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput ||
         op == Op::kBackwardWeight || op == Op::kOptimizerStep;
}

/// The plan's op time of `op` on a stage, milliseconds.
double predicted_ms(const StagePrediction& p, Op op) {
  switch (op) {
    case Op::kForward:
      return p.forward_ms;
    case Op::kBackward:
      return p.backward_input_ms + p.backward_weight_ms;
    case Op::kBackwardInput:
      return p.backward_input_ms;
    case Op::kBackwardWeight:
      return p.backward_weight_ms;
    case Op::kOptimizerStep:
      return p.optimizer_ms;
    default:
      return 0;
  }
}

/// The value below which `fraction` of `values` (not empty) lie.
double quantile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  const auto at = static_cast<size_t>(fraction * static_cast<double>(values.size() - 1));
  return values[at];
}

/// What the fit gathers per kind and per (stage, kind).
struct Samples {
  std::map<Op, std::vector<double>> gaps_ms;    ///< Per kind: the gaps before its instructions.
  std::map<Op, std::vector<double>> slices_ms;  ///< Per kind: the slices (sends, receives).
  /// Per receive kind: from its message's send (or its own start, if later) to its end.
  std::map<Op, std::vector<double>> handoffs_ms;
  std::map<std::pair<int, Op>, double> sum_dp;  ///< Per (stage, kind): sum of slice x p.
  std::map<std::pair<int, Op>, double> sum_pp;  ///< Per (stage, kind): sum of p^2.
};

/// Per (kind, stage, microbatch) of a step's sends and receives: their (start, end).
using Exchanges = std::map<std::tuple<Op, int, int>, std::pair<double, double>>;

/// For a receive, when its message entered the transport (the start of the matching send:
/// SEND_ACT of stage s - 1, its last producer in a chain, or SEND_GRAD of stage s + 1); for a
/// send, when its link had room (the end of the peer's receive of the message `capacity`
/// before it). -1 when the step has no such instruction (the link never held it up).
double released_at(const TracedInstruction& e, const Exchanges& exchanges, int capacity) {
  std::tuple<Op, int, int> key;
  if (e.op == Op::kRecvAct)
    key = {Op::kSendAct, e.stage - 1, e.microbatch};
  else if (e.op == Op::kRecvGrad)
    key = {Op::kSendGrad, e.stage + 1, e.microbatch};
  else if (e.op == Op::kSendAct)
    key = {Op::kRecvAct, e.stage + 1, e.microbatch - capacity};
  else
    key = {Op::kRecvGrad, e.stage - 1, e.microbatch - capacity};
  auto it = exchanges.find(key);
  if (it == exchanges.end()) return -1;
  return e.op == Op::kRecvAct || e.op == Op::kRecvGrad ? it->second.first : it->second.second;
}

bool is_exchange(Op op) {
  return op == Op::kSendAct || op == Op::kSendGrad || op == Op::kRecvAct || op == Op::kRecvGrad;
}

/// Adds one device's instructions of one step (in time order) to `samples`.
void gather(const std::vector<const TracedInstruction*>& events,
            const std::vector<StagePrediction>& predicted, const Exchanges& exchanges, int capacity,
            Samples& samples) {
  double previous_end = -1;
  std::map<std::pair<int, int>, double> recomputed_ms;  // (stage, microbatch) -> re-run forward
  for (const TracedInstruction* e : events) {
    if (e->stage < 0 || e->stage >= static_cast<int>(predicted.size()))
      fail(ErrorKind::kUsage, "calibration: a traced {} names stage {}; the plan has {} stages",
           schedule::to_string(e->op), e->stage, predicted.size());
    const double slice = (e->end_s - e->start_s) * 1e3;
    const double gap = previous_end < 0 ? -1 : std::max(0.0, (e->start_s - previous_end) * 1e3);
    previous_end = std::max(previous_end, e->end_s);
    if (e->recompute) {
      recomputed_ms[{e->stage, e->microbatch}] += slice;
      continue;
    }
    if (gap >= 0) samples.gaps_ms[e->op].push_back(gap);
    if (!is_compute_kind(e->op)) {
      // A receive or send held up by its peer: from the moment the peer released it (the
      // message sent, room on the link) to its end; the time before is the peer's work, which
      // the simulator plays itself.
      const double released = is_exchange(e->op) ? released_at(*e, exchanges, capacity) : -1;
      if (released >= 0)
        samples.handoffs_ms[e->op].push_back(
            std::max(0.0, (e->end_s - std::max(released, e->start_s)) * 1e3));
      else
        samples.slices_ms[e->op].push_back(slice);
      continue;
    }
    double d = slice;
    if (auto it = recomputed_ms.find({e->stage, e->microbatch});
        it != recomputed_ms.end() && e->op != Op::kForward) {
      d += it->second;
      recomputed_ms.erase(it);
    }
    const double p = predicted_ms(predicted[static_cast<size_t>(e->stage)], e->op);
    samples.sum_dp[{e->stage, e->op}] += d * p;
    samples.sum_pp[{e->stage, e->op}] += p * p;
  }
}

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? 0 : sum / static_cast<double>(values.size());
}

// The median over the steps of each one's measured length less its instructions' span, at
// least 0 (a step's length and its events come from one clock; 0 without lengths).
double step_overhead(const std::vector<TracedStep>& steps, const std::vector<double>& step_ms) {
  std::vector<double> beyond;
  for (size_t k = 0; k < step_ms.size(); ++k) {
    if (steps[k].empty()) continue;
    double first = steps[k].front().start_s, last = steps[k].front().end_s;
    for (const TracedInstruction& e : steps[k]) {
      first = std::min(first, e.start_s);
      last = std::max(last, e.end_s);
    }
    beyond.push_back(step_ms[k] - (last - first) * 1e3);
  }
  return beyond.empty() ? 0.0 : std::max(0.0, quantile(beyond, 0.5));
}

}  // namespace

double InstructionTerms::fixed_ms(schedule::Op op) const {
  auto it = instruction_ms.find(schedule::to_string(op));
  return it == instruction_ms.end() ? 0.0 : it->second;
}

double InstructionTerms::factor(int stage, schedule::Op op) const {
  if (stage < 0 || stage >= static_cast<int>(stage_factors.size())) return 1.0;
  const auto& factors = stage_factors[static_cast<size_t>(stage)];
  auto it = factors.find(schedule::to_string(op));
  return it == factors.end() ? 1.0 : it->second;
}

InstructionTerms fit_calibration(const std::vector<TracedStep>& steps,
                                 const std::vector<StagePrediction>& predicted, int capacity,
                                 const InstructionTerms& fallback,
                                 const std::vector<double>& step_ms) {
  if (steps.empty())
    fail(ErrorKind::kUsage,
         "calibration needs at least one steady step (the first is left out): run stagerun with "
         "--steps 3 or more");
  if (!step_ms.empty() && step_ms.size() != steps.size())
    fail(ErrorKind::kUsage, "calibration: {} step lengths for {} traced steps", step_ms.size(),
         steps.size());
  Samples samples;
  std::vector<std::vector<double>> start_delay_ms;  // per device, per step
  for (const TracedStep& step : steps) {
    std::map<int, std::vector<const TracedInstruction*>> by_device;
    for (const TracedInstruction& e : step) by_device[e.device].push_back(&e);
    Exchanges exchanges;
    double step_start = step.empty() ? 0 : step.front().start_s;
    for (const TracedInstruction& e : step) {
      if (is_exchange(e.op)) exchanges[{e.op, e.stage, e.microbatch}] = {e.start_s, e.end_s};
      step_start = std::min(step_start, e.start_s);
    }
    for (auto& [device, events] : by_device) {
      std::stable_sort(events.begin(), events.end(),
                       [](const auto* a, const auto* b) { return a->start_s < b->start_s; });
      gather(events, predicted, exchanges, capacity, samples);
      if (device >= static_cast<int>(start_delay_ms.size()))
        start_delay_ms.resize(static_cast<size_t>(device) + 1);
      start_delay_ms[static_cast<size_t>(device)].push_back((events.front()->start_s - step_start) *
                                                            1e3);
    }
  }
  InstructionTerms terms;
  terms.source = "calibration";
  terms.steps = static_cast<int>(steps.size());
  terms.instruction_ms = fallback.instruction_ms;
  std::set<Op> kinds;
  for (const auto* traced : {&samples.gaps_ms, &samples.slices_ms, &samples.handoffs_ms})
    for (const auto& entry : *traced) kinds.insert(entry.first);
  for (Op op : kinds) {
    // A kind traced only as the first event of its device's steps has no gap.
    const auto gaps = samples.gaps_ms.find(op);
    double fixed = gaps == samples.gaps_ms.end() ? 0.0 : mean(gaps->second);
    const auto slices = samples.slices_ms.find(op);
    const auto handoffs = samples.handoffs_ms.find(op);
    if (handoffs != samples.handoffs_ms.end())
      fixed += mean(handoffs->second);
    else if (slices != samples.slices_ms.end() && !slices->second.empty())
      fixed += quantile(slices->second, 0.1);
    terms.instruction_ms[schedule::to_string(op)] = fixed;
  }
  for (const std::vector<double>& delays : start_delay_ms)
    terms.device_start_ms.push_back(mean(delays));
  terms.step_overhead_ms = step_overhead(steps, step_ms);
  terms.stage_factors.resize(predicted.size());
  std::map<std::string, std::pair<double, double>> kind_sums;  // kind -> (sum d p, sum p^2)
  for (const auto& [key, pp] : samples.sum_pp) {
    if (!(pp > 0)) continue;
    const double dp = samples.sum_dp.at(key);
    const double factor = dp / pp;
    if (!std::isfinite(factor) || !(factor > 0)) continue;
    const std::string kind = schedule::to_string(key.second);
    terms.stage_factors[static_cast<size_t>(key.first)][kind] = factor;
    kind_sums[kind].first += dp;
    kind_sums[kind].second += pp;
  }
  std::map<std::string, double> kind_factors;
  for (const auto& [kind, sums] : kind_sums) kind_factors[kind] = sums.first / sums.second;
  terms.op_factors = fit_op_factors(terms.stage_factors, kind_factors, predicted);
  return terms;
}

std::string calibration_key(const std::string& model_hash, bool training,
                            const std::string& schedule, int devices, int chunks, int microbatches,
                            long long batch) {
  return fmt::format("{}|{}|{}|{}x{} stages|{} microbatches|batch {}", model_hash,
                     training ? "train" : "infer", schedule, devices, chunks, microbatches, batch);
}

}  // namespace stagecraft::cost
