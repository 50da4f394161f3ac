#pragma once
/// \file
/// The schedule builders: the per-device instruction streams (runtime/format/schedule.h) of each
/// schedule kind for a pipeline shape.

#include "runtime/format/schedule.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::schedule {

/// Builds the per-device instruction streams of `kind` for `shape`. Throws `Error(kUsage)` for
/// a shape the kind cannot serve, naming the numbers: P, V or M below 1, V != 1 for a schedule
/// without chunks, M not a multiple of P for the interleaved schedule, a training schedule
/// asked for inference or the inference schedule asked for training.
Schedule build_schedule(ScheduleKind kind, const PipelineShape& shape);

}  // namespace stagecraft::schedule
