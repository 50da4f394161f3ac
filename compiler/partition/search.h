#pragma once
/// \file
/// A bounded local search over split points, scored by a caller's evaluation (the planner
/// simulates each split's schedule and checks its memory per device).
///
/// The exact solver (partitioner.h) minimises the slowest stage, but the step of a pipeline also
/// depends on where that stage sits, on the transfers and on the schedule, and the memory of an
/// interleaved device is that of all its chunks together, which the solver's per-stage limit
/// cannot express. The search starts from the best of the seeds it is given (the solver's
/// optimum, the baselines) and moves one cut at a time, one allowed position and then further
/// (2, 4, 8, ... positions), keeping a move as soon as it scores better, until no move of any
/// cut at any distance helps or the candidate budget is spent. Every split is evaluated at most
/// once; the result is never worse than the best seed.

#include <functional>
#include <vector>

namespace stagecraft::partition {

/// How good one split is; lower is better, compared in this order.
struct SplitScore {
  bool fits = false;          ///< Every device within its memory.
  double overflow_bytes = 0;  ///< Bytes over capacity, summed over devices (0 when it fits).
  double primary = 0;         ///< The objective: the simulated step, or the largest peak.
  double secondary = 0;       ///< The tie-breaker: the other of the two.
};

/// Whether `a` is strictly better than `b`: a split that fits beats one that does not; among
/// those that do not, less overflow wins; then the primary and the secondary key. Keys that
/// differ by less than a relative 1e-12 count as equal, so rounding never makes a move.
bool better(const SplitScore& a, const SplitScore& b);

/// What the search may do.
struct SearchLimits {
  /// Positions after which a cut may fall, ascending (empty: every position of the order).
  std::vector<int> allowed_cuts;
  int max_candidates = 64;  ///< Distinct splits evaluated, seeds included.
};

/// The search's answer.
struct SearchResult {
  std::vector<int> cuts;  ///< The best split found (cut-after positions, ascending).
  SplitScore score;
  int candidates = 0;  ///< Distinct splits evaluated.
  int seed = -1;       ///< The seed the search started from (index into `seeds`).
};

/// Searches splits of `positions` positions into `stages` stages. `seeds` are cut lists
/// (stages - 1 ascending positions each); those that are not valid splits over the allowed cuts
/// are skipped, and at least one must be valid. `evaluate` scores a split.
SearchResult search_cuts(int positions, int stages, const std::vector<std::vector<int>>& seeds,
                         const std::function<SplitScore(const std::vector<int>& cuts)>& evaluate,
                         const SearchLimits& limits);

/// One split the search scored.
struct ScoredSplit {
  std::vector<int> cuts;
  SplitScore score;
};

/// Bytes per microbatch that cross `cuts` (`cut_bytes[c]` summed: partitioner.h's Problem).
double crossing_bytes(const std::vector<double>& cut_bytes, const std::vector<int>& cuts);

/// The tie-break between splits of nearly the same score: among the `scored` splits that fit,
/// have `best`'s number of cuts and a primary key at most `tie` (relative) above `best`'s, the
/// one whose cuts send the fewest bytes (a cut at a layer boundary rather than mid-attention,
/// which costs the next device a larger receive and its link a larger buffer); the lower
/// primary among equal bytes. `best` when it does not fit or none sends fewer bytes.
ScoredSplit fewest_bytes_within(const ScoredSplit& best, const std::vector<ScoredSplit>& scored,
                                const std::vector<double>& cut_bytes, double tie);

}  // namespace stagecraft::partition
