// The split search: never worse than its seeds, each split scored once, within its budget, a
// local optimum when the budget allows, and a way out of splits that do not fit.
#include "compiler/partition/search.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>

#include "runtime/format/error.h"
#include "tests/partition/all_cuts.h"

namespace stagecraft::partition {
namespace {

/// Made-up scores for a split of `times` with a memory per position and a capacity per stage:
/// the "step" is the sum of stage times plus (M - 1) times the slowest, with a penalty that
/// depends on where the slowest stage sits (what the bottleneck alone does not see).
struct MadeUp {
  std::vector<double> times, memory;
  double capacity = 1e300;
  int microbatches = 4;
  std::set<std::vector<int>> evaluated;
  int calls = 0;

  SplitScore operator()(const std::vector<int>& cuts) {
    ++calls;
    evaluated.insert(cuts);
    std::vector<double> stage_time, stage_memory;
    int first = 0;
    for (std::size_t k = 0; k <= cuts.size(); ++k) {
      int last = k < cuts.size() ? cuts[k] : static_cast<int>(times.size()) - 1;
      double t = 0, m = 0;
      for (int i = first; i <= last; ++i) {
        t += times[i];
        m += memory[i];
      }
      stage_time.push_back(t * (1 + 0.1 * static_cast<double>(k)));
      stage_memory.push_back(m);
      first = last + 1;
    }
    double slowest = *std::max_element(stage_time.begin(), stage_time.end());
    double sum = 0, over = 0;
    for (double t : stage_time) sum += t;
    for (double m : stage_memory) over += std::max(0.0, m - capacity);
    double peak = *std::max_element(stage_memory.begin(), stage_memory.end());
    return {over == 0, over, sum + (microbatches - 1) * slowest, peak};
  }
};

using testing::all_cuts;

TEST_CASE("the search is never worse than a seed, scores each split once and keeps its budget") {
  std::mt19937 rng(2024);
  std::uniform_real_distribution<double> time(0.1, 3.0), bytes(0, 10);
  int local_optima = 0, global_optima = 0, trials = 0;
  for (int trial = 0; trial < 300; ++trial) {
    int n = 2 + static_cast<int>(rng() % 9);
    int stages = 1 + static_cast<int>(rng() % std::min(n, 4));
    MadeUp made_up;
    for (int i = 0; i < n; ++i) {
      made_up.times.push_back(time(rng));
      made_up.memory.push_back(bytes(rng));
    }
    made_up.capacity = std::uniform_real_distribution<double>(10, 40)(rng);
    std::vector<std::vector<int>> splits;
    std::vector<int> cur;
    all_cuts(n, stages, 0, cur, splits);
    std::vector<std::vector<int>> seeds{splits[rng() % splits.size()],
                                        splits[rng() % splits.size()]};
    SearchLimits limits;
    limits.max_candidates = trial % 3 == 0 ? 3 : 1000;
    auto evaluate = [&](const std::vector<int>& cuts) { return made_up(cuts); };
    SearchResult found = search_cuts(n, stages, seeds, evaluate, limits);
    CAPTURE(trial);
    CHECK(made_up.calls == static_cast<int>(made_up.evaluated.size()));
    CHECK(found.candidates == made_up.calls);
    CHECK(found.candidates <= limits.max_candidates);
    MadeUp again = made_up;
    for (const auto& seed : seeds) CHECK_FALSE(better(again(seed), found.score));
    CHECK_FALSE(better(found.score, again(found.cuts)));  // the score is the split's own
    CHECK_FALSE(better(again(found.cuts), found.score));
    if (limits.max_candidates < 1000) continue;
    ++trials;
    // With budget to spare, no single move of one cut by one position is better.
    bool local = true;
    for (std::size_t c = 0; c < found.cuts.size(); ++c) {
      for (int step : {-1, +1}) {
        std::vector<int> moved = found.cuts;
        moved[c] += step;
        int low = c == 0 ? -1 : moved[c - 1];
        int high = c + 1 == moved.size() ? n - 1 : moved[c + 1];
        if (moved[c] <= low || moved[c] >= high) continue;
        if (better(again(moved), found.score)) local = false;
      }
    }
    CHECK(local);
    local_optima += local;
    SplitScore best = again(splits[0]);
    for (const auto& split : splits)
      if (better(again(split), best)) best = again(split);
    global_optima += !better(best, found.score);
  }
  MESSAGE(local_optima << " of " << trials << " searches ended in a local optimum, "
                       << global_optima << " in the global one");
  CHECK(global_optima > trials / 2);
}

TEST_CASE("from a split that does not fit the search moves to one that does") {
  MadeUp made_up;
  made_up.times = {1, 1, 1, 1, 1, 1, 1, 1};
  made_up.memory = {9, 1, 1, 1, 1, 1, 1, 9};
  made_up.capacity = 12;  // only a cut after position 2, 3 or 4 fits
  SearchLimits limits;
  SearchResult found = search_cuts(
      8, 2, {{0}}, [&](const std::vector<int>& cuts) { return made_up(cuts); }, limits);
  CHECK(found.score.fits);
  REQUIRE(found.cuts.size() == 1);
  CHECK(found.cuts[0] >= 2);
  CHECK(found.cuts[0] <= 4);
}

TEST_CASE("seeds outside the allowed cuts are skipped: with none valid the search refuses") {
  MadeUp made_up;
  made_up.times.assign(6, 1.0);
  made_up.memory.assign(6, 0.0);
  SearchLimits limits;
  limits.allowed_cuts = {1, 3};
  auto evaluate = [&](const std::vector<int>& cuts) { return made_up(cuts); };
  SearchResult found = search_cuts(6, 2, {{2}, {3}}, evaluate, limits);
  CHECK(found.seed == 1);
  for (const auto& split : made_up.evaluated) {
    CHECK((split[0] == 1 || split[0] == 3));
  }
  CHECK_THROWS_AS(search_cuts(6, 2, {{2}, {4, 5}}, evaluate, limits), Error);
  limits.max_candidates = 0;
  CHECK_THROWS_AS(search_cuts(6, 2, {{1}}, evaluate, limits), Error);
}

TEST_CASE("splits within the tie of the fastest: the one sending the fewest bytes across its cuts") {
  // Positions 0..5; the cut after 2 is a layer boundary (1 KiB), the others mid-layer (4 KiB).
  const std::vector<double> cut_bytes{4096, 4096, 1024, 4096, 4096};
  auto split = [](std::vector<int> cuts, double step, bool fits = true) {
    return ScoredSplit{std::move(cuts), SplitScore{fits, 0, step, 0}};
  };
  const ScoredSplit fastest = split({3}, 100.0);
  CHECK(crossing_bytes(cut_bytes, {2, 3}) == 5120);
  // 0.8% slower and a quarter of the bytes: chosen. 1.5% slower: not tied.
  CHECK(fewest_bytes_within(fastest, {fastest, split({2}, 100.8), split({1}, 100.1)}, cut_bytes,
                            0.01)
            .cuts == std::vector<int>{2});
  CHECK(fewest_bytes_within(fastest, {fastest, split({2}, 101.5)}, cut_bytes, 0.01).cuts ==
        std::vector<int>{3});
  // One that does not fit, or has another stage count, never wins; equal bytes keep the faster.
  CHECK(fewest_bytes_within(fastest, {split({2}, 100.2, false), split({2, 3}, 99.0)}, cut_bytes,
                            0.01)
            .cuts == std::vector<int>{3});
  CHECK(fewest_bytes_within(fastest, {split({1}, 100.5), split({4}, 100.3)}, cut_bytes, 0.01)
            .cuts == std::vector<int>{3});
  // With no tie allowed, only a split of the same step and fewer bytes would be chosen.
  CHECK(fewest_bytes_within(fastest, {split({2}, 100.3)}, cut_bytes, 0.0).cuts ==
        std::vector<int>{3});
  // A best that does not fit is kept as it is (the caller reports it).
  CHECK(fewest_bytes_within(split({3}, 100.0, false), {split({2}, 100.1)}, cut_bytes, 0.01).cuts ==
        std::vector<int>{3});
  CHECK_THROWS_AS(crossing_bytes(cut_bytes, {5}), Error);
}

}  // namespace
}  // namespace stagecraft::partition
