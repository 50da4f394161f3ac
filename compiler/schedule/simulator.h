#pragma once
/// \file
/// An event simulator for pipeline schedules: given each stage's compute times, transfer times
/// and memory, it plays every device's instruction list and reports the step time, the bubble,
/// the busy and idle time and the memory of each device over time.
///
/// The model:
/// - A device runs its list in order. An instruction starts when the device is free and what
///   it waits for has run, by the rules of runtime/format/readiness.h (the validator's): a
///   forward of stage s > 0 needs its RECV_ACT done, a backward (or B) of stage s < S-1 needs
///   its RECV_GRAD done and its own forward, a W needs its B, an all-reduce or optimizer step
///   needs every weight gradient of its stage. The all-reduce itself (data parallelism) runs
///   on the device's replica link from the stage's last weight gradients on (`allreduce_s`,
///   `allreduce_buckets`), behind the device's other work; ALLREDUCE waits (idle) until it
///   has arrived. ALLREDUCE_SHARED takes no device time; the OPT_STEP
///   of a stage holding shared weights waits (idle) until every partner stage has issued its
///   ALLREDUCE_SHARED, plus shared_allreduce_s of the stage.
/// - A send takes no device time: it queues the transfer on the link (source device,
///   destination device), one link per ordered pair, which carries one transfer at a time for
///   send_s of the boundary. A receive waits (idle) until its transfer has arrived. Transfers
///   between two stages of the same device (interleaving on one device) are instantaneous.
/// - Compute (forward, backward, B, W, optimizer step) is busy time; waiting and all-reduce are
///   not. The bubble is idle time over devices * step time.
/// - Devices that share a processor (`Processors`: several pipeline devices on one GPU, CPU
///   devices whose threads outnumber the cores) take turns: a compute instruction also waits
///   until its processor is free, and holds it for (1 - overlap) of its time. Compute
///   instructions claim their processor in the order of the times they could start (ties: the
///   lower device), so a device is never held back by work that could only start later. A
///   device's wait for its processor is idle time. Their transfers are what the caller's send_s
///   says (a local copy for devices on one processor).
/// - Memory of a device: the static bytes of its stages from the start, plus activation_bytes of
///   a stage from the start of each forward to the end of the full backward or of the W that
///   consumes it. (ZB's B frees part of the activations in reality; keeping all of them until W
///   is the upper bound, and is what makes ZB-H1's peak equal 1F1B's), plus deferred_bytes of
///   a stage from the end of each B to the end of its W, plus backward_bytes of a stage while
///   one of its backward instructions runs.
///
/// The simulator checks only what it needs to index safely and to terminate; call
/// `validate_schedule` for the structure. A list that cannot run to the end is a deadlock and
/// throws `Error(kPlan)` naming each stuck device and instruction.

#include <compare>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/format/schedule.h"

namespace stagecraft::schedule {

/// The instruction kinds (`Op` values 0 .. kInstructionKinds - 1).
constexpr std::size_t kInstructionKinds = static_cast<std::size_t>(Op::kOptimizerStep) + 1;

/// Times (seconds) and bytes of each global stage. Vectors marked optional may be empty
/// (meaning zero); the others have one entry per stage (backward_input_s and
/// backward_weight_s may be empty for inference).
struct StageCosts {
  std::vector<double> forward_s;          ///< Forward of one microbatch.
  std::vector<double> backward_input_s;   ///< B: input gradient of one microbatch.
  std::vector<double> backward_weight_s;  ///< W: weight gradient; a full backward costs B + W.
  /// Optional: time to move one microbatch's activations from stage s to s + 1, and the
  /// same for its gradient back. S - 1 entries (an S-th is ignored).
  std::vector<double> send_s;
  double optimizer_s = 0;           ///< One stage's optimizer step.
  /// Optional: per stage, its optimizer step (replaces optimizer_s; the planner's: each stage
  /// streams its own weights, gradients and state, times a calibrated plan's factor).
  std::vector<double> optimizer_stage_s;
  /// Optional (0 each when empty): a fixed cost per instruction kind, indexed by `Op`
  /// (`kInstructionKinds` entries): what the runtime spends on an instruction beyond its ops
  /// (cost_models/calibration.h). A compute instruction is busy that much longer; a send holds
  /// its device that long before the transfer is queued; a receive, an all-reduce (or its
  /// shared kind) hold it that long after what they wait for has arrived.
  std::vector<double> instruction_s;
  /// Optional (0 each when empty): per device, when it starts its list (a calibrated plan's
  /// wake-up from the barrier between steps).
  std::vector<double> device_start_s;
  /// A calibrated plan's time a step takes beyond its instructions (the barriers at its start
  /// and end, its inputs handed to the devices): added to the step after its last instruction,
  /// idle time on every device.
  double step_overhead_s = 0;
  /// Optional: one stage's gradient all-reduce over the replicas, on the link (see below).
  std::vector<double> allreduce_s;
  /// Optional (1 each when empty): the buckets a stage's all-reduce is cut into. Bucket k of n
  /// is final k/n of the way through the stage's last weight-gradient instruction of the step
  /// (BWD or W) and then takes allreduce_s / n on the device's replica link (one bucket at a
  /// time), as the runtime starts each bucket's sum when the backward has made it final.
  std::vector<double> allreduce_buckets;
  /// Optional: ZeRO-1's all-gather of one stage's updated weights, at the end of its OPT_STEP
  /// (communication: the device waits, not busy; the OPT_STEP's event spans it).
  std::vector<double> allgather_s;
  /// Optional: the exchange of one stage's shared weights' gradients with their other holders,
  /// from the last holder's ALLREDUCE_SHARED to the sum being there for its OPT_STEP.
  std::vector<double> shared_allreduce_s;
  std::vector<double> activation_bytes;  ///< Optional: kept per microbatch in flight.
  std::vector<double> static_bytes;      ///< Optional: weights + gradients + optimizer state.
  /// Optional: held from the end of a split backward's B to the end of its W (the values B
  /// computes that W reads, e.g. the output gradients of weighted ops).
  std::vector<double> deferred_bytes;
  /// Optional: held only while one of the stage's backward instructions (full, B or W) runs,
  /// e.g. the activations recomputation rebuilds for it.
  std::vector<double> backward_bytes;
};

/// Which processor each device computes on, when some share one.
struct Processors {
  /// Per device, its processor (devices with equal numbers share it). Empty: every device has
  /// its own, and the simulation is the one without this argument, to the bit.
  std::vector<int> of_device;
  /// In [0, 1): the part of a compute instruction's time that another device of its processor
  /// may overlap; the processor is held for (1 - overlap) of it. 0: co-located kernels run one
  /// at a time.
  double overlap = 0;
};

/// What a device holds at the instant of its peak, by what holds it. The parts add up to the
/// peak (`SimResult::device_peak_bytes`).
struct PeakParts {
  double time_s = 0;             ///< When the step first reaches the peak.
  double static_bytes = 0;       ///< static_bytes of the device's stages.
  double activation_bytes = 0;   ///< activation_bytes of the (stage, microbatch) pairs held.
  double deferred_bytes = 0;     ///< deferred_bytes of the split backwards between B and W.
  double backward_bytes = 0;     ///< backward_bytes of the backward running at that instant.
  int64_t activations_held = 0;  ///< (stage, microbatch) pairs whose activations are held.
};

/// What one simulated step gives.
struct SimResult {
  double step_s = 0;                  ///< From the start to the last instruction or transfer.
  double bubble_fraction = 0;         ///< Sum of idle / (devices * step), compute counted as busy.
  std::vector<double> device_busy_s;  ///< Compute time per device.
  std::vector<double> device_idle_s;  ///< step_s - busy per device.
  std::vector<double> device_peak_bytes;     ///< Static plus activations at their highest.
  std::vector<PeakParts> device_peak_parts;  ///< Per device, the parts of its peak.
  /// Per device, (time, bytes) at the start and after every change, in time order.
  std::vector<std::vector<std::pair<double, double>>> memory_timeline;
  std::vector<TimelineEvent> events;  ///< Every instruction, per device in list order.

  /// Throughput for a step of `batch` samples (all microbatches together); 0 for a step that
  /// takes no time.
  double samples_per_s(int batch) const;
};

/// How much of a simulation `simulate` keeps.
enum class SimDetail {
  kFull,   ///< Everything: every instruction's event and every device's memory over time.
  kPeaks,  ///< The step, busy and idle times and the peaks (their parts and instants); `events`
           ///< and each device's `memory_timeline` empty: the split search's candidates.
};

/// Plays `schedule` on a pipeline of `shape` with `costs`, its devices on `processors`. Throws
/// `Error(kUsage)` when the costs do not match the stages (wrong count, negative or non-finite
/// value) or `processors` the devices (not one per device, an overlap outside [0, 1)), and
/// `Error(kPlan)` on a deadlock or an instruction outside the pipeline.
SimResult simulate(const Schedule& schedule, const PipelineShape& shape, const StageCosts& costs,
                   const Processors& processors = {}, SimDetail detail = SimDetail::kFull);

/// One instruction of a recorded order of play: instruction `position` of `device`'s list.
struct PlayStep {
  int device = 0;
  size_t position = 0;
};

/// A schedule checked once and its order of play (readiness.h's rules) recorded, for simulating
/// it with many costs: the split search's candidates share one schedule and differ in their
/// stages' costs only. Where no processor is shared the times depend only on each instruction's
/// inputs, so playing the recorded order gives `simulate`'s result to the bit without asking the
/// rules again.
struct PreparedSchedule {
  Schedule schedule;
  PipelineShape shape;
  std::vector<PlayStep> order;  ///< Every instruction once, each after what it waits for.
};

/// Checks `schedule` on `shape` as `simulate` does (throwing the same errors, a deadlock
/// included) and records its order of play.
PreparedSchedule prepare_schedule(Schedule schedule, const PipelineShape& shape);

/// `simulate(prepared.schedule, prepared.shape, costs, processors, detail)`, the schedule's
/// checks and rules not asked again (with processors shared, the rules decide by the times, and
/// are asked as simulate asks them).
SimResult simulate(const PreparedSchedule& prepared, const StageCosts& costs,
                   const Processors& processors = {}, SimDetail detail = SimDetail::kFull);

/// Per stage, the most microbatches whose activations it holds at once under `schedule`, counted
/// from each forward to the end of that microbatch's backward (its B when the backward is split:
/// what W still reads after B is the stage's deferred_bytes). Only the order of each device's
/// list matters, not the times: GPipe gives M, 1F1B and ZB-H1 min(P - i, M) on device i, and
/// the interleaved schedule each chunk's own count (chunk 0 holds more than the others).
std::vector<int64_t> stage_in_flight_peaks(const Schedule& schedule, const PipelineShape& shape);

/// Per device, the most activation bytes its stages hold together at any point of its list:
/// `kept_bytes[s]` per microbatch of stage s in flight (counted as in stage_in_flight_peaks), plus
/// `backward_bytes[s]` while a backward (full, B or W) of stage s runs (the activations
/// recomputation rebuilds for it). Summing each stage's own peak instead over-counts an
/// interleaved device by up to half, since its chunks peak at different times. Either vector may
/// be empty (zero); otherwise one entry per stage. The simulator holds a split backward's
/// activations until its W, an upper bound of this. With `only_device` >= 0 only that device is
/// walked (the others' entries are 0).
std::vector<double> activation_peaks(const Schedule& schedule, const PipelineShape& shape,
                                     const std::vector<double>& kept_bytes,
                                     const std::vector<double>& backward_bytes,
                                     int only_device = -1);

/// A point of a device's list at which its activations may peak: how many microbatches each of
/// its stages holds then, and which of them runs a backward (full, B or W) that rebuilds its
/// backward_bytes.
struct ActivationMoment {
  std::vector<int64_t> held;  ///< Per stage of the device (ActivationMoments::stages' order).
  int running = -1;           ///< The index of that stage there, or -1 for none.

  friend auto operator<=>(const ActivationMoment&, const ActivationMoment&) = default;
};

/// The points of every device's list at which its activations may peak, whatever the bytes: the
/// points activation_peaks looks at, less those another dominates (it holds at least as many
/// microbatches of every stage, and runs the same backward or the other runs none). Built once
/// per schedule, it makes activation_peaks over many byte vectors (the split search weighs each
/// candidate's stages' recomputation with it) a few sums a device rather than a walk of its list.
struct ActivationMoments {
  PipelineShape shape;
  std::vector<std::vector<int>> stages;                ///< Per device, its stages ascending.
  std::vector<std::vector<ActivationMoment>> moments;  ///< Per device.
};

ActivationMoments activation_moments(const Schedule& schedule, const PipelineShape& shape);

/// activation_peaks of the schedule `moments` was built from: the same figures, to the bit.
std::vector<double> activation_peaks(const ActivationMoments& moments,
                                     const std::vector<double>& kept_bytes,
                                     const std::vector<double>& backward_bytes,
                                     int only_device = -1);

}  // namespace stagecraft::schedule
