#pragma once
/// \file
/// Small plans built in code for the plan-format and stagedump tests: consistent by
/// construction, written to a folder with a schedule.json and tiny stage files (any bytes:
/// nothing here parses ONNX).

#include <string>

#include "compiler/schedule/simulator.h"
#include "runtime/format/plan.h"

namespace stagecraft::testing {

/// A consistent plan for `schedule` ("1f1b", "zb-h1", "interleaved", "gpipe", "inference") on
/// `devices` x `chunks` stages with `microbatches` of 2 samples. Stage k runs nodes
/// "s<k>_a", "s<k>_b"; stage 0 reads the graph input "x", the last stage the graph input
/// "labels"; "act<k>" goes from stage k to k + 1, a skip tensor "skip" from stage 0 to the last
/// stage, and the last stage writes the graph output "loss". Forward 1 ms and backward 2 ms per
/// stage (B 1 ms, W 1 ms), no send time, no optimizer time; the predicted step, bubble and
/// timeline simulated from them with each device's peak (`device_memory`), the other
/// predictions made up but valid.
plan::Plan sample_plan(const std::string& schedule = "1f1b", int devices = 2, int chunks = 1,
                       int microbatches = 4);

/// The simulator's costs from a plan's per-stage figures (forward, B, W, optimizer, send, shared
/// exchange, static (weights, gradients, optimizer) and per-microbatch activation memory): how
/// the planner's simulation saw it.
schedule::StageCosts stage_costs(const plan::Plan& plan);

/// Writes `plan` into `dir` (created): stage files with a few bytes each (their hashes recorded
/// in the plan first), plan.json, and schedule.json as compiler/schedule builds it for the
/// plan's shape. Returns the plan as written (with the hashes).
plan::Plan write_plan_dir(plan::Plan plan, const std::string& dir);

/// Replaces the first `from` in the file at `path` by `to`; throws when `from` is not there.
void edit_file(const std::string& path, const std::string& from, const std::string& to);

}  // namespace stagecraft::testing
