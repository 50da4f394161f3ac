#pragma once
/// \file
/// The views of `stagedump`, each a pure function of a loaded `PlanView`.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/dump/view.h"

namespace stagecraft::dump {

/// The default report: header, stage table, memory anatomy, reasons, cut tensors, prediction
/// beside the baselines, and the ASCII timeline.
std::string render_text(const PlanView& view);

/// One row per device over `columns` columns: each compute event is its letter
/// (`event_letter`), its microbatch number when there is room, then '-' for the rest of its
/// duration; '.' is idle. An event shorter than a column takes one column if it is free.
/// Followed by a time axis and a legend.
std::string render_ascii_timeline(const PlanView& view, int columns = 100);

/// The `--json` document (its `format_version` is tools/json_formats.h's kDumpJsonVersion); its
/// schema is documented at the top of tools/stagedump.cpp and in
/// docs/schemas/stagedump.schema.json.
nlohmann::ordered_json render_json(const PlanView& view);

/// A Graphviz digraph: one cluster per stage, ops filled with the stage's colour and chained
/// in execution order, one edge per pair of stages that exchange tensors (labelled with the
/// tensors and their bytes), and the graph inputs and outputs as ellipses.
std::string render_dot(const PlanView& view);

/// Chrome's Trace Event Format for a timeline: one complete ("X") event per compute event,
/// named letter + microbatch ("F3"), category `event_category`, ts and dur in microseconds,
/// pid 0, tid = device, args {stage, microbatch}; one "thread_name" metadata event per device
/// ("device N") and a "process_name" (`process`); `otherData` {format_version}. stagerun will write measured runs in the same
/// form so that both open side by side in chrome://tracing or Perfetto.
nlohmann::ordered_json trace_json(const std::vector<schedule::TimelineEvent>& events, int devices,
                                  const std::string& process);

/// The predicted timeline of a plan as `trace_json`, with a counter track per device ("C" events
/// named "memory device N", args {bytes}): its predicted memory over the step, peaking at the
/// device's predicted peak.
nlohmann::ordered_json render_trace(const PlanView& view);

/// A self-contained HTML page: the header facts, the stage table, memory per device as stacked
/// bars and the timeline, both inline SVG; no scripts, no external assets.
std::string render_html(const PlanView& view);

}  // namespace stagecraft::dump
