#pragma once
/// \file
/// A measured run of a plan, for stagedump's `--measured RUN`: what `stagerun PLAN --trace FILE`
/// wrote (every compute instruction of every step, timed) or what `stagerun PLAN --json` wrote
/// (JSON Lines: the step times, then a summary with each device's busy fraction and peak). It is
/// checked against the plan before any view draws it: a run of another plan (another device
/// count, microbatch count, schedule or prediction) is refused in one line naming the file and
/// the field.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tools/dump/view.h"

namespace stagecraft::dump {

/// One measured instruction of a traced run; `recompute` marks a forward that a recomputing
/// stage re-ran just before its backward (the runtime times it apart; it is no instruction of
/// the schedule).
struct MeasuredEvent {
  schedule::TimelineEvent event;  ///< Times in seconds from the run's start.
  bool recompute = false;
};

/// A device's metered bytes at one instant of a traced run (seconds from the run's start): the
/// runtime's count of its weights, arena and the tensors it holds, after every instruction.
struct MeasuredMemory {
  int device = 0;
  double time_s = 0;
  int64_t bytes = 0;
};

/// One step of a traced run: the events of every device, from the first one's start to the last
/// one's end.
struct MeasuredStep {
  double start_s = 0;
  double end_s = 0;
  std::vector<MeasuredEvent> events;
  /// The runtime's own length of the step, milliseconds: stagerun's step, from the barrier at
  /// its start to the one at its end, so also what lies around the events (the trace's
  /// otherData.step_ms); -1 where the trace does not say (one written before it kept them).
  double runtime_ms = -1;
};

/// A device of a `stagerun --json` summary.
struct MeasuredDevice {
  double busy_fraction = 0;
  int64_t peak_bytes = 0;
};

/// A run of the plan, as measured.
struct MeasuredRun {
  std::string path;
  bool traced = false;              ///< stagerun --trace (events), else stagerun --json (figures).
  int devices = 0;                  ///< Every replica's: R x P.
  /// Every step, the warm-up first (a trace's: the runtime's length, else its events' span).
  std::vector<double> step_ms;
  int reported_step = 0;            ///< The median step without the warm-up (stagerun's rule).
  std::vector<MeasuredStep> steps;  ///< Traced runs only.
  /// Traced runs only: every device's memory counter ("memory device N" of its measured
  /// process), in the order of the file; empty for a trace written before stagerun kept one.
  std::vector<MeasuredMemory> memory;
  std::vector<MeasuredDevice> device;  ///< --json runs (R x P), or a trace given one (merge).
  double bubble_fraction = -1;         ///< Likewise (-1: unknown).
  /// A trace given a --json run's figures (`with_summary`): that run's file and median step.
  std::string summary_path;
  double summary_step_ms = 0;

  double reported_step_ms() const { return step_ms.at(static_cast<size_t>(reported_step)); }
};

/// Reads RUN (a `stagerun --trace` file or `stagerun --json` JSON Lines) and checks that it is a
/// run of `view`'s plan: for a trace, the device count and every device's compute instructions
/// in the order of schedule.json, step after step; for --json, the summary's devices,
/// microbatches, schedule and predicted step. Throws `Error(kFormat)` or `Error(kPlan)` naming
/// RUN and the field.
MeasuredRun load_measured(const std::string& path, const PlanView& view);

/// A traced run with the figures of a `stagerun --json` run of the same plan beside it (each
/// device's measured peak and busy fraction, the measured bubble), which a trace lacks: what
/// `stagedump --measured TRACE --measured JSON` draws. Throws `Error(kUsage)` unless `traced` is a
/// trace and `summary` a --json run.
MeasuredRun with_summary(MeasuredRun traced, const MeasuredRun& summary);

/// Splits the events of a traced run (times from the run's start) into its steps, checking every
/// device's timed instructions (`is_timed`) against its list in `schedule` (device g runs list
/// g % P), step after step; a recomputing stage's forward re-run just before its backward (B or
/// W) is kept, marked; receives' waits and sends are kept in the step they fall in (a send after
/// a step's last timed instruction in that step), unmatched. Throws
/// `Error(kPlan)` naming `source` and the event (`where(i)` for events[i]) for an event on a device
/// the plan lacks, one out of the schedule's order, a device that stops inside a step, and devices
/// that ran different step counts.
std::vector<MeasuredStep> split_steps(const std::vector<schedule::TimelineEvent>& events,
                                      const plan::Plan& plan, const schedule::Schedule& schedule,
                                      const std::string& source,
                                      const std::function<std::string(size_t)>& where);

/// The step stagerun reports: the median of `step_ms` without the first (the warm-up); the lower
/// of the two middle ones for an even count; with one step, that one.
int median_step(const std::vector<double>& step_ms);

/// RECV_ACT and RECV_GRAD: a traced run has their waits too (not matched against the schedule).
bool is_receive(schedule::Op op);

/// SEND_ACT and SEND_GRAD: a traced run times them too (not matched against the schedule).
bool is_send(schedule::Op op);

/// True for the instructions a traced run times and matches against the schedule: FWD, BWD,
/// BWD_INPUT, BWD_WEIGHT, OPT_STEP and ALLREDUCE.
bool is_timed(schedule::Op op);

}  // namespace stagecraft::dump
