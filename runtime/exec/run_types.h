#pragma once
/// \file
/// What a pipeline run (runtime/exec/pipeline.h `Pipeline::run`) is given and gives back: the
/// run's options, its report (per device, per step, the memory samples), the model's inputs and
/// outputs as the pipeline sees them, and dynamic loss scaling's state. Plain data, apart from
/// the pipeline, so the executor's internals (run_state.h, device_worker.h) need not include it.

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/exec/transport.h"
#include "runtime/format/schedule.h"

namespace stagecraft::rt {

/// Dynamic loss scaling (a training plan of precision fp16: the stage graphs compute in
/// float16, whose largest value is 65504 and smallest normal 2^-14): every microbatch's loss
/// gradient is seeded `scale` times larger, so small gradients stay above float16's underflow;
/// each stage's float32 master gradients are divided by `scale` at its OPT_STEP (after the
/// replicas' sum) and checked. A step where any gradient of any stage or replica is inf or NaN
/// updates no weight anywhere (every stage's update waits for the step's end, where all agree)
/// and halves `scale`; after `window` clean steps in a row `scale` doubles. A skipped step
/// still counts as a step (the lr schedule and Adam's bias correction go on).
struct LossScale {
  double scale = 65536;      ///< S, a power of two unless given otherwise (stagerun --loss-scale).
  int64_t window = 2000;     ///< N: clean steps before S doubles (stagerun --loss-scale-window).
  int64_t clean_steps = 0;   ///< Clean steps since S last changed (checkpoints keep it).
  int64_t skipped = 0;       ///< Steps skipped by this pipeline's runs so far.
  /// Throws `Error(kUsage)` naming `flag` unless `scale` is finite and above 0.
  static void check_scale(double scale, const char* flag);
  /// Throws `Error(kUsage)` naming --loss-scale-window unless `window` >= 1.
  static void check_window(int64_t window);
};

/// A graph input or output of the whole model, per microbatch.
struct ModelTensor {
  std::string name;
  DType dtype = DType::kUndefined;
  Shape shape;  ///< Per microbatch.
};

/// What the devices of every process agree on at each step barrier (RunOptions::step_barrier):
/// each gives its own, all get the same combination.
struct StepFlags {
  /// Dynamic loss scaling: some device found an inf or NaN gradient in the step (any sets it).
  bool overflow = false;
  /// A stop was asked for (RunOptions::stop_requested): the signal's number, 0 for none (the
  /// highest number given wins, so every process names the same one).
  int stop_signal = 0;
};

struct RunOptions {
  int steps = 1;
  /// Data parallelism: the most bytes of a stage's gradients summed over the replicas as one
  /// bucket (> 0; stagerun --bucket-mb). Buckets hold whole weights (a larger weight is a bucket
  /// alone), the same on every replica.
  int64_t bucket_bytes = schedule::kDefaultGradientBucketBytes;
  /// Data parallelism: start each bucket's sum as soon as the backward has made its gradients
  /// final (true), or only at the stage's ALLREDUCE, all of them after the whole backward
  /// (false: stagerun --no-overlap, for comparison).
  bool overlap_allreduce = true;
  /// Called after each step with (step done, steps, seconds so far).
  std::function<void(int, int, double)> progress;
  /// Test hook: the node of this name fails when it runs (proves a failing worker stops all).
  std::string inject_fault;
  /// Training: go on when the loss is NaN or infinite (otherwise the run stops, naming the step).
  bool skip_nonfinite = false;
  /// Training: called every `checkpoint_every` optimizer steps and after the last step, with
  /// the optimizer steps done so far, while every worker waits (weights and optimizer state
  /// are quiet: a checkpoint may be saved). An `Error` it throws stops the run, unchanged.
  std::function<void(int64_t)> checkpoint;
  int checkpoint_every = 0;  ///< 0: only after the last step.
  /// Whether `checkpoint` is also called after the run's last step (a stop's step and every
  /// `checkpoint_every` are saved either way): false for one of several one-step runs that
  /// make up a training (stagerun --data, --tokens), whose last step is not the training's.
  bool checkpoint_at_end = true;
  /// Training plan: run the forward only, as a held-out evaluation (stagerun --eval-data,
  /// --eval-tokens): each device runs just the RECV_ACT, FWD and SEND_ACT instructions of its
  /// list, in their order, with every Dropout the identity (TrainingRun::eval_mode); nothing is
  /// kept for a backward, no gradient, all-reduce, optimizer step, state update or checkpoint
  /// happens, and the steps done, the loss scale and the training's random keys do not move.
  /// `RunReport::losses` has each step's loss (the mean over the microbatches, as training's).
  /// Data-parallel replicas normalise with their own running statistics unless
  /// Pipeline::share_running_statistics gave them the first replica's (stagerun's evaluation
  /// does, as DDP's broadcast_buffers).
  bool forward_only = false;
  /// A pipeline loaded for some of the plan's devices (a rank of mpirun, runtime/mpi): the
  /// transport joining replica `replica`'s devices here to the others', made for every run
  /// from the plan's links, a link's capacity and the callback for a message's arrival (the
  /// receiver's memory meter). Unset: the in-process transports (need every device here).
  std::function<std::unique_ptr<Transport>(int replica, const std::vector<Link>&, int,
                                           InProcessTransport::OnDelivered)>
      make_transport;
  /// Called once this process's devices reach a step's start or end: waits for the other
  /// processes' (their steps start and end together, so step times mean the same on each).
  /// Takes this process's flags (whether one of its devices found an inf or NaN gradient in
  /// the step, for dynamic loss scaling; whether a stop was asked for here) and returns every
  /// process's combined: every rank then skips the same steps and stops after the same step.
  /// `squares` (gradient clipping; empty otherwise) has one entry per device of every process
  /// (R x P): this process's devices' sums of squared gradients for the step are filled in,
  /// and the barrier fills in the other processes' (runtime/mpi).
  std::function<StepFlags(StepFlags, std::vector<double>& squares)> step_barrier;
  /// Polled (by the last device of this process to reach each step barrier): the number of the
  /// signal that asked the run to stop (stagerun's SIGTERM, SIGINT or SIGUSR1), 0 for none. Once
  /// any process's answer is not 0 at a barrier of a step, every device finishes that step (or,
  /// between steps, the next), a checkpoint is saved (`checkpoint`) and the run returns early,
  /// `RunReport::stop_signal` saying why. Unset: never. Must be cheap (an atomic's load).
  std::function<int()> stop_requested;
  /// Steps whose timeline events and memory samples the report keeps (`RunReport::events`,
  /// `memory`), the run's first ones: all unless told (stagerun keeps none without --trace and
  /// --trace-steps with it), so that a long run's memory stays flat.
  int64_t trace_steps = std::numeric_limits<int64_t>::max();
  /// Seconds a device waits for another (a message, a shared sum, another rank at a step's
  /// start or end) before the run stops with `Error(kTimeout)` naming the instruction and the
  /// peer; 0: no limit. Compute is not limited: a peer computing longer than this between two
  /// of its sends also ends the run (stagerun --timeout).
  double timeout_s = 60;
  /// Called by a device's worker before each instruction of its list (`index` in it) in step
  /// `step` (counted from 1 over every run of the pipeline): what the rank is doing, for a line
  /// when it is stopped (runtime/mpi/world.h), and a test's hook. Runs on the worker's thread.
  std::function<void(int device, int64_t step, size_t index)> before_instruction;
  /// The step of this run (from 1) whose nodes are timed one by one (stagerun --profile-nodes:
  /// NodeHook::timed; on CUDA each node waits for its kernels, so the step is slower than the
  /// others and is left out of the median, `RunReport::profiled_step`); 0: none.
  int profile_step = 0;
  /// Kernels that give the same bytes run after run (DeviceContext::deterministic; stagerun
  /// --deterministic).
  bool deterministic = false;
  /// Microseconds a device's worker waiting for a message, a sum or the step barrier of this
  /// process watches for it before it sleeps (SpinCondition: a sleeping thread takes 50-200 us
  /// to wake on an idle core, paid on every hand-off); 0: it sleeps at once (stagerun
  /// --spin-us). Worth it only when every worker thread has a core of its own; measured on a
  /// 2-core virtual machine it helped some plans and not others (bench/RESULTS.md), so it is off
  /// unless asked for.
  int spin_us = 0;
};

/// One node's kernels in the profiled step (RunOptions::profile_step), summed over its runs in
/// that step (one per microbatch, a recomputation's too) within one kind of instruction.
struct NodeProfile {
  int device = 0;           ///< Of every replica's devices (R x P).
  int stage = 0;
  std::string instruction;  ///< The instruction kind it ran in: "FWD", "BWD", "BWD_INPUT", ...
  std::string node;
  std::string op_type;
  int64_t calls = 0;
  double ms = 0;            ///< Its kernels' time (CUDA: between events; CPU: wall time).
  int64_t bytes = 0;        ///< Read and written (node_work.h), over the calls.
  double flops = 0;         ///< Over the calls; 0 where not counted (node_work.h).
  /// What its kernels chose where they choose (CUDA: cuDNN's algorithm per pass and its
  /// workspace), from its first call; "" elsewhere (DeviceContext::notes).
  std::string note;
};

struct DeviceReport {
  double busy_s = 0;       ///< Compute time in the reported step.
  /// Time in sends (SEND_ACT, SEND_GRAD: handing the tensors to the transport, waiting while
  /// the link is full) in the reported step; not compute, not in `busy_s`.
  double send_s = 0;
  int64_t peak_bytes = 0;  ///< Weights + arena + tensors held, at the highest.
  int64_t weight_bytes = 0;
  int64_t arena_bytes = 0;
  int64_t predicted_peak_bytes = 0;  ///< plan.json's prediction for the device.
  /// The device's own count where it keeps one (CUDA, for the whole GPU the device is on: its
  /// pool's high-water mark with the arena, and the driver's bytes in use at the end); -1 else.
  int64_t device_peak_bytes = -1;
  int64_t device_used_bytes = -1;
  /// The host's waits for the device in the reported step, from the step's start to the end of
  /// its updates (DeviceContext::host_waits: CUDA's stream synchronisations), and the seconds
  /// blocked in them; -1 where the device keeps no count (the CPU backend).
  int64_t host_waits = -1;
  double host_wait_s = 0;
};

/// A device's metered bytes (`DeviceReport::peak_bytes`' count: weights, arena, tensors held)
/// at one instant, seconds from the run's start.
struct MemorySample {
  int device;
  double time_s;
  int64_t bytes;
};

struct RunReport {
  /// Wall time of every step run (fewer than RunOptions::steps after a stop: `stop_signal`).
  std::vector<double> step_s;
  int reported_step = 0;       ///< The step the figures below describe (`median_step`).
  double bubble_fraction = 0;  ///< 1 - busy / (devices x step), of the reported step.
  std::vector<DeviceReport> devices;  ///< Every device of every replica (R x P).
  /// Compute of every step (of the first RunOptions::trace_steps), the all-reduces, the
  /// receives' waits and the sends, seconds from the start.
  std::vector<schedule::TimelineEvent> events;
  /// Every device's metered bytes at each step's start and after each of its instructions,
  /// in time order per device (the first RunOptions::trace_steps steps).
  std::vector<MemorySample> memory;
  /// When each step started, seconds from the start (the clock of `events`).
  std::vector<double> step_start_s;
  std::map<std::string, Tensor> outputs;  ///< The last step's graph outputs, whole batch.
  /// Training: each step's loss: per replica the mean over its microbatches, then the mean
  /// over the replicas (those whose loss stage runs here).
  std::vector<double> losses;
  /// Seconds each device spent in ALLREDUCE in the reported step (the replicas' sum).
  std::vector<double> allreduce_s;
  /// Dynamic loss scaling (Pipeline::scales_loss), per step: the scale its loss gradients were
  /// seeded with, and whether its update was skipped (a gradient was inf or NaN). Empty else.
  std::vector<double> loss_scale;
  std::vector<bool> skipped;
  /// The signal whose stop request ended the run early (RunOptions::stop_requested), after
  /// `step_s.size()` steps; 0: the run did all its steps.
  int stop_signal = 0;
  /// Gradient clipping (plan.json training_config.clip_grad_norm), per step: the global L2
  /// norm of the gradients before clipping (what clip_grad_norm_ returns). Empty else.
  std::vector<double> grad_norm;
  /// RunOptions::profile_step's nodes, by device (in device order, each in the order first run).
  std::vector<NodeProfile> node_profile;
  int profiled_step = -1;  ///< Its index in `step_s`; -1 when no step was profiled.
  int spin_us = 0;         ///< RunOptions::spin_us as the run resolved it.
};

/// The step whose time is the median of `step_s` without the first step, the warm-up (it pays
/// for first-touch allocations, oneDNN's primitive creation and cold caches: several times a
/// steady step); the lower of the two middle steps for an even count. With one step, that step.
/// Step `skip` (a profiled step, RunReport::profiled_step) is left out too while another remains.
int median_step(const std::vector<double>& step_s, int skip = -1);

}  // namespace stagecraft::rt
