#include "compiler/partition/partitioner.h"

#include <algorithm>
#include <limits>

#include "runtime/format/error.h"

namespace stagecraft::partition {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Prefix sums so that a span's totals cost O(1).
struct Prefix {
  std::vector<double> time, static_bytes, activation_bytes;
  explicit Prefix(const Problem& p) {
    std::size_t n = p.positions.size();
    time.assign(n + 1, 0);
    static_bytes.assign(n + 1, 0);
    activation_bytes.assign(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      time[i + 1] = time[i] + p.positions[i].time_s;
      static_bytes[i + 1] = static_bytes[i] + p.positions[i].static_bytes;
      activation_bytes[i + 1] = activation_bytes[i] + p.positions[i].activation_bytes;
    }
  }
};

StageSpan span(const Problem& p, const Prefix& pre, int stage, int first, int last) {
  StageSpan s;
  s.first = first;
  s.last = last;
  s.compute_s = pre.time[last + 1] - pre.time[first];
  double out_bytes = last + 1 < static_cast<int>(p.positions.size()) ? p.cut_bytes[last] : 0.0;
  double in_bytes = first > 0 ? p.cut_bytes[first - 1] : 0.0;
  s.send_s = out_bytes > 0 ? p.send_time(stage, out_bytes) : 0.0;
  s.time_s = s.compute_s + s.send_s;
  double activations = pre.activation_bytes[last + 1] - pre.activation_bytes[first];
  // One receive and one send buffer per microbatch in flight.
  s.memory_bytes = pre.static_bytes[last + 1] - pre.static_bytes[first] +
                   (activations + in_bytes + out_bytes) * p.in_flight(stage);
  return s;
}

/// (primary, secondary) cost of a span under the objective, for lexicographic comparison.
std::pair<double, double> key(const Problem& p, const StageSpan& s) {
  return p.objective == Objective::kSpeed ? std::make_pair(s.time_s, s.memory_bytes)
                                          : std::make_pair(s.memory_bytes, s.time_s);
}

Solution finish(const Problem& p, std::vector<StageSpan> stages) {
  Solution sol;
  sol.feasible = true;
  for (std::size_t k = 0; k < stages.size(); ++k) {
    sol.bottleneck_s = std::max(sol.bottleneck_s, stages[k].time_s);
    sol.peak_memory_bytes = std::max(sol.peak_memory_bytes, stages[k].memory_bytes);
    if (stages[k].memory_bytes > p.capacity_bytes(static_cast<int>(k)) && sol.feasible) {
      sol.feasible = false;
      sol.over_stage = static_cast<int>(k);
    }
  }
  sol.stages = std::move(stages);
  return sol;
}

/// Exact DP. With `respect_capacity` false it ignores memory limits (used to explain a
/// refusal with the least-memory split).
Solution run_dp(const Problem& p, const Prefix& pre, bool respect_capacity) {
  const int n = static_cast<int>(p.positions.size());
  const int s = p.stages;
  // Stage boundaries: 0, one past every allowed cut, and n. The DP runs over these only, so
  // restricting the cuts (coarsening a large graph) makes it proportionally cheaper.
  std::vector<int> bounds{0};
  if (p.allowed_cuts.empty()) {
    for (int i = 1; i < n; ++i) bounds.push_back(i);
  } else {
    std::vector<int> cuts = p.allowed_cuts;
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (int c : cuts) {
      if (c >= 0 && c < n - 1) bounds.push_back(c + 1);
    }
  }
  bounds.push_back(n);
  const int b = static_cast<int>(bounds.size());
  using Key = std::pair<double, double>;
  const Key worst{kInf, kInf};
  // best[k][i]: the best (max primary, max secondary) over positions [0, bounds[i]) in k stages.
  std::vector<std::vector<Key>> best(s + 1, std::vector<Key>(b, worst));
  std::vector<std::vector<int>> from(s + 1, std::vector<int>(b, -1));
  best[0][0] = {0, 0};
  for (int k = 1; k <= s; ++k) {
    for (int i = k; i < b; ++i) {
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == worst) continue;
        StageSpan st = span(p, pre, k - 1, bounds[j], bounds[i] - 1);
        if (respect_capacity && st.memory_bytes > p.capacity_bytes(k - 1)) continue;
        Key here = key(p, st);
        Key cand{std::max(best[k - 1][j].first, here.first), std::max(best[k - 1][j].second, here.second)};
        if (cand < best[k][i]) {
          best[k][i] = cand;
          from[k][i] = j;
        }
      }
    }
  }
  if (best[s][b - 1] == worst) return Solution{};
  std::vector<StageSpan> stages(s);
  for (int k = s, i = b - 1; k >= 1; --k) {
    int j = from[k][i];
    stages[k - 1] = span(p, pre, k - 1, bounds[j], bounds[i] - 1);
    i = j;
  }
  return finish(p, std::move(stages));
}

void check_problem(const Problem& p) {
  const auto n = static_cast<int>(p.positions.size());
  if (p.stages < 1) fail(ErrorKind::kUsage, "the number of stages must be at least 1 (got {})", p.stages);
  if (p.stages > n) {
    fail(ErrorKind::kUsage, "{} stages for a graph of {} ops: every stage needs at least one op", p.stages, n);
  }
  if (static_cast<int>(p.cut_bytes.size()) != std::max(0, n - 1)) {
    fail(ErrorKind::kInternal, "cut_bytes has {} entries for {} positions", p.cut_bytes.size(), n);
  }
}

}  // namespace

Solution solve(const Problem& problem) {
  check_problem(problem);
  Prefix pre(problem);
  Solution sol = run_dp(problem, pre, /*respect_capacity=*/true);
  if (sol.feasible) return sol;
  // Nothing fits: find the split that needs the least memory and report where it overflows.
  Problem least_memory = problem;
  least_memory.objective = Objective::kMemory;
  Solution lm = run_dp(least_memory, pre, /*respect_capacity=*/false);
  if (lm.stages.empty()) {
    fail(ErrorKind::kPlan, "no split into {} stages is possible with the allowed cut points", problem.stages);
  }
  lm.feasible = false;
  if (lm.over_stage < 0) lm.over_stage = 0;
  return lm;
}

Solution evaluate_cuts(const Problem& problem, const std::vector<int>& cut_after) {
  check_problem(problem);
  const auto n = static_cast<int>(problem.positions.size());
  std::vector<int> cuts = cut_after;
  std::sort(cuts.begin(), cuts.end());
  if (static_cast<int>(cuts.size()) != problem.stages - 1) {
    fail(ErrorKind::kUsage, "{} split points give {} stages, but {} stages were asked for", cuts.size(),
         cuts.size() + 1, problem.stages);
  }
  Prefix pre(problem);
  std::vector<StageSpan> stages;
  int first = 0;
  for (std::size_t k = 0; k <= cuts.size(); ++k) {
    int last = k < cuts.size() ? cuts[k] : n - 1;
    if (last < first || last >= n) {
      fail(ErrorKind::kUsage, "split point {} leaves stage {} empty", k < cuts.size() ? cuts[k] : last, k);
    }
    stages.push_back(span(problem, pre, static_cast<int>(k), first, last));
    first = last + 1;
  }
  return finish(problem, std::move(stages));
}

}  // namespace stagecraft::partition
