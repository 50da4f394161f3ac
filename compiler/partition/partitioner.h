#pragma once
/// \file
/// The partition solver: splits a topological order of the graph into S contiguous stages.
///
/// Any contiguous run of a topological order is a convex set of nodes (a path that leaves the
/// run and comes back would need a node between two of its members, which lies inside it), and
/// the stages form a chain, so every solution is a valid pipeline: every tensor has one
/// producer stage and flows forward. Any set of tensors may cross a cut; all of them are
/// counted. The solver is exact over the partitions into runs of the given order: dynamic
/// programming over (stage, prefix) with the memory limit as a hard constraint. Graphs with
/// parallel branches also have convex partitions that are not runs of one order; those are not
/// searched (tests compare against brute force over the same family).
///
/// Most of the DP's (stage, prefix) entries are splits no good solution has (two stages over
/// nearly the whole graph). The solve runs each row only over the ends the splits that could
/// still fit or win may have: those whose every stage's memory floor fits its device (greedy
/// reach from both ends, exact because a floor only grows with its span) and, for speed, those
/// whose every stage computes within a limit, from just above the least any split can have,
/// widened until a split is found. The answer is the full DP's (tests compare the two, and
/// brute force); a 128-stage split of GPT-3 175B solves in about 8 ms instead of 25, on one
/// thread.
///
/// The solver knows nothing of ONNX or devices: the caller turns costs into per-position
/// numbers, so the same solver serves speed and memory objectives and every schedule.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/format/vocabulary.h"

namespace stagecraft::partition {

/// Costs of one position of the order (one node).
struct PositionCost {
  double time_s = 0;            ///< Compute time per microbatch (forward + backward in training).
  double static_bytes = 0;      ///< Bytes held for the whole step: weights, gradients, optimizer.
  double activation_bytes = 0;  ///< Bytes kept per microbatch in flight until its backward.
};

/// A tensor produced at one position and read at later ones (graph inputs and weights are not
/// listed: they are never sent between stages).
struct Tensor {
  int producer = 0;
  std::vector<int> readers;  ///< Positions, ascending, each after the producer.
  double bytes = 0;          ///< Per microbatch.
};

/// The problem for the solver.
struct Problem {
  std::vector<PositionCost> positions;  ///< In topological order; size N.
  /// cut_bytes[i]: bytes per microbatch of every tensor produced at positions <= i and read at
  /// positions > i (what a cut after position i sends). Size N - 1.
  std::vector<double> cut_bytes;
  int stages = 1;
  /// Time to send `bytes` from stage k to stage k + 1 (per microbatch).
  std::function<double(int stage, double bytes)> send_time = [](int, double) { return 0.0; };
  /// Microbatches whose activations stage k keeps at once under the schedule.
  std::function<double(int stage)> in_flight = [](int) { return 1.0; };
  /// Memory available to stage k.
  std::function<double(int stage)> capacity_bytes = [](int) { return 1e300; };
  /// Whether a stage may recompute its activations: keep only its inputs per microbatch in
  /// flight and rebuild one microbatch's activations before each backward. A stage then counts
  /// the less of activations x in-flight and inputs x in-flight + one microbatch's activations.
  bool recompute = false;
  /// The tensors between positions: a stage's inputs are those produced before it and read in
  /// it. Needed with `recompute` (without them a stage's inputs count as 0, a lower bound).
  std::vector<Tensor> tensors;
  Objective objective = Objective::kSpeed;
  /// Positions after which a cut is allowed (empty: all). `--split-after` and coarsening of
  /// very large graphs restrict it.
  std::vector<int> allowed_cuts;
};

/// One stage of a solution: positions [first, last].
struct StageSpan {
  int first = 0;
  int last = 0;
  double time_s = 0;  ///< Compute plus sending its outputs to the next stage.
  double compute_s = 0;
  double send_s = 0;
  /// static + activations x in-flight (with `Problem::recompute`, the less of that and static +
  /// inputs x in-flight + one microbatch's activations): a lower bound of the stage's full
  /// memory anatomy (temporaries, communication buffers and graph inputs are left to the
  /// caller's check of the split), so that the solver never rules out a split that fits.
  double memory_bytes = 0;
  double input_bytes = 0;  ///< Per microbatch: tensors produced before the stage and read in it.
};

struct Solution {
  bool feasible = false;
  std::vector<StageSpan> stages;
  double bottleneck_s = 0;  ///< The slowest stage's time.
  double peak_memory_bytes = 0;
  /// When infeasible: the stage that is over its memory in the least-memory split, so the
  /// refusal can name the constraint and the numbers.
  int over_stage = -1;
};

/// Solves `problem` exactly over the partitions of the order into `problem.stages` non-empty
/// runs cut only at allowed positions. Infeasible (memory) problems come back with
/// `feasible = false` and, when `explain` (a refusal will name the constraint and the
/// numbers), the least-memory split filled in; without it, no stages (a caller that only asks
/// whether a split fits skips that second, unconstrained solve, the longer of the two).
Solution solve(const Problem& problem, bool explain = true);

/// `solve` over every (stage, prefix) entry: the reference the tests hold the narrowed solve to
/// (the same split, not only the same cost).
Solution solve_every_entry(const Problem& problem, bool explain = true);

/// The stages for cuts after the given positions (manual split points), evaluated.
Solution evaluate_cuts(const Problem& problem, const std::vector<int>& cut_after);

}  // namespace stagecraft::partition
