#pragma once
/// \file
/// The static memory plan of one program: every intermediate tensor gets an offset in one arena
/// so that tensors alive at the same time never overlap. Shared by the compiler (which records
/// the plan) and the runtime (which checks it and places tensors by it).

#include <cstdint>
#include <string>
#include <vector>

namespace stagecraft::plan {

/// A tensor to place: its size and the steps (node positions) from its producer to its last
/// reader, inclusive.
struct Lifetime {
  int64_t bytes = 0;
  int first = 0;
  int last = 0;
};

/// Offsets (multiples of `kArenaAlignment`) in one arena; `arena_bytes` is its size.
struct MemoryPlan {
  std::vector<int64_t> offsets;  ///< One per lifetime.
  int64_t arena_bytes = 0;
};

inline constexpr int64_t kArenaAlignment = 64;

/// Greedy best-fit by decreasing size (the "greedy by size" of TFLite's arena planner): each
/// tensor goes to the lowest offset where it overlaps no placed tensor whose lifetime meets its
/// own.
MemoryPlan plan_memory(const std::vector<Lifetime>& lifetimes);

/// Throws `Error(kPlan)` naming `what` and the two tensors when two tensors alive at the same
/// step overlap, or one reaches past `plan.arena_bytes`.
void check_memory_plan(const std::vector<Lifetime>& lifetimes, const MemoryPlan& plan,
                       const std::string& what);

}  // namespace stagecraft::plan
