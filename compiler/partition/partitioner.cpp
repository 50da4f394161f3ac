#include "compiler/partition/partitioner.h"

#include <algorithm>
#include <limits>

#include "runtime/format/error.h"

namespace stagecraft::partition {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// The limits on the slowest stage the speed objective's DP tries, as multiples of the least any
/// split can have (least_limit), before the DP without a limit.
constexpr double kLimitWidening[] = {1.03, 1.15, 1.5};

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

/// The per-stage numbers the DP's inner loop would otherwise ask the callbacks for again.
struct StageParams {
  double in_flight = 1;
  double capacity = 0;
};

StageParams stage_params(const Problem& p, int stage) {
  return {p.in_flight(stage), p.capacity_bytes(stage)};
}

/// Static bytes plus what the stage keeps per microbatch (see StageSpan::memory_bytes).
double span_memory(const Problem& p, const StageParams& sp, double static_bytes, double activations,
                   double inputs) {
  double keep_all = activations * sp.in_flight;
  if (!p.recompute) return static_bytes + keep_all;
  return static_bytes + std::min(keep_all, inputs * sp.in_flight + activations);
}

/// A lower bound of span_memory that only grows as the span starts earlier (inputs left out),
/// so the DP may stop extending a span once it is past a limit.
double span_memory_floor(const Problem& p, const StageParams& sp, double static_bytes,
                         double activations) {
  return static_bytes + activations * (p.recompute ? std::min(1.0, sp.in_flight) : sp.in_flight);
}

/// The stage of positions [first, last] with its outgoing send time and input bytes known.
StageSpan span(const Problem& p, const Prefix& pre, const StageParams& sp, int first, int last,
               double send_s, double input_bytes) {
  StageSpan s;
  s.first = first;
  s.last = last;
  s.compute_s = pre.time[last + 1] - pre.time[first];
  s.send_s = send_s;
  s.time_s = s.compute_s + s.send_s;
  s.input_bytes = std::max(0.0, input_bytes);
  double activations = pre.activation_bytes[last + 1] - pre.activation_bytes[first];
  double static_bytes = pre.static_bytes[last + 1] - pre.static_bytes[first];
  s.memory_bytes = span_memory(p, sp, static_bytes, activations, s.input_bytes);
  return s;
}

/// Time for stage `stage` ending at `last` to send what crosses the cut after it.
double send_after(const Problem& p, int stage, int last) {
  double out_bytes = last + 1 < static_cast<int>(p.positions.size()) ? p.cut_bytes[last] : 0.0;
  return out_bytes > 0 ? p.send_time(stage, out_bytes) : 0.0;
}

/// The input bytes of a span ending at a fixed position, kept up to date as the span grows at
/// its front one position at a time (the DP's inner loop): O(degree) per position.
class SpanInputs {
 public:
  explicit SpanInputs(const Problem& p) : tensors_(p.tensors) {
    const auto n = p.positions.size();
    produced_.resize(n);
    read_.resize(n);
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      const Tensor& tensor = tensors_[t];
      if (tensor.producer >= 0 && tensor.producer < static_cast<int>(n))
        produced_[tensor.producer].push_back(static_cast<int>(t));
      int previous = -1;
      for (int r : tensor.readers) {
        if (r < 0 || r >= static_cast<int>(n) || r == previous) continue;
        read_[r].push_back(static_cast<int>(t));
        previous = r;
      }
    }
  }

  /// Starts the empty span that ends at `last`.
  void reset(int last) {
    last_ = last;
    first_ = last + 1;
    bytes_ = 0;
  }

  /// Grows the span to start at `first` (<= its start now).
  void extend_to(int first) {
    while (first_ > first) add(--first_);
  }

  double bytes() const { return bytes_; }

 private:
  /// Whether `tensor` has a reader in [from, last].
  bool read_in(const Tensor& tensor, int from) const {
    auto it = std::lower_bound(tensor.readers.begin(), tensor.readers.end(), from);
    return it != tensor.readers.end() && *it <= last_;
  }

  void add(int position) {
    // What `position` writes and the span reads is no longer an input; what it reads from
    // before becomes one, unless the span read it already.
    for (int t : produced_[position])
      if (read_in(tensors_[t], position + 1)) bytes_ -= tensors_[t].bytes;
    for (int t : read_[position])
      if (tensors_[t].producer < position && !read_in(tensors_[t], position + 1))
        bytes_ += tensors_[t].bytes;
  }

  const std::vector<Tensor>& tensors_;
  std::vector<std::vector<int>> produced_, read_;
  int first_ = 0, last_ = -1;
  double bytes_ = 0;
};

/// Input bytes of each stage of a split given by the last position of each stage, in one pass
/// over the tensors.
std::vector<double> stage_input_bytes(const Problem& p, const std::vector<int>& stage_last) {
  std::vector<double> bytes(stage_last.size(), 0.0);
  auto stage_at = [&](int position) {
    return static_cast<int>(std::lower_bound(stage_last.begin(), stage_last.end(), position) -
                            stage_last.begin());
  };
  for (const Tensor& t : p.tensors) {
    int from = stage_at(t.producer);
    int counted = from;
    for (int r : t.readers) {
      int k = stage_at(r);
      if (k > counted && k < static_cast<int>(bytes.size())) {
        bytes[k] += t.bytes;
        counted = k;
      }
    }
  }
  return bytes;
}

/// The stages of a split given by each stage's last position.
std::vector<StageSpan> spans(const Problem& p, const Prefix& pre,
                             const std::vector<int>& stage_last) {
  std::vector<double> inputs =
      p.recompute ? stage_input_bytes(p, stage_last) : std::vector<double>(stage_last.size(), 0.0);
  std::vector<StageSpan> out;
  for (std::size_t k = 0; k < stage_last.size(); ++k) {
    const int stage = static_cast<int>(k);
    const int first = k == 0 ? 0 : stage_last[k - 1] + 1;
    out.push_back(span(p, pre, stage_params(p, stage), first, stage_last[k],
                       send_after(p, stage, stage_last[k]), inputs[k]));
  }
  return out;
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

/// Stage boundaries: 0, one past every allowed cut, and n. The DP runs over these only, so
/// restricting the cuts (coarsening a large graph) makes it proportionally cheaper.
std::vector<int> stage_bounds(const Problem& p) {
  const int n = static_cast<int>(p.positions.size());
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
  return bounds;
}

/// The ends (indices into `bounds`) the DP's row k may hold: [lowest[k], highest[k]]. Built
/// from a test `fits(k, from, to)` of stage k over the positions of bounds [from, to) that can
/// only fail more as a span grows at either end (a memory floor, a compute time): the furthest
/// k stages that each pass it reach from the front is the highest end any split of passing
/// stages has after k stages, and the earliest the last s - k reach from the back its lowest.
struct Band {
  std::vector<int> lowest, highest;

  /// Whether some split passes: every row's range is nonempty.
  bool open() const {
    for (std::size_t k = 0; k < lowest.size(); ++k)
      if (lowest[k] > highest[k]) return false;
    return true;
  }

  /// Both bands' ends: a split that passes both tests is in it.
  Band within(const Band& other) const {
    Band out = *this;
    for (std::size_t k = 0; k < lowest.size(); ++k) {
      out.lowest[k] = std::max(lowest[k], other.lowest[k]);
      out.highest[k] = std::min(highest[k], other.highest[k]);
    }
    return out;
  }
};

/// The furthest ends (indices into b bounds) the first k stages reach from the front, each
/// stage as long as `fits` allows: entry k for k = 0..stages.
template <class Fits>
std::vector<int> front_reach(int b, int stages, const Fits& fits) {
  std::vector<int> highest(static_cast<std::size_t>(stages) + 1, 0);
  for (int k = 1; k <= stages; ++k) {
    const int start = highest[k - 1];
    int end = start;
    while (end + 1 < b && fits(k - 1, start, end + 1)) ++end;
    highest[k] = end;
  }
  return highest;
}

template <class Fits>
Band band_of(int b, int stages, const Fits& fits) {
  Band band;
  band.highest = front_reach(b, stages, fits);
  band.lowest.assign(stages + 1, 0);
  band.lowest[stages] = b - 1;
  for (int k = stages - 1; k >= 1; --k) {
    const int end = band.lowest[k + 1];
    int start = end;
    while (start > 0 && fits(k, start - 1, end)) --start;
    band.lowest[k] = start;
  }
  return band;
}

/// The band of splits whose every stage's memory floor (span_memory_floor: what it holds at
/// least, growing with the span) is within its capacity: every split that fits is in it.
Band memory_band(const Problem& p, const Prefix& pre, const std::vector<int>& bounds) {
  std::vector<StageParams> params;
  for (int k = 0; k < p.stages; ++k) params.push_back(stage_params(p, k));
  return band_of(static_cast<int>(bounds.size()), p.stages, [&](int k, int from, int to) {
    const StageParams& sp = params[static_cast<std::size_t>(k)];
    return span_memory_floor(p, sp, pre.static_bytes[bounds[to]] - pre.static_bytes[bounds[from]],
                             pre.activation_bytes[bounds[to]] -
                                 pre.activation_bytes[bounds[from]]) <= sp.capacity;
  });
}

/// Whether stage positions of bounds [from, to) compute for at most `limit` (a send only adds).
auto within_time(const Prefix& pre, const std::vector<int>& bounds, double limit) {
  return [&pre, &bounds, limit](int, int from, int to) {
    return pre.time[bounds[to]] - pre.time[bounds[from]] <= limit;
  };
}

/// The band of splits whose every stage computes for at most `limit`.
Band time_band(const Prefix& pre, const std::vector<int>& bounds, int stages, double limit) {
  return band_of(static_cast<int>(bounds.size()), stages, within_time(pre, bounds, limit));
}

/// The least stage-time limit under which `stages` stages can cover every position with their
/// compute alone: no split of the problem, memory and sends counted, has a shorter slowest
/// stage. By bisection over the greedy cover from the front.
double least_limit(const Prefix& pre, const std::vector<int>& bounds, int stages) {
  const int b = static_cast<int>(bounds.size());
  auto covers = [&](double limit) {
    return front_reach(b, stages, within_time(pre, bounds, limit)).back() == b - 1;
  };
  double lo = 0, hi = pre.time.back();
  if (!(hi > 0)) return 0;
  for (int step = 0; step < 60 && hi - lo > 1e-9 * hi; ++step) {
    const double mid = 0.5 * (lo + hi);
    (covers(mid) ? hi : lo) = mid;
  }
  return hi;
}

/// The DP over `bounds`, each row k restricted to `band` (none: every end). With
/// `respect_capacity` false it ignores memory limits (used to explain a refusal with the
/// least-memory split). `limit`: no stage may take longer; the result is then the exact
/// optimum whenever that optimum's slowest stage is within the limit, and no solution
/// otherwise. One thread: the rows were once shared among threads, which met after each row;
/// on GPT-3 175B's 64- and 128-stage plans that saved nothing measurable, and on a machine whose
/// cores were busy every meeting waited for a descheduled thread, the 128-stage interleaved
/// plan taking 7.8 s instead of 0.31 (bench/RESULTS.md, 2026-11-30).
Solution run_dp(const Problem& p, const Prefix& pre, const std::vector<int>& bounds,
                bool respect_capacity, const Band* band, double limit) {
  const int s = p.stages;
  const int b = static_cast<int>(bounds.size());
  using Key = std::pair<double, double>;
  const Key worst{kInf, kInf};
  // best[k][i]: the best (max primary, max secondary) over positions [0, bounds[i]) in k stages.
  std::vector<std::vector<Key>> best(s + 1, std::vector<Key>(b, worst));
  std::vector<std::vector<int>> from(s + 1, std::vector<int>(b, -1));
  best[0][0] = {0, 0};
  SpanInputs inputs(p);
  for (int k = 1; k <= s; ++k) {
    const StageParams sp = stage_params(p, k - 1);
    // Only a prefix k - 1 stages can cover (lo..hi the first and last) precedes stage k: ends
    // before lo + 1 are out of reach, and the starts past hi or before lo are skipped (they
    // would be, one at a time, below; time and memory only grow as a start moves down, so a
    // break the skipped ones would take is taken at hi too).
    int lo = -1, hi = -1;
    for (int j = k - 1; j < b; ++j) {
      if (best[k - 1][j] == worst) continue;
      if (lo < 0) lo = j;
      hi = j;
    }
    if (lo < 0) break;  // no prefix: best[s][b - 1] stays out of reach
    const int end_from = std::max(std::max(k, lo + 1), band ? band->lowest[k] : 0);
    const int end_to = band ? std::min(b - 1, band->highest[k]) : b - 1;
    for (int i = end_from; i <= end_to; ++i) {
      const int last = bounds[i] - 1;
      const double send_s = send_after(p, k - 1, last);
      if (p.recompute) inputs.reset(last);
      // Longest last stage first is the old tie order; walking j down and keeping the later
      // of equal keys keeps it. A stage's time, and its memory without its inputs, only grow
      // as it starts earlier (costs are >= 0), so once either is past the best (or the memory
      // past the capacity), no earlier start can win.
      for (int j = std::min(i - 1, hi); j >= std::max(k - 1, lo); --j) {
        const int first = bounds[j];
        const double floor =
            span_memory_floor(p, sp, pre.static_bytes[last + 1] - pre.static_bytes[first],
                              pre.activation_bytes[last + 1] - pre.activation_bytes[first]);
        if (respect_capacity && floor > sp.capacity) break;
        const double time_s = pre.time[last + 1] - pre.time[first] + send_s;
        if ((p.objective == Objective::kSpeed ? time_s : floor) > best[k][i].first) break;
        if (time_s > limit) break;
        if (best[k - 1][j] == worst) continue;
        if (p.recompute) inputs.extend_to(first);
        StageSpan st = span(p, pre, sp, first, last, send_s, p.recompute ? inputs.bytes() : 0.0);
        if (respect_capacity && st.memory_bytes > sp.capacity) continue;
        Key here = key(p, st);
        Key cand{std::max(best[k - 1][j].first, here.first),
                 std::max(best[k - 1][j].second, here.second)};
        if (!(best[k][i] < cand)) {
          best[k][i] = cand;
          from[k][i] = j;
        }
      }
    }
  }
  if (best[s][b - 1] == worst) return Solution{};
  std::vector<int> stage_last(s);
  for (int k = s, i = b - 1; k >= 1; --k) {
    stage_last[k - 1] = bounds[i] - 1;
    i = from[k][i];
  }
  return finish(p, spans(p, pre, stage_last));
}

void check_problem(const Problem& p) {
  const auto n = static_cast<int>(p.positions.size());
  if (p.stages < 1)
    fail(ErrorKind::kUsage, "the number of stages must be at least 1 (got {})", p.stages);
  if (p.stages > n) {
    fail(ErrorKind::kUsage, "{} stages for a graph of {} ops: every stage needs at least one op",
         p.stages, n);
  }
  if (static_cast<int>(p.cut_bytes.size()) != std::max(0, n - 1)) {
    fail(ErrorKind::kInternal, "cut_bytes has {} entries for {} positions", p.cut_bytes.size(), n);
  }
}

/// solve(): with `narrow`, over the bands only.
Solution solve_in(const Problem& problem, bool explain, bool narrow) {
  check_problem(problem);
  Prefix pre(problem);
  const std::vector<int> bounds = stage_bounds(problem);
  // Most of the DP's entries are ends no good split has (two stages covering nearly the whole
  // graph). Every split that fits keeps its ends in the memory floors' band; for speed, solve
  // first within the band a limit on the slowest stage allows too, from just above the least
  // any split can have, widening it until a split is found, then in the memory band alone.
  Solution sol;
  if (!narrow) {
    sol = run_dp(problem, pre, bounds, /*respect_capacity=*/true, nullptr, kInf);
  } else if (const Band memory = memory_band(problem, pre, bounds); memory.open()) {
    if (problem.objective == Objective::kSpeed && problem.stages > 1) {
      const double least = least_limit(pre, bounds, problem.stages);
      for (double widen : kLimitWidening) {
        const Band band = memory.within(time_band(pre, bounds, problem.stages, least * widen));
        if (!band.open()) continue;
        sol = run_dp(problem, pre, bounds, /*respect_capacity=*/true, &band, least * widen);
        if (!sol.stages.empty()) break;
      }
    }
    if (sol.stages.empty())
      sol = run_dp(problem, pre, bounds, /*respect_capacity=*/true, &memory, kInf);
  }
  if (sol.feasible || !explain) return sol;
  // Nothing fits: find the split that needs the least memory and report where it overflows.
  Problem least_memory = problem;
  least_memory.objective = Objective::kMemory;
  Solution lm = run_dp(least_memory, pre, bounds, /*respect_capacity=*/false, nullptr, kInf);
  if (lm.stages.empty()) {
    fail(ErrorKind::kPlan, "no split into {} stages is possible with the allowed cut points",
         problem.stages);
  }
  lm.feasible = false;
  if (lm.over_stage < 0) lm.over_stage = 0;
  return lm;
}

}  // namespace

Solution solve(const Problem& problem, bool explain) {
  return solve_in(problem, explain, /*narrow=*/true);
}

Solution solve_every_entry(const Problem& problem, bool explain) {
  return solve_in(problem, explain, /*narrow=*/false);
}

Solution evaluate_cuts(const Problem& problem, const std::vector<int>& cut_after) {
  check_problem(problem);
  const auto n = static_cast<int>(problem.positions.size());
  std::vector<int> cuts = cut_after;
  std::sort(cuts.begin(), cuts.end());
  if (static_cast<int>(cuts.size()) != problem.stages - 1) {
    fail(ErrorKind::kUsage, "{} split points give {} stages, but {} stages were asked for",
         cuts.size(), cuts.size() + 1, problem.stages);
  }
  std::vector<int> stage_last;
  int first = 0;
  for (std::size_t k = 0; k <= cuts.size(); ++k) {
    int last = k < cuts.size() ? cuts[k] : n - 1;
    if (last < first || last >= n) {
      fail(ErrorKind::kUsage, "split point {} leaves stage {} empty",
           k < cuts.size() ? cuts[k] : last, k);
    }
    stage_last.push_back(last);
    first = last + 1;
  }
  return finish(problem, spans(problem, Prefix(problem), stage_last));
}

}  // namespace stagecraft::partition
