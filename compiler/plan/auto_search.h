#pragma once
/// \file
/// stagec --auto: the schedule, microbatch count, chunks, recomputation and data-parallel degree
/// chosen by planning and simulating each configuration (plan.json "auto_search").

#include <functional>
#include <string>

#include "compiler/plan/planner.h"

namespace stagecraft::plan {

/// Which searched choices the command line gave: those are held at PlanOptions' values.
struct AutoFixed {
  bool schedule = false;
  bool microbatches = false;
  bool chunks = false;
  bool recompute = false;
  bool data_parallel = false;
};

/// Where the search stands, for a progress line: configurations done of all, and the best
/// fitting one so far (nullptr before any fits).
using AutoProgress =
    std::function<void(int done, int total, const AutoCandidate* best, double seconds)>;

/// The search's space, before any planning: every configuration of the built-in schedules the
/// plan admits (training: gpipe, 1f1b, interleaved, zb-h1, zb-v, dualpipev; inference: those
/// that run without a backward), microbatch counts M per replica dividing the global batch / R
/// with M <= 8 x P (more shrink a bubble already under 1/8 and only cost efficiency), chunks
/// 2..4 for interleaved (zb-v's and dualpipev's fixed 2; dualpipev's M < 2P are refused when
/// planned), recomputation none and auto when training, and every R dividing the devices;
/// less what `fixed` holds at `o`'s values. Each has no status yet. Refuses (kUsage) options
/// the search cannot take: no --batch, --schedule-csv.
std::vector<AutoCandidate> auto_space(const PlanOptions& o, const AutoFixed& fixed);

/// Plans every configuration of auto_space (the split search of each, as make_plan does) with
/// each device's memory a hard limit, and returns the plan of the best that fits: the shortest
/// predicted step (ties: the smaller peak), or with --objective memory the smallest peak
/// (ties: the shorter step). Its `plan.auto_search` lists every configuration, best first.
/// Shared work is done once: the op costs of a microbatch size give each later configuration
/// of that size a lower bound (its devices' share of the batch's compute, and one
/// microbatch's pass through every op), and under the speed objective a configuration whose
/// bound is no shorter than the best step found is skipped ("pruned"). So is one whose
/// pipeline devices cannot hold their share of the model's weights, gradients and optimizer
/// state (known from the first plan; not with --shard-optimizer).
/// Refuses (kPlan) a space where nothing fits, naming the smallest peak found and the limit.
PlannedModel auto_plan(const PlanOptions& o, const AutoFixed& fixed,
                       const AutoProgress& progress = {});

/// For the terminal: the choice and why (its step, bubble and peak against the runner-up's),
/// how many configurations were planned, pruned and refused, and the next `shown` with their
/// step, bubble and peak. "" for a plan without a search.
std::string describe_auto_search(const Plan& plan, std::size_t shown = 5);

}  // namespace stagecraft::plan
