#pragma once
/// \file
/// `RunState`: what the device workers of one run share (the transports, the step barrier, the
/// memory meters, the timings, the first error), and `PipelineParts`: what a run reads and
/// writes of the pipeline that starts it (its plan, schedule and stages, the steps done, the
/// loss scale), handed over by `Pipeline::run`. Internal to runtime/exec (pipeline_run.cpp
/// builds it, device_worker.cpp and optimizer_step.cpp are the workers that share it).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/exec/run_types.h"
#include "runtime/exec/stage_runtime.h"
#include "runtime/exec/transport.h"
#include "runtime/format/error.h"
#include "runtime/format/plan.h"
#include "runtime/format/schedule.h"
#include "runtime/optim/lr_schedule.h"
#include "runtime/optim/optimizer.h"

namespace stagecraft::rt {

/// What a run reads and writes of the pipeline that starts it (runtime/exec/pipeline.h): views
/// of the pipeline's members, which outlive the run. Only the stages' contents (weights,
/// optimizer state), the steps done and the loss scale are written, each as documented below.
struct PipelineParts {
  const plan::Plan& plan;
  const schedule::Schedule& schedule;  ///< Per pipeline device (P), its instruction list.
  const schedule::PipelineShape& shape;
  const Backend& backend;
  int threads_per_device = 1;
  int replicas = 1;  ///< R: the pipeline runs R x P devices.
  /// Every replica's stages, replica-major (stage s of replica r at r x S + s); a stage is
  /// changed only by its device's worker.
  const std::vector<std::shared_ptr<StageRuntime>>& stages;
  const std::vector<ModelTensor>& inputs;
  const std::vector<Link>& links;
  const std::vector<int>& local_devices;  ///< The devices this process runs, ascending.
  bool scales_loss = false;               ///< Pipeline::scales_loss.
  /// Per device (R x P), what it keeps between runs: those of this process's devices are made
  /// before the run, and each is used only by its device's worker.
  const std::vector<std::shared_ptr<ResidentDevice>>& resident;
  /// Optimizer steps done: the first device's worker sets it before a checkpoint is saved.
  int64_t& steps_done;
  /// Dynamic loss scaling's state: read by every worker, moved on by the first device's between
  /// the barriers of a step's end.
  LossScale& loss_scale;
};

/// Bytes held by one device, at the highest.
struct MemoryMeter {
  std::atomic<int64_t> current{0}, peak{0};
  void add(int64_t bytes);
  void sub(int64_t bytes) { current.fetch_sub(bytes); }
};

/// Bytes of the tensors of a message.
int64_t bytes_of(const std::vector<NamedTensor>& tensors);

/// What the device workers of one run share. Per-device vectors are indexed by device and
/// written only by that device's worker.
struct RunState {
  /// The state of a run of `pipeline` (inputs checked) before any worker starts.
  RunState(const PipelineParts& pipeline, const std::map<std::string, Tensor>& inputs,
           const RunOptions& options);

  PipelineParts pipeline;  ///< The loaded plan, schedule and stages.
  const RunOptions& options;
  /// Every replica's devices (R x P), the pipeline's (P), its replicas (R), microbatches per
  /// replica (M), steps.
  const int devices, pipeline_devices, replicas, microbatches, steps;
  /// The first of the devices this process runs (it keeps the step times), all unless the
  /// pipeline was loaded for some (a rank of mpirun).
  const int first_device;
  const bool training;
  /// Dynamic loss scaling (Pipeline::scales_loss): per step, whether some stage of some
  /// replica found a gradient inf or NaN at its OPT_STEP (set by any worker, read by all after
  /// the step's end barrier), and the scale the step was seeded with and whether it was
  /// skipped (written by the first device's worker).
  const bool scales_loss;
  std::unique_ptr<std::atomic<bool>[]> overflow;
  /// The step the devices of this process wait at the barrier for (every worker stores it
  /// before it arrives): the step whose overflow flag the barrier's exchange with the other
  /// processes (RunOptions::step_barrier) carries.
  std::atomic<int> barrier_step{0};
  /// The signal of a stop every process agreed on (RunOptions::stop_requested), 0 for none:
  /// set only by a step barrier's exchange (`exchange_flags`), so every device of every
  /// process reads the same value after the same barrier.
  std::atomic<int> stop_signal{0};
  std::vector<double> step_scale;
  std::vector<bool> step_skipped;
  /// Gradient clipping: C (plan.json training_config.clip_grad_norm; 0: none), and per step,
  /// per device (R x P), the sum of the squares of the gradients the device counts for the
  /// global norm (each weight once: runtime/exec/grad_clip.cpp), written by that device's
  /// worker at its OPT_STEPs (another process's by the step barrier's exchange), read by
  /// every worker after the step's end barrier; and per step the norm (the first device's).
  const double clip_grad_norm;
  std::vector<std::vector<double>> grad_squares;
  std::vector<double> step_grad_norm;
  /// Whether the optimizer updates wait for the step's end (`finish_deferred_step`): dynamic
  /// loss scaling or gradient clipping, which need every device's gradients checked or counted.
  bool defers_update() const { return scales_loss || clip_grad_norm > 0; }
  const int64_t global_step;  ///< Optimizer steps taken by earlier runs.
  /// Per graph input: the microbatch views of the run's inputs (no copies), replica r's
  /// microbatch m at r x M + m.
  std::map<std::string, std::vector<Tensor>> feeds;
  /// Per graph output: each microbatch's value (last step), indexed as `feeds`.
  std::map<std::string, std::vector<Tensor>> results;
  std::unique_ptr<optim::Optimizer> optimizer;  ///< Training.
  optim::LrSchedule lr_schedule;                ///< Training.
  /// Per step, per microbatch: step s's microbatch k (indexed as `feeds`) at s x R x M + k; NaN
  /// until known. One array: no allocation per step.
  std::vector<double> step_loss;
  /// Step `step`'s loss of microbatch `index` (indexed as `feeds`).
  double& loss_of(int step, size_t index) {
    return step_loss[static_cast<size_t>(step) * static_cast<size_t>(replicas * microbatches) +
                     index];
  }
  /// Per replica: whether its loss stage runs in this process.
  std::vector<bool> replica_has_loss;
  std::vector<MemoryMeter> meters;
  /// Per replica: its transport (null for a replica this process does not run).
  std::vector<std::unique_ptr<Transport>> transports;
  StepBarrier barrier;
  int spin_us = 0;  ///< RunOptions::spin_us resolved (also the transports' and the barrier's).
  std::vector<DeviceReport> reports;
  std::vector<std::vector<double>> busy;       ///< Per device, per step: compute seconds.
  std::vector<std::vector<double>> allreduce;  ///< Per device, per step: ALLREDUCE seconds.
  std::vector<std::vector<double>> sends;      ///< Per device, per step: SEND_* seconds.
  /// Per device, per step: its device's host waits (DeviceContext::host_waits) in the step.
  std::vector<std::vector<DeviceContext::HostWaits>> host_waits;
  std::vector<std::vector<schedule::TimelineEvent>> events;
  std::vector<std::vector<MemorySample>> memory;  ///< Per device: its meter over the run.
  std::vector<std::vector<NodeProfile>> node_profile;  ///< Per device: RunOptions::profile_step's.
  /// step_end: by the first device after the end barrier; step_start: the earliest of
  /// device_step_start, taken when the run's report is made.
  std::vector<double> step_start, step_end;
  /// Per device, per step: when it left the step's start barrier (the step starts at the
  /// earliest of them: a device may start its first instruction before the first device reads
  /// the clock, and a step that starts later than its instructions measures less than them).
  std::vector<std::vector<double>> device_step_start;
  NodeHook hook;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  std::mutex error_mutex;
  std::optional<Error> first_error;

  /// Seconds since the run started.
  double seconds() const;
  /// Keeps the first error and stops every worker (transport and barrier throw `Aborted`).
  void stop_all(Error error);
  /// Whether some worker has failed (`stop_all` was called).
  bool failed();
  /// Adds `note` (a consequence of the failure) to the end of the first error's message.
  void note_failure(const std::string& note);
  /// Run by the last of this process's devices to arrive at the step barrier: this process's
  /// stop request (RunOptions::stop_requested) and overflow flag of `barrier_step` go out to the
  /// other processes (RunOptions::step_barrier), and each is set here where any process's is;
  /// with gradient clipping so do its devices' squares, and the other processes' come back.
  void exchange_flags();
  /// Steps every device finished (all of them unless a stop ended the run early).
  int steps_finished() const;
  /// The global L2 norm of step `step`'s gradients (every device's squares summed in device
  /// order, so every process and thread gets the same bits).
  double grad_norm(int step) const;
};

}  // namespace stagecraft::rt
