#pragma once
/// \file
/// What stagedump shows, and the helpers its views share. A `PlanView` is a plan read the way
/// the runtime reads it (runtime/format's `load_plan` and schedule format); every view (text,
/// JSON, Graphviz, Chrome trace, HTML) is a pure function of it. The timelines draw the plan's
/// own `timeline`, what the planner's simulation predicted: nothing here simulates, and nothing
/// links the compiler.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/format/bytes.h"
#include "runtime/format/instruction_costs.h"
#include "runtime/format/plan.h"
#include "runtime/format/schedule.h"

namespace stagecraft::dump {

/// A loaded plan and its schedule.
struct PlanView {
  std::string plan_dir;
  plan::Plan plan;
  schedule::Schedule schedule;    ///< As read from PLAN_DIR/schedule.json.
  /// The plan's devices, chunks, microbatches, training, shared groups.
  schedule::PipelineShape shape;
  /// plan.json's "instruction_costs" (fixed costs per instruction, calibration); empty when
  /// absent.
  plan::PlanInstructionCosts instruction_costs;
};

/// Loads PLAN_DIR: `plan::load_plan` (validation, stage files and hashes), then schedule.json,
/// checked with `validate_schedule` against the plan's shape. Errors name the file.
PlanView load_view(const std::string& plan_dir);

/// A tensor produced by one stage and read by later ones (a stage output with peer stages).
struct CutTensor {
  const plan::StageTensor* tensor;  ///< The producer's output entry.
  int from;                         ///< Producing stage.
};

/// The tensors that cross the cut between stage `cut` and `cut + 1`: produced at or before
/// `cut` and read after it (a skip connection crosses several cuts).
std::vector<CutTensor> tensors_crossing(const plan::Plan& plan, int cut);

/// The compute events of a timeline (forward, backward, B, W, optimizer step) with a duration,
/// in device then time order: what the timelines draw.
std::vector<schedule::TimelineEvent> compute_events(
    const std::vector<schedule::TimelineEvent>& timeline);

/// 'F' forward, 'B' backward or its input-gradient half, 'W' weight gradient, 'O' optimizer
/// step; lower case for chunks after the first of a device (interleaved schedules).
char event_letter(const schedule::TimelineEvent& event, int devices);

/// "forward", "backward", "backward_input", "backward_weight", "optimizer" (trace categories).
std::string_view event_category(schedule::Op op);

/// Bytes for people, as every tool prints them (runtime/format/bytes.h).
using stagecraft::format_bytes;

/// An integer with thousands separators: "136,960".
std::string with_commas(int64_t value);

/// A fill colour per stage ("#8dd3c7", ...), repeating after twelve; shared by DOT and HTML.
std::string_view stage_colour(int stage);

/// A count and its noun, plural when it is not 1: "1 chunk", "2 chunks"; `plural_noun` when
/// adding an "s" will not do ("microbatches").
std::string plural(int64_t count, std::string_view noun, std::string_view plural_noun = "");

/// A training plan's gradient clipping where the optimizer is shown: " with gradients clipped
/// to a global norm of at most C" ("" when it clips none).
std::string clip_words(const plan::Plan& plan);

}  // namespace stagecraft::dump
