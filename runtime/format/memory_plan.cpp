#include "runtime/format/memory_plan.h"

#include <algorithm>
#include <numeric>

#include "runtime/format/error.h"

namespace stagecraft::plan {

namespace {
int64_t align_up(int64_t v) {
  return (v + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}
bool meet(const Lifetime& a, const Lifetime& b) { return a.first <= b.last && b.first <= a.last; }
}  // namespace

MemoryPlan plan_memory(const std::vector<Lifetime>& lifetimes) {
  MemoryPlan plan;
  plan.offsets.assign(lifetimes.size(), 0);
  std::vector<size_t> order(lifetimes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lifetimes[a].bytes > lifetimes[b].bytes; });
  std::vector<size_t> placed;
  for (size_t i : order) {
    const Lifetime& t = lifetimes[i];
    int64_t size = align_up(std::max<int64_t>(t.bytes, 1));
    // Busy ranges of placed tensors whose lifetimes meet this one, sorted by offset.
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (size_t j : placed)
      if (meet(t, lifetimes[j]))
        busy.push_back({plan.offsets[j],
                        plan.offsets[j] + align_up(std::max<int64_t>(lifetimes[j].bytes, 1))});
    std::sort(busy.begin(), busy.end());
    int64_t best = -1, best_gap = INT64_MAX, cursor = 0;
    for (auto [begin, end] : busy) {
      if (begin - cursor >= size && begin - cursor < best_gap) {
        best = cursor;
        best_gap = begin - cursor;
      }
      cursor = std::max(cursor, end);
    }
    plan.offsets[i] = best >= 0 ? best : cursor;
    plan.arena_bytes = std::max(plan.arena_bytes, plan.offsets[i] + size);
    placed.push_back(i);
  }
  return plan;
}

void check_memory_plan(const std::vector<Lifetime>& lifetimes, const MemoryPlan& plan,
                       const std::string& what) {
  if (plan.offsets.size() != lifetimes.size())
    fail(ErrorKind::kPlan, "{}: memory plan has {} offsets for {} tensors", what,
         plan.offsets.size(), lifetimes.size());
  for (size_t i = 0; i < lifetimes.size(); ++i) {
    // Bounds first, without forming offset + bytes (a hostile offset could wrap it).
    if (plan.offsets[i] < 0 || lifetimes[i].bytes < 0 || plan.arena_bytes < 0 ||
        plan.offsets[i] % kArenaAlignment != 0 ||
        plan.offsets[i] > plan.arena_bytes - lifetimes[i].bytes)
      fail(ErrorKind::kPlan,
           "{}: tensor {} at offset {} ({} bytes) lies outside the {}-byte arena or is misaligned",
           what, i, plan.offsets[i], lifetimes[i].bytes, plan.arena_bytes);
    const int64_t end = plan.offsets[i] + lifetimes[i].bytes;  // <= arena_bytes
    for (size_t j = 0; j < i; ++j)
      if (meet(lifetimes[i], lifetimes[j]) && lifetimes[i].bytes > 0 && lifetimes[j].bytes > 0 &&
          plan.offsets[i] < plan.offsets[j] + lifetimes[j].bytes && plan.offsets[j] < end)
        fail(ErrorKind::kPlan, "{}: tensors {} and {} are alive together but overlap in the arena",
             what, j, i);
  }
}

}  // namespace stagecraft::plan
