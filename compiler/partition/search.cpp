#include "compiler/partition/search.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "runtime/format/error.h"

namespace stagecraft::partition {
namespace {

/// -1, 0 or 1 as `a` is below, equal to (within a relative 1e-12) or above `b`.
int compare(double a, double b) {
  if (std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b))) return 0;
  return a < b ? -1 : 1;
}

/// The search state: the allowed positions, the splits seen, the best one and the budget.
class Search {
 public:
  Search(int positions, int stages,
         const std::function<SplitScore(const std::vector<int>&)>& evaluate,
         const SearchLimits& limits)
      : stages_(stages), evaluate_(evaluate), limits_(limits) {
    if (limits.allowed_cuts.empty()) {
      for (int c = 0; c + 1 < positions; ++c) allowed_.push_back(c);
    } else {
      for (int c : limits.allowed_cuts)
        if (c >= 0 && c + 1 < positions) allowed_.push_back(c);
      std::sort(allowed_.begin(), allowed_.end());
      allowed_.erase(std::unique(allowed_.begin(), allowed_.end()), allowed_.end());
    }
  }

  /// The split as indices into the allowed positions; nothing when it is not a valid split.
  std::optional<std::vector<int>> indices(const std::vector<int>& cuts) const {
    if (static_cast<int>(cuts.size()) != stages_ - 1) return std::nullopt;
    std::vector<int> out;
    for (int c : cuts) {
      auto it = std::lower_bound(allowed_.begin(), allowed_.end(), c);
      if (it == allowed_.end() || *it != c) return std::nullopt;
      int index = static_cast<int>(it - allowed_.begin());
      if (!out.empty() && index <= out.back()) return std::nullopt;
      out.push_back(index);
    }
    return out;
  }

  /// Evaluates the split at `index` once; true when it became the best. False when it was seen
  /// already or the budget is spent.
  bool consider(const std::vector<int>& index) {
    if (!seen_.insert(index).second) return false;
    if (result_.candidates >= limits_.max_candidates) return false;
    std::vector<int> cuts;
    for (int i : index) cuts.push_back(allowed_[i]);
    SplitScore score = evaluate_(cuts);
    ++result_.candidates;
    if (!have_best_ || better(score, result_.score)) {
      have_best_ = true;
      result_.cuts = std::move(cuts);
      result_.score = score;
      best_ = index;
      return true;
    }
    return false;
  }

  bool spent() const { return result_.candidates >= limits_.max_candidates; }

  /// Moves of one cut by `distance` allowed positions either way, first improvement kept.
  bool sweep(int distance) {
    bool improved = false;
    for (std::size_t c = 0; c < best_.size() && !spent(); ++c) {
      for (int direction : {+1, -1}) {
        std::vector<int> moved = best_;
        moved[c] += direction * distance;
        int low = c == 0 ? -1 : moved[c - 1];
        int high = c + 1 == moved.size() ? static_cast<int>(allowed_.size()) : moved[c + 1];
        if (moved[c] <= low || moved[c] >= high) continue;
        if (consider(moved)) improved = true;
      }
    }
    return improved;
  }

  SearchResult run(const std::vector<std::vector<int>>& seeds) {
    for (std::size_t i = 0; i < seeds.size(); ++i) {
      std::optional<std::vector<int>> index = indices(seeds[i]);
      if (!index) continue;
      if (consider(*index)) result_.seed = static_cast<int>(i);
      if (spent()) break;
    }
    if (result_.seed < 0) {
      fail(ErrorKind::kInternal, "split search: none of {} seeds is a split into {} stages",
           seeds.size(), stages_);
    }
    // Back to single steps after every improvement; stop when no distance helps.
    for (bool improved = true; improved && !spent();) {
      improved = false;
      for (int distance = 1; distance < static_cast<int>(allowed_.size()) && !spent();
           distance *= 2) {
        if (sweep(distance)) {
          improved = true;
          break;
        }
      }
    }
    return result_;
  }

 private:
  int stages_;
  const std::function<SplitScore(const std::vector<int>&)>& evaluate_;
  const SearchLimits& limits_;
  std::vector<int> allowed_;
  std::set<std::vector<int>> seen_;
  std::vector<int> best_;
  bool have_best_ = false;
  SearchResult result_;
};

}  // namespace

bool better(const SplitScore& a, const SplitScore& b) {
  if (a.fits != b.fits) return a.fits;
  if (!a.fits) {
    if (int c = compare(a.overflow_bytes, b.overflow_bytes); c != 0) return c < 0;
  }
  if (int c = compare(a.primary, b.primary); c != 0) return c < 0;
  return compare(a.secondary, b.secondary) < 0;
}

double crossing_bytes(const std::vector<double>& cut_bytes, const std::vector<int>& cuts) {
  double total = 0;
  for (int c : cuts) {
    if (c < 0 || static_cast<std::size_t>(c) >= cut_bytes.size())
      fail(ErrorKind::kInternal, "split search: a cut after position {} of {}", c,
           cut_bytes.size());
    total += cut_bytes[static_cast<std::size_t>(c)];
  }
  return total;
}

ScoredSplit fewest_bytes_within(const ScoredSplit& best, const std::vector<ScoredSplit>& scored,
                                const std::vector<double>& cut_bytes, double tie) {
  if (!best.score.fits) return best;
  const double limit = best.score.primary * (1 + tie);
  ScoredSplit chosen = best;
  double chosen_bytes = crossing_bytes(cut_bytes, best.cuts);
  for (const ScoredSplit& s : scored) {
    if (!s.score.fits || s.cuts.size() != best.cuts.size() || s.score.primary > limit) continue;
    const double bytes = crossing_bytes(cut_bytes, s.cuts);
    const int c = compare(bytes, chosen_bytes);
    if (c < 0 || (c == 0 && compare(s.score.primary, chosen.score.primary) < 0)) {
      chosen = s;
      chosen_bytes = bytes;
    }
  }
  return chosen;
}

SearchResult search_cuts(int positions, int stages, const std::vector<std::vector<int>>& seeds,
                         const std::function<SplitScore(const std::vector<int>& cuts)>& evaluate,
                         const SearchLimits& limits) {
  if (stages < 1 || stages > positions) {
    fail(ErrorKind::kUsage, "split search: {} stages for {} positions", stages, positions);
  }
  if (limits.max_candidates < 1) {
    fail(ErrorKind::kUsage, "split search: a budget of {} candidates; it needs at least 1",
         limits.max_candidates);
  }
  return Search(positions, stages, evaluate, limits).run(seeds);
}

}  // namespace stagecraft::partition
