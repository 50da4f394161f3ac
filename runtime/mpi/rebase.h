#pragma once
/// \file
/// A rank's trace events and memory samples moved onto rank 0's clock (runtime/mpi/world.cpp
/// gathers them for `stagerun --trace` under mpirun). Header-only, without MPI, so a test
/// without mpirun checks it.

#include <algorithm>
#include <vector>

#include "runtime/exec/pipeline.h"
#include "runtime/format/schedule.h"

namespace stagecraft::rt::mpi {

/// Moves `events` and `memory` of a rank from its clock to rank 0's by one shift: the median over
/// the steps of the difference between rank 0's step start and the rank's (`rank0_starts`,
/// `rank_starts`: every rank starts each step at the step barrier). One shift keeps the rank's
/// own events in their order; a shift per step did not, where rank 0 left one step's barrier
/// late (a loaded machine) and the rank's last event of that step then landed after its next
/// step's first (stagedump --measured refused the trace). The error is each barrier's skew from
/// the median, microseconds on an idle machine.
inline void rebase_events(std::vector<schedule::TimelineEvent>& events,
                   std::vector<MemorySample>& memory, const std::vector<double>& rank_starts,
                   const std::vector<double>& rank0_starts) {
  const size_t steps = std::min(rank_starts.size(), rank0_starts.size());
  if (steps == 0) return;
  std::vector<double> shifts(steps);
  for (size_t s = 0; s < steps; ++s) shifts[s] = rank0_starts[s] - rank_starts[s];
  std::nth_element(shifts.begin(), shifts.begin() + static_cast<long>(steps / 2), shifts.end());
  const double by = shifts[steps / 2];
  for (schedule::TimelineEvent& e : events) {
    e.start_s += by;
    e.end_s += by;
  }
  for (MemorySample& m : memory) m.time_s += by;
}

}  // namespace stagecraft::rt::mpi
