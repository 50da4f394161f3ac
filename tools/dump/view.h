#pragma once
/// \file
/// What stagedump shows, and the helpers its views share. A `PlanView` is a plan read the way
/// the runtime reads it (runtime/format's `load_plan`, the schedule format of
/// runtime/format/schedule.h) with its schedule re-played by the event simulator; every view (text,
/// JSON, Graphviz, Chrome trace, HTML) is a pure function of it. Nothing here links the compiler's
/// IR.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/schedule/simulator.h"
#include "runtime/format/plan.h"
#include "runtime/format/schedule.h"

namespace stagecraft::dump {

/// A loaded plan and its re-simulated schedule.
struct PlanView {
  std::string plan_dir;
  plan::Plan plan;
  schedule::Schedule schedule;    ///< As read from PLAN_DIR/schedule.json.
  schedule::PipelineShape shape;  ///< The plan's devices, chunks, microbatches, training, shared groups.
  schedule::SimResult simulated;  ///< The schedule played with `stage_costs(plan)`.
};

/// Loads PLAN_DIR: `plan::load_plan` (validation, stage files and hashes), then schedule.json,
/// checked with `validate_schedule` against the plan's shape and simulated. Errors name the file.
PlanView load_view(const std::string& plan_dir);

/// The simulator's costs from a plan's per-stage predictions: forward = fwd_ms, send = send_ms,
/// static memory = everything but activations, activations per microbatch = activations /
/// in_flight, shared weights' exchange = shared_exchange_ms. The plan records one backward time per stage, so it is split half and half into
/// the input gradient (B) and the weight gradient (W): only ZB-H1 runs them apart, and a full
/// backward costs B + W = bwd_ms whatever the split.
schedule::StageCosts stage_costs(const plan::Plan& plan);

/// A tensor produced by one stage and read by later ones (a stage output with peer stages).
struct CutTensor {
  const plan::StageTensor* tensor;  ///< The producer's output entry.
  int from;                         ///< Producing stage.
};

/// The tensors that cross the cut between stage `cut` and `cut + 1`: produced at or before
/// `cut` and read after it (a skip connection crosses several cuts).
std::vector<CutTensor> tensors_crossing(const plan::Plan& plan, int cut);

/// The compute events of a simulation (forward, backward, B, W, optimizer step) with a
/// duration, in device then time order: what the timelines draw.
std::vector<schedule::TimelineEvent> compute_events(const schedule::SimResult& result);

/// 'F' forward, 'B' backward or its input-gradient half, 'W' weight gradient, 'O' optimizer
/// step; lower case for chunks after the first of a device (interleaved schedules).
char event_letter(const schedule::TimelineEvent& event, int devices);

/// "forward", "backward", "backward_input", "backward_weight", "optimizer" (trace categories).
std::string_view event_category(schedule::Op op);

/// Bytes for people: "512 B", "3.50 KiB", "12.0 MiB", "1.25 GiB".
std::string format_bytes(double bytes);

/// An integer with thousands separators: "136,960".
std::string with_commas(int64_t value);

/// A fill colour per stage ("#8dd3c7", ...), repeating after twelve; shared by DOT and HTML.
std::string_view stage_colour(int stage);

/// A count and its noun, plural when it is not 1: "1 chunk", "2 chunks"; `plural_noun` when
/// adding an "s" will not do ("microbatches").
std::string plural(int64_t count, std::string_view noun, std::string_view plural_noun = "");

}  // namespace stagecraft::dump
