// The partition solver against brute force over every placement of the cuts.
#include "compiler/partition/partitioner.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "runtime/format/error.h"
#include "tests/partition/all_cuts.h"

namespace stagecraft::partition {
namespace {

using testing::all_cuts;

Problem random_problem(std::mt19937& rng, int n, int stages, Objective objective) {
  std::uniform_real_distribution<double> time(0.1, 5.0), bytes(0, 100), cut(0, 50);
  Problem p;
  p.stages = stages;
  p.objective = objective;
  for (int i = 0; i < n; ++i) p.positions.push_back({time(rng), bytes(rng), bytes(rng)});
  for (int i = 0; i + 1 < n; ++i) p.cut_bytes.push_back(cut(rng));
  p.send_time = [](int, double b) { return 0.02 * b; };
  p.in_flight = [stages](int k) { return static_cast<double>(stages - k); };  // 1F1B-like
  // Recomputation counts a stage's inputs per microbatch in flight: random tensors between
  // positions, so the DP's running input count meets the direct one of evaluate_cuts.
  p.recompute = rng() % 3 == 0;
  for (int t = 0; p.recompute && n > 1 && t < n; ++t) {
    Tensor tensor{static_cast<int>(rng() % (n - 1)), {}, bytes(rng) / 4};
    for (int r = tensor.producer + 1; r < n; ++r)
      if (rng() % 3 == 0 || r == tensor.producer + 1) tensor.readers.push_back(r);
    p.tensors.push_back(tensor);
  }
  double cap = std::uniform_real_distribution<double>(150, 900)(rng);
  p.capacity_bytes = [cap](int) { return cap; };
  if (rng() % 3 == 0) {  // per-stage limits, as the split search's repair rounds give
    std::vector<double> caps;
    for (int k = 0; k < stages; ++k)
      caps.push_back(cap * std::uniform_real_distribution<double>(0.6, 1.4)(rng));
    p.capacity_bytes = [caps](int k) { return caps[static_cast<std::size_t>(k)]; };
  }
  return p;
}

double primary(const Problem& p, const Solution& s) {
  return p.objective == Objective::kSpeed ? s.bottleneck_s : s.peak_memory_bytes;
}

TEST_CASE("the solver finds the brute-force optimum over all cut placements") {
  std::mt19937 rng(1234);
  int compared = 0, infeasible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    int n = 1 + static_cast<int>(rng() % 10);
    int stages = 1 + static_cast<int>(rng() % std::min(n, 4));
    Objective objective = trial % 2 ? Objective::kSpeed : Objective::kMemory;
    Problem p = random_problem(rng, n, stages, objective);
    std::vector<std::vector<int>> cuts;
    std::vector<int> cur;
    all_cuts(n, stages, 0, cur, cuts);
    double best = 1e300;
    bool any = false;
    for (const auto& c : cuts) {
      Solution s = evaluate_cuts(p, c);
      if (!s.feasible) continue;
      any = true;
      best = std::min(best, primary(p, s));
    }
    Solution got = solve(p);
    CAPTURE(trial);
    CHECK(got.feasible == any);
    // Without the explanation (the split search's repair rounds ask only whether a split
    // fits): the same answer, and no least-memory split where none fits.
    const Solution unexplained = solve(p, /*explain=*/false);
    CHECK(unexplained.feasible == any);
    CHECK(unexplained.stages.size() == (any ? got.stages.size() : 0));
    if (any) {
      CHECK(primary(p, got) == doctest::Approx(best).epsilon(1e-12));
      // The split itself is the DP's over every entry (the secondary cost, a tie-break the DP
      // keeps per entry, is not brute force's least: a costlier prefix can lose it later).
      const Solution every = solve_every_entry(p);
      REQUIRE(every.stages.size() == got.stages.size());
      for (std::size_t k = 0; k < got.stages.size(); ++k)
        CHECK(got.stages[k].last == every.stages[k].last);
      ++compared;
    } else {
      ++infeasible;
      CHECK(got.over_stage >= 0);
      CHECK(got.stages[got.over_stage].memory_bytes > p.capacity_bytes(got.over_stage));
    }
    REQUIRE(static_cast<int>(got.stages.size()) == stages);
    CHECK(got.stages.front().first == 0);
    CHECK(got.stages.back().last == n - 1);
    for (int k = 0; k + 1 < stages; ++k) CHECK(got.stages[k].last + 1 == got.stages[k + 1].first);
  }
  MESSAGE(compared << " problems matched brute force, " << infeasible << " infeasible ones refused");
  CHECK(compared > 200);
  CHECK(infeasible > 0);
}

TEST_CASE("the narrowed solve gives the split of the DP over every entry") {
  // Large problems (the bands act only there): 2,000 positions into up to 64 stages, memory
  // loose or tight, recomputation, allowed cuts; the same stages, not only the same cost.
  std::mt19937 rng(2026);
  int fits = 0, refused = 0, large = 0;
  for (int trial = 0; trial < 16; ++trial) {
    // Every other problem of 100,000 entries or more.
    const int n =
        trial % 2 ? 1700 + static_cast<int>(rng() % 600) : 300 + static_cast<int>(rng() % 1200);
    const int stages =
        trial % 2 ? 60 + static_cast<int>(rng() % 8) : 2 + static_cast<int>(rng() % 40);
    Problem p = random_problem(rng, 1, 1, trial % 4 == 3 ? Objective::kMemory : Objective::kSpeed);
    // Positions as random_problem makes them, tensors as a network has them: each read by a few
    // positions soon after its producer (random_problem's reach every later position).
    p.stages = stages;
    std::uniform_real_distribution<double> time(0.1, 5.0), bytes(0, 100), cut(0, 50);
    p.positions.clear();
    for (int i = 0; i < n; ++i) p.positions.push_back({time(rng), bytes(rng), bytes(rng)});
    p.cut_bytes.clear();
    for (int i = 0; i + 1 < n; ++i) p.cut_bytes.push_back(cut(rng));
    p.in_flight = [stages](int k) { return static_cast<double>(stages - k); };
    p.tensors.clear();
    p.recompute = trial % 2 == 0;
    for (int t = 0; p.recompute && t + 1 < n; ++t) {
      Tensor tensor{t, {t + 1}, bytes(rng) / 4};
      for (int r = t + 2; r < n && r < t + 40; ++r)
        if (rng() % 8 == 0) tensor.readers.push_back(r);
      p.tensors.push_back(tensor);
    }
    // Room for about the average stage's memory times a factor: from tight (often nothing
    // fits) to loose.
    double total = 0;
    for (const auto& pos : p.positions) total += pos.static_bytes + pos.activation_bytes;
    const double room = total / stages * std::uniform_real_distribution<double>(0.5, 3.0)(rng) *
                        (p.recompute ? 1.0 : static_cast<double>(stages));
    std::vector<double> caps;
    for (int k = 0; k < stages; ++k)
      caps.push_back(room * std::uniform_real_distribution<double>(0.7, 1.3)(rng));
    p.capacity_bytes = [caps](int k) { return caps[static_cast<std::size_t>(k)]; };
    if (trial % 3 == 1)
      for (int c = 0; c + 1 < n; c += 1 + static_cast<int>(rng() % 5)) p.allowed_cuts.push_back(c);
    CAPTURE(trial);
    CAPTURE(n);
    CAPTURE(stages);
    const Solution reference = solve_every_entry(p);
    const Solution got = solve(p);
    REQUIRE(got.feasible == reference.feasible);
    REQUIRE(got.stages.size() == reference.stages.size());
    for (std::size_t k = 0; k < got.stages.size(); ++k) {
      CHECK(got.stages[k].first == reference.stages[k].first);
      CHECK(got.stages[k].last == reference.stages[k].last);
    }
    CHECK(got.bottleneck_s == reference.bottleneck_s);
    CHECK(got.peak_memory_bytes == reference.peak_memory_bytes);
    CHECK(got.over_stage == reference.over_stage);
    const Solution quiet = solve(p, /*explain=*/false);
    CHECK(quiet.stages.size() == (reference.feasible ? reference.stages.size() : 0));
    large += static_cast<double>(n) * stages >= 100000;
    ++(reference.feasible ? fits : refused);
  }
  MESSAGE(fits << " fitting and " << refused << " refused problems solved alike, " << large
               << " of 100,000 entries or more");
  CHECK(fits >= 5);
  CHECK(refused >= 3);
  CHECK(large >= 6);
}

TEST_CASE("allowed cuts are the only cuts, and the optimum over them is found") {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 100; ++trial) {
    Problem p = random_problem(rng, 9, 3, Objective::kSpeed);
    p.capacity_bytes = [](int) { return 1e300; };
    p.allowed_cuts = {1, 3, 4, 6};
    std::vector<std::vector<int>> cuts;
    std::vector<int> cur;
    all_cuts(9, 3, 0, cur, cuts);
    double best = 1e300;
    for (const auto& c : cuts) {
      bool ok = std::all_of(c.begin(), c.end(), [&](int x) {
        return std::find(p.allowed_cuts.begin(), p.allowed_cuts.end(), x) != p.allowed_cuts.end();
      });
      if (ok) best = std::min(best, evaluate_cuts(p, c).bottleneck_s);
    }
    Solution got = solve(p);
    CHECK(got.bottleneck_s == doctest::Approx(best).epsilon(1e-12));
    for (std::size_t k = 0; k + 1 < got.stages.size(); ++k) {
      int c = got.stages[k].last;
      CHECK(std::find(p.allowed_cuts.begin(), p.allowed_cuts.end(), c) != p.allowed_cuts.end());
    }
  }
}

TEST_CASE("equal positions balance evenly: communication moves the cut to a narrow point") {
  Problem p;
  p.stages = 2;
  for (int i = 0; i < 8; ++i) p.positions.push_back({1.0, 0, 0});
  p.cut_bytes.assign(7, 100.0);
  p.cut_bytes[2] = 1.0;  // a narrow point after position 2
  Solution even = solve(p);
  CHECK(even.stages[0].last == 3);
  CHECK(even.bottleneck_s == doctest::Approx(4.0));
  p.send_time = [](int, double b) { return 0.05 * b; };  // a wide cut costs 5 s, a narrow one 0.05 s
  Solution narrow = solve(p);
  CHECK(narrow.stages[0].last == 2);
  CHECK(narrow.bottleneck_s == doctest::Approx(5.0));
}

TEST_CASE("bad problems are refused with the numbers") {
  Problem p;
  p.positions.assign(3, PositionCost{1, 0, 0});
  p.cut_bytes.assign(2, 0);
  p.stages = 4;
  CHECK_THROWS_WITH_AS(solve(p), doctest::Contains("4 stages for a graph of 3 ops"), Error);
  p.stages = 0;
  CHECK_THROWS_AS(solve(p), Error);
  p.stages = 2;
  CHECK_THROWS_WITH_AS(evaluate_cuts(p, {0, 1}), doctest::Contains("2 split points give 3 stages"), Error);
}

}  // namespace
}  // namespace stagecraft::partition
