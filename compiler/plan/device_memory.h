#pragma once
/// \file
/// An estimate of one device's memory: all of its stages (the chunks of an interleaved schedule)
/// together, with the activations they hold at once under the schedule, from the order of its
/// instructions alone (no simulation). The planner uses it to choose which stages recompute; the
/// device's figure, which every split is checked against and every view shows, is the simulated
/// peak (compiler/schedule/device_peak.h), which holds a split backward's activations until its
/// W and what B leaves for W besides.

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/schedule/simulator.h"
#include "runtime/format/plan.h"
#include "runtime/format/schedule.h"

namespace stagecraft::plan {

/// What one device holds at its peak, by what holds it.
struct DeviceMemory {
  int device = 0;
  std::vector<int> stages;  ///< Its stages, ascending.
  int64_t weights = 0;      ///< Sums over its stages (each holds its own).
  int64_t gradients = 0;
  int64_t optimizer = 0;
  int64_t communication = 0;
  /// The largest of its stages' working arenas: the stages of a device run one at a time and
  /// share one arena (what the runtime allocates).
  int64_t temporary = 0;
  /// Its stages' activations at their highest together (schedule::activation_peaks): per
  /// microbatch in flight each stage keeps its activations (its inputs when it recomputes), and
  /// a recomputing stage rebuilds one microbatch's activations while its backward runs.
  int64_t activations = 0;

  int64_t total() const;
};

/// The bytes of a stage's inputs (received or fed) for one microbatch: what training keeps
/// per microbatch in flight until its backward, and all a recomputing stage keeps.
int64_t stage_input_bytes(const Stage& stage);

/// The memory of every device of `stages` (plan stages with their anatomies, recomputation and
/// inputs filled in) under `schedule` on `shape`. For one stage per device it is the stage's own
/// anatomy; for an interleaved device it is less than the sum of its chunks' anatomies, whose
/// activation peaks fall at different times.
std::vector<DeviceMemory> device_memory(const std::vector<Stage>& stages,
                                        const schedule::Schedule& schedule,
                                        const schedule::PipelineShape& shape);

/// The same, `stages` one pointer per stage of the pipeline.
std::vector<DeviceMemory> device_memory(const std::vector<const Stage*>& stages,
                                        const schedule::Schedule& schedule,
                                        const schedule::PipelineShape& shape);

/// The memory of `device` alone. `stages` has one pointer per stage of the pipeline (only the
/// device's own are read), so a caller weighing choices per stage (recomputation) copies none.
DeviceMemory device_memory(int device, const std::vector<const Stage*>& stages,
                           const schedule::Schedule& schedule,
                           const schedule::PipelineShape& shape);

/// The same two from `moments` (schedule::activation_moments of the schedule and shape, built
/// once): the same figures without walking the lists, for the split search's candidates.
std::vector<DeviceMemory> device_memory(const std::vector<const Stage*>& stages,
                                        const schedule::ActivationMoments& moments);
DeviceMemory device_memory(int device, const std::vector<const Stage*>& stages,
                           const schedule::ActivationMoments& moments);

}  // namespace stagecraft::plan
