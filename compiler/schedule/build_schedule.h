#pragma once
/// \file
/// The schedule builders: the per-device instruction streams (runtime/format/schedule.h) of each
/// schedule kind for a pipeline shape.

#include "runtime/format/schedule.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::schedule {

/// Builds the per-device instruction streams of `kind` for `shape`. Throws `Error(kUsage)` for
/// a shape the kind cannot serve, naming the numbers: P, V or M below 1, V != 1 for a schedule
/// without chunks (V != 2 for zb-v and dualpipev), M not a multiple of P for the interleaved
/// schedule, M < 2P for dualpipev, a training schedule asked for inference or the inference
/// schedule asked for training.
Schedule build_schedule(ScheduleKind kind, const PipelineShape& shape);

/// Each device's compute instructions (FWD, BWD, BWD_INPUT, BWD_WEIGHT) in the order it runs
/// them: a schedule without its transfers and step-level ops (a custom schedule read from
/// torch's CSV: compiler/schedule/torch_csv.h).
using ComputeOrder = std::vector<std::vector<Instruction>>;

/// The schedule that runs `order` on `shape`, written as the builders write theirs: each
/// receive right before the compute that needs it, each send right after the compute that
/// produces it, and the step's all-reduces and optimizer steps at the end (in training). Does
/// not validate it (validate_schedule does); throws `Error(kUsage)` for an order with another
/// device count than `shape` or an instruction that is not a compute op.
Schedule schedule_from_order(const ComputeOrder& order, const PipelineShape& shape);

}  // namespace stagecraft::schedule
