// The choice of the split: manual split points, the exact bottleneck solve (re-solved with
// tighter limits when a device does not fit), the baselines, and the search by simulation
// (planning.h choose_split).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "compiler/model_info.h"
#include "compiler/plan/planning.h"
#include "cost_models/memory.h"
#include "runtime/format/error.h"
#include "runtime/format/suggest.h"

namespace stagecraft::plan::planning {
namespace {

/// Cuts that balance a per-position weight (parameters, or 1 per op) over the stages: the
/// baselines DeepSpeed calls 'parameters' and 'uniform'.
std::vector<int> balanced_cuts(const std::vector<double>& weight, int stages) {
  const auto n = static_cast<int>(weight.size());
  double total = 0;
  for (double w : weight) total += w;
  std::vector<int> cuts;
  double acc = 0;
  int pos = 0;
  for (int k = 1; k < stages; ++k) {
    double target = total * k / stages;
    while (pos < n && acc + weight[pos] <= target) acc += weight[pos++];
    // Each remaining stage needs an op of its own.
    int cut = std::clamp(pos - 1, cuts.empty() ? 0 : cuts.back() + 1, n - 1 - (stages - k));
    cuts.push_back(cut);
    while (pos <= cut) acc += weight[pos++];
  }
  return cuts;
}

[[noreturn]] void refuse(const Setup& s, const partition::Solution& sol, const NodeFacts& f,
                         double capacity) {
  const auto& st = sol.stages[sol.over_stage];
  const SpanWeights held = span_weights(f, st.first, st.last);
  int64_t acts = 0;
  for (int i = st.first; i <= st.last; ++i) acts += s.shape.training ? f.output_bytes[i] : 0;
  auto in = static_cast<int64_t>(in_flight(s, sol.over_stage));
  auto anatomy = cost::stage_memory(held.params, held.trainable, acts, 0, 0, in, s.optimizer,
                                    s.precision, s.shape.training, false, 0, held.constant_bytes);
  fail(ErrorKind::kPlan,
       "no split into {} stages fits: even the split that needs least memory has stage {} needing "
       "{}; device has {} ({})",
       sol.stages.size(), sol.over_stage, cost::describe(anatomy, in), format_bytes(capacity),
       fit_suggestions(s));
}

/// The cut-after positions of a solution.
std::vector<int> cuts_of(const partition::Solution& sol) {
  std::vector<int> cuts;
  for (std::size_t k = 0; k + 1 < sol.stages.size(); ++k) cuts.push_back(sol.stages[k].last);
  return cuts;
}

/// Candidate splits the search may simulate. One candidate costs about a simulation of its
/// schedule (some 8 instructions per stage and microbatch) and the stage interfaces of the
/// graph (its nodes); the budget is a fixed amount of that work (a few seconds: 1,700 candidates
/// for a 4,812-node model on 64 stages and 2 microbatches, 140 with 128 stages and 64), and at
/// most 16 sweeps of single-cut moves, which small models reach.
int candidate_budget(int stages, int microbatches, std::size_t nodes) {
  const double per_candidate = 8.0 * stages * microbatches + static_cast<double>(nodes);
  const double work = 1e7;
  const int sweeps = 16 * 2 * std::max(1, stages - 1);
  return std::clamp(static_cast<int>(work / per_candidate), 16, std::max(16, sweeps));
}

/// Splits whose simulated steps are within this fraction of the fastest found count as tied: the
/// one of them that sends the fewest bytes across its cuts is chosen.
constexpr double kTieFraction = 0.01;

/// Most re-solves with tighter per-stage limits when the bottleneck-optimal split leaves a device
/// over its memory (the chunks of an interleaved device, checked together).
constexpr int kRepairRounds = 12;

/// One split the search scored (choose_split).
struct Evaluated {
  partition::SplitScore score;
  Prediction predicted;
  std::vector<int64_t> device_bytes;
  bool pruned = false;  ///< Not simulated: `score.primary` is its step's lower bound.
};

/// The unsimulated splits of `seen` that could still win the tie-break against `tied` (the
/// winner among the simulated ones, for the search's best `best`): a bound within the tie's
/// reach, and fewer bytes sent than the winner (or as many, with a bound under its step).
std::vector<std::vector<int>> tie_contenders(const std::map<std::vector<int>, Evaluated>& seen,
                                             const partition::SplitScore& best,
                                             const partition::ScoredSplit& tied,
                                             const std::vector<double>& cut_bytes) {
  std::vector<std::vector<int>> contenders;
  if (!best.fits) return contenders;
  const double limit = best.primary * (1 + kTieFraction) * (1 + 1e-9);
  const double bytes = partition::crossing_bytes(cut_bytes, tied.cuts);
  for (const auto& [cuts, e] : seen) {
    if (!e.pruned || e.score.primary > limit) continue;
    const double b = partition::crossing_bytes(cut_bytes, cuts);
    if (b < bytes * (1 - 1e-9) ||
        (b <= bytes * (1 + 1e-9) && e.score.primary < tied.score.primary * (1 + 1e-9)))
      contenders.push_back(cuts);
  }
  return contenders;
}

}  // namespace

/// Positions after which the named nodes end a stage (manual split points).
std::vector<int> split_positions(const ir::Graph& g, const partition::GraphProblem& gp,
                                 const std::vector<std::string>& names) {
  std::vector<int> cuts;
  for (const auto& name : names) {
    int pos = -1;
    for (std::size_t i = 0; i < gp.order.size(); ++i) {
      if (g.node(gp.order[i]).name == name) pos = static_cast<int>(i);
    }
    // A PyTorch module path (enc.layers.2): after the last node of that module's scope, as the
    // exporter names nodes (/enc/layers.2/self_attn/MatMul).
    for (std::size_t i = 0; pos < 0 && i < gp.order.size(); ++i)
      if (in_module(g.node(gp.order[i]).name, name))
        for (std::size_t j = i; j < gp.order.size(); ++j)
          if (in_module(g.node(gp.order[j]).name, name)) pos = static_cast<int>(j);
    if (pos < 0) {
      std::vector<std::string> modules;  // two scope levels deep, as --list-nodes groups them
      for (ir::NodeId id : gp.order) modules.push_back(module_of(g.node(id).name, 2));
      std::vector<std::string_view> known(modules.begin(), modules.end());
      for (ir::NodeId id : gp.order) known.push_back(g.node(id).name);
      // The nodes of a fused attention block or GELU are gone from the graph the planner cuts.
      auto holds = [&](std::string_view op) {
        return std::any_of(gp.order.begin(), gp.order.end(),
                           [&](ir::NodeId id) { return g.node(id).op_type == op; });
      };
      std::string fused;
      if (holds("Attention"))
        fused = " (attention blocks are fused into Attention nodes; --no-fuse-attention keeps "
                "their MatMul, Softmax and mask nodes)";
      if (holds("Gelu"))
        fused += " (GELUs are fused into Gelu nodes; --no-fuse-gelu keeps their Erf or Tanh "
                 "formula)";
      fail(ErrorKind::kUsage,
           "--split-after '{}' names no node or module of the model{}; stagec --list-nodes lists "
           "them{}",
           name, did_you_mean(name, known), fused);
    }
    if (pos + 1 >= static_cast<int>(gp.order.size())) {
      fail(ErrorKind::kUsage,
           "--split-after '{}' is the last op: the stage after it would be empty", name);
    }
    if (std::find(cuts.begin(), cuts.end(), pos) != cuts.end()) {
      fail(ErrorKind::kUsage, "--split-after '{}' is given twice", name);
    }
    cuts.push_back(pos);
  }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

/// Chooses the split: the manual one, or the exact bottleneck solve (under a per-stage limit that
/// is never stricter than the device check), re-solved with tighter limits when a device does
/// not fit, then the search by simulation from the best of those and the baselines. Every
/// candidate is built and checked by `evaluator`.
SplitChoice choose_split(SplitEvaluator& evaluator, const Setup& s, const NodeFacts& facts,
                         const partition::GraphProblem& gp, const std::vector<int>& manual_cuts) {
  std::map<std::vector<int>, Evaluated> seen;
  // The speed objective: the best fitting step simulated so far. A split the search moves to
  // whose lower bound (SplitEvaluator::step_bound_ms) is past it cannot become the search's
  // best, so it is not simulated: it scores its bound, which is no better, and the search goes
  // exactly as it would have. Such a split may still tie within kTieFraction of the final best
  // and send fewer bytes: the tie-break below simulates the ones that could.
  double best_step = std::numeric_limits<double>::infinity();
  auto evaluate = [&](const std::vector<int>& cuts, bool may_prune = false) -> const Evaluated& {
    auto it = seen.find(cuts);
    if (it != seen.end() && (may_prune || !it->second.pruned)) return it->second;
    // The bound serves the speed objective only; computed once per split, it both prunes and,
    // for a split that is simulated, is checked against the simulation.
    const bool speed = s.objective == Objective::kSpeed;
    partition::Solution sol = evaluator.solution(cuts);
    const double bound = speed ? evaluator.step_bound_ms(sol) : 0.0;
    if (speed && may_prune && s.prune_split_search && std::isfinite(best_step) &&
        bound > best_step * (1 + 1e-9)) {
      Evaluated e{{true, 0, bound, std::numeric_limits<double>::infinity()}, {}, {}, true};
      return seen.insert_or_assign(cuts, std::move(e)).first->second;
    }
    Candidate c = evaluator.evaluate(std::move(sol), true);
    // Pruning is exact only while the bound holds: every simulated split checks it (with
    // --recompute auto, every one that fits: the bound counts the recomputation such a split
    // cannot do without, SplitEvaluator::must_recompute).
    if (speed && (c.predicted.fits || s.recompute != Recompute::kAuto) &&
        bound > c.predicted.step_ms * (1 + 1e-9) + 1e-9)
      fail(ErrorKind::kInternal,
           "the split search's lower bound {:.6f} ms is over the simulated step {:.6f} ms of the "
           "split after positions {}",
           bound, c.predicted.step_ms, fmt::join(cuts, ", "));
    Evaluated e{evaluator.score(c), c.predicted, {}};
    for (const DevicePeak& d : c.peaks) e.device_bytes.push_back(d.peak_bytes);
    if (e.score.fits) best_step = std::min(best_step, e.score.primary);
    return seen.insert_or_assign(cuts, std::move(e)).first->second;
  };
  const int stages = gp.problem.stages;
  std::vector<double> param_weight, op_weight;
  for (int64_t params : facts.params) {
    param_weight.push_back(static_cast<double>(params));
    op_weight.push_back(1.0);
  }
  const std::vector<int> parameter_cuts = balanced_cuts(param_weight, stages);
  const std::vector<int> uniform_cuts = balanced_cuts(op_weight, stages);
  SplitChoice choice;
  if (!manual_cuts.empty()) {
    choice.cuts = manual_cuts;
  } else {
    std::vector<double> limits(stages, evaluator.capacity());
    partition::Problem problem = gp.problem;
    problem.capacity_bytes = [&limits](int k) { return limits[k]; };
    partition::Solution sol = partition::solve(problem);
    if (!sol.feasible && !s.keep_over_memory) refuse(s, sol, facts, evaluator.capacity());
    choice.bottleneck_cuts = cuts_of(sol);
    std::vector<std::vector<int>> seeds{choice.bottleneck_cuts};
    if (!evaluate(seeds.back()).score.fits) {
      // A device over its memory (the chunks of an interleaved device together, or what the
      // solver leaves out: temporaries, buffers): solve again with each stage limited to a
      // share of what its device has beyond what the solver does not count, the device's
      // chunks sharing it evenly or one taking more (a wide chunk beside a narrow one); where
      // that still leaves a device over, less by its excess.
      const Evaluated& first = evaluate(seeds.back());
      double uncounted = 0;
      for (std::size_t d = 0; d < first.device_bytes.size(); ++d) {
        double counted = 0;
        for (int k = static_cast<int>(d); k < stages; k += s.shape.devices)
          counted += sol.stages[k].memory_bytes;
        uncounted = std::max(uncounted, static_cast<double>(first.device_bytes[d]) - counted);
      }
      const int chunks = s.shape.chunks;
      int rounds = 0;
      bool fits = false;
      for (double tilt : {0.0, 0.05, -0.05, 0.1, -0.1, 0.15, -0.15, 0.2, -0.2, 0.3, -0.3}) {
        if (fits || rounds >= kRepairRounds || (chunks == 1 && tilt != 0)) break;
        double budget = evaluator.capacity() - uncounted;
        for (int shrink = 0; shrink < 3 && !fits && rounds < kRepairRounds; ++shrink, ++rounds) {
          for (int k = 0; k < stages; ++k) {
            const int chunk = k / s.shape.devices;
            const double share =
                1.0 / chunks + (chunk == 0 ? tilt : -tilt / std::max(1, chunks - 1));
            limits[k] = std::clamp(share, 0.0, 1.0) * budget;
          }
          partition::Solution tighter = partition::solve(problem, /*explain=*/false);
          if (!tighter.feasible) break;
          seeds.push_back(cuts_of(tighter));
          const Evaluated& e = evaluate(seeds.back());
          fits = e.score.fits;
          const double worst =
              static_cast<double>(*std::max_element(e.device_bytes.begin(), e.device_bytes.end()));
          budget -= std::max(worst - evaluator.capacity(), 0.01 * budget);
        }
      }
    }
    seeds.push_back(parameter_cuts);
    seeds.push_back(uniform_cuts);
    partition::SearchLimits search_limits;
    search_limits.allowed_cuts = gp.problem.allowed_cuts;
    search_limits.max_candidates = candidate_budget(stages, s.shape.microbatches, gp.order.size());
    partition::SearchResult found = partition::search_cuts(
        static_cast<int>(gp.order.size()), stages, seeds,
        [&](const std::vector<int>& cuts) { return evaluate(cuts, true).score; }, search_limits);
    choice.cuts = found.cuts;
    if (s.objective == Objective::kSpeed) {
      const std::set<int> allowed(gp.problem.allowed_cuts.begin(), gp.problem.allowed_cuts.end());
      auto scored_splits = [&] {
        std::vector<partition::ScoredSplit> scored;
        for (const auto& [cuts, e] : seen)
          if (!e.pruned && (allowed.empty() || std::all_of(cuts.begin(), cuts.end(), [&](int c) {
                              return allowed.count(c) > 0;
                            })))
            scored.push_back({cuts, e.score});
        return scored;
      };
      partition::ScoredSplit tied = partition::fewest_bytes_within(
          {found.cuts, found.score}, scored_splits(), gp.problem.cut_bytes, kTieFraction);
      // A split left unsimulated could win the tie only if its bound is within the tie's reach
      // and it sends fewer bytes than the winner so far (or as many, with a bound under the
      // winner's step): those are simulated, and the tie-break runs again over every simulated
      // split, as if none had been left out.
      const auto contenders = tie_contenders(seen, found.score, tied, gp.problem.cut_bytes);
      for (const auto& cuts : contenders) evaluate(cuts);
      if (!contenders.empty())
        tied = partition::fewest_bytes_within({found.cuts, found.score}, scored_splits(),
                                              gp.problem.cut_bytes, kTieFraction);
      if (tied.cuts != found.cuts) {
        choice.cuts = tied.cuts;
        choice.fastest_cuts = found.cuts;
        choice.fastest = evaluate(found.cuts).predicted;
        choice.tied_step_ms = evaluate(tied.cuts).predicted.step_ms;
        choice.fastest_crossing_bytes = partition::crossing_bytes(gp.problem.cut_bytes, found.cuts);
        choice.crossing_bytes = partition::crossing_bytes(gp.problem.cut_bytes, tied.cuts);
      }
    }
    choice.bottleneck = evaluate(choice.bottleneck_cuts).predicted;
  }
  choice.baseline_parameters = evaluate(parameter_cuts).predicted;
  choice.baseline_uniform = evaluate(uniform_cuts).predicted;
  for (const auto& [cuts, e] : seen) ++(e.pruned ? choice.pruned : choice.candidates);
  return choice;
}

}  // namespace stagecraft::plan::planning
