#pragma once
/// \file
/// The views of `stagedump`, each a pure function of a loaded `PlanView`.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/dump/measured.h"
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

/// Chrome's Trace Event Format (chrome://tracing, ui.perfetto.dev; schema
/// docs/schemas/trace.schema.json): one process per device and run, "predicted / device 0"
/// (pid 1 + d) and "measured / device 0" (pid 1001 + g), each with threads "steps" (a slice per
/// step), "compute", "receive / wait" and "send" lanes; one complete ("X") slice per timeline
/// event, named letter + microbatch ("F3", "B3 chunk 1" when interleaved, "send act 3 to stage
/// 2"), args {device, stage, microbatch, op (schedule.json's name), [chunk], [step],
/// [recompute]}; per predicted device a counter "memory device N" (args {bytes}) whose highest
/// value is its predicted peak; `otherData` {format_version}. A traced `measured` run is added
/// (every step, its sends and its memory counters), the predicted step laid over its median
/// step.
nlohmann::ordered_json render_trace(const PlanView& view, const MeasuredRun* measured = nullptr);

/// The trace of a measured run alone (stagerun --trace), in the form of `render_trace`, with a
/// counter "memory device N" per device from `memory` (the runtime's meter, sampled at every
/// instruction).
nlohmann::ordered_json measured_trace(const plan::Plan& plan,
                                      const std::vector<MeasuredStep>& steps,
                                      const std::vector<MeasuredMemory>& memory = {});

/// A self-contained HTML page (no external assets; inline CSS and SVG that scale to the window):
/// the header facts, the plan beside its baselines (the better marked), the stage table, the
/// tensors crossing each cut, memory per device (its parts, the one predicted peak, the
/// capacity) and the timeline of every instruction on a time axis; a `measured` run overlaid
/// (its median step's instructions under each device, its step time, its peaks). A short script
/// at the end writes a marker (`#stagedump-drawn`, the boxes drawn) for headless checks.
std::string render_html(const PlanView& view, const MeasuredRun* measured = nullptr);

}  // namespace stagecraft::dump
