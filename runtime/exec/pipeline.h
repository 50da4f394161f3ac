#pragma once
/// \file
/// Executes a plan: one worker thread per device runs that device's instruction stream from
/// schedule.json; stage programs exchange tensors through a `Transport`. Everything is loaded
/// and checked before anything runs, so a plan the runtime cannot trust is refused up front.
///
/// Devices: a plan of R data-parallel replicas (plan.json `data_parallel`) of a P-device
/// pipeline runs R x P devices; device g is pipeline device g % P of replica g / P, runs the
/// instruction list of pipeline device g % P on replica g / P's copy of its stages, and takes
/// replica g / P's rows of every batch. With R = 1 devices are the plan's devices.
///
/// What a run is given and gives back (RunOptions, RunReport) is in run_types.h; the run's
/// internals (stage_runtime.h, run_state.h, device_worker.h) are runtime/exec's own.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/core/tensor.h"
#include "runtime/exec/run_types.h"
#include "runtime/exec/transport.h"
#include "runtime/format/plan.h"
#include "runtime/format/schedule.h"
#include "runtime/optim/optimizer.h"

namespace stagecraft::rt {

struct StageRuntime;    // runtime/exec/stage_runtime.h
struct ResidentDevice;  // runtime/exec/stage_runtime.h

class Pipeline {
 public:
  /// Loads PLAN_DIR: plan.json (validated, stage hashes checked), schedule.json (validated
  /// against the plan's shape) and every stage file, bound to `backend`, checked against
  /// plan.json (names, dtypes, shapes of every stage input and output).
  /// `local_devices` (ascending; empty: all): the devices this process runs, the others' being
  /// elsewhere (ranks of mpirun); only their stage files are loaded.
  static std::unique_ptr<Pipeline> load(const std::string& plan_dir, const Backend& backend,
                                        int threads_per_device,
                                        std::vector<int> local_devices = {});
  /// The same with PLAN_DIR's plan.json already read (plan::load_plan: validated, its hash
  /// checked), so a process reads it once.
  static std::unique_ptr<Pipeline> load(plan::Plan plan, const std::string& plan_dir,
                                        const Backend& backend, int threads_per_device,
                                        std::vector<int> local_devices = {});

  const plan::Plan& plan() const { return plan_; }
  const schedule::Schedule& schedule() const { return schedule_; }
  const std::vector<ModelTensor>& inputs() const { return inputs_; }
  const std::vector<ModelTensor>& outputs() const { return outputs_; }
  /// The devices this process runs (all R x P, unless loaded for some).
  const std::vector<int>& local_devices() const { return local_devices_; }
  /// The backend the pipeline was loaded for.
  const Backend& backend() const { return *backend_; }
  bool runs_device(int device) const;
  /// Whether the first replica this process runs holds stage `stage` here (its device is one
  /// of this process's).
  bool holds_stage(int stage) const;
  /// R, the data-parallel replicas; R x P devices in all.
  int replicas() const { return replicas_; }
  int devices() const { return plan_.devices * replicas_; }
  /// Microbatches of one step over every replica: R x M.
  int step_microbatches() const { return plan_.microbatches * replicas_; }

  /// Checks whole-batch inputs (by name) against the plan: each is the batch ([R x M x b, ...]
  /// for a per-microbatch [b, ...]) or one microbatch's shape, given to every microbatch. Throws
  /// `Error(kShape)` naming the input, the dtypes and shapes.
  void check_inputs(const std::map<std::string, Tensor>& inputs) const;

  /// Deterministic inputs: floats uniform in [-1, 1), integers 0 or 1, bools alternating.
  std::map<std::string, Tensor> synthetic_inputs() const;

  /// Runs `options.steps` steps on the same inputs. The first worker error stops every worker
  /// and is rethrown (never a hang).
  ///
  /// Each device's context (streams, library handles, caches, buffer pool) and arena outlive
  /// the run for the next, and on a device whose memory is not the host's (CUDA) so do the
  /// weights and optimizer state copied to it: a training loop of one run per step (stagerun
  /// --data, --tokens) moves no weights between host and device. The host's copies are made
  /// current before every checkpoint and whenever an accessor below asks for them between
  /// runs (`sync_host`). A failed run drops its devices' contexts and gives the host the
  /// weights as the failure left them (as on the CPU, whose memory is the host's).
  RunReport run(const std::map<std::string, Tensor>& inputs, const RunOptions& options);

  /// Between runs: the host's copies of every stage's weights and optimizer state made current
  /// (a device of its own memory gives back what training changed) and the devices' copies let
  /// go, so the host's may be read and written; the next run uploads them again. Every accessor
  /// of the training state below calls it. Nothing to do on the CPU, nor during a run (from
  /// `RunOptions::checkpoint`, the workers have just made the host's current).
  void sync_host() const;

  // Training state (checkpoints, export: runtime/exec/checkpoint.h): the first replica's
  // stages (every replica holds the same). Not to be used while run() is running (except from
  // `RunOptions::checkpoint`, when the workers wait).

  /// Optimizer steps taken so far (the lr schedule's position).
  int64_t steps_done() const { return steps_done_; }
  void set_steps_done(int64_t steps) { steps_done_ = steps; }
  /// Whether training scales the loss dynamically (plan precision fp16: `LossScale`).
  bool scales_loss() const { return plan_.training && plan_.precision == Precision::kFp16; }
  /// The loss scale's state: set it before a run (stagerun --loss-scale), read it after; runs
  /// carry it on, checkpoints save and restore it.
  LossScale& loss_scale() { return loss_scale_; }
  const LossScale& loss_scale() const { return loss_scale_; }
  /// stagerun --loss-scale and --loss-scale-window (each checked; unset: left as it is);
  /// `Error(kUsage)` naming the flag when the plan does not scale its loss (it would be
  /// ignored).
  void set_loss_scale(std::optional<double> scale, std::optional<int64_t> window);
  /// What loading one stage's program here read from weight files (plan/stage_weights.h) and
  /// how long it took, per stage this process runs, in load order.
  struct StageLoad {
    int stage = 0, replica = 0, device = 0;  ///< `device`: of R x P.
    int64_t bytes = 0;                       ///< Read from external weight files.
    int64_t weight_bytes = 0;                ///< All its weights and constants.
    double seconds = 0;
  };
  std::vector<StageLoad> loads() const;
  /// Stage `stage`'s weights by name: tensors sharing bytes with its forward program (write
  /// into them to change the weights; never replace them).
  const std::map<std::string, Tensor>& stage_weights(int stage) const;
  /// Whether stage `stage`'s backward yields a gradient of `weight`, i.e. the optimizer
  /// updates it and keeps state for it (a float constant is in `stage_weights` but is not).
  bool trains(int stage, const std::string& weight) const;
  /// Stage `stage`'s optimizer state per weight (empty before its first step). Owned by the
  /// pipeline, so it persists across run() calls; only the stage's device worker touches it.
  std::map<std::string, optim::OptimizerState>& optimizer_state(int stage);
  const std::map<std::string, optim::OptimizerState>& optimizer_state(int stage) const;
  /// Gives every other replica here the first replica's weights and optimizer state (after
  /// they were restored into it: load_checkpoint).
  /// With ZeRO-1 (plan.json `shard_optimizer`) the first replica's state is taken as the whole
  /// state, and every replica (the first too) keeps its shard of it.
  void copy_first_replica();
  /// Stage `stage`'s running statistics (held here): the weights its forward's state updates
  /// write (Program::state_updates: BatchNormalization's running mean and variance in training
  /// mode), in name order; empty for most stages.
  std::vector<std::string> running_statistics(int stage) const;
  /// Each stage held here that has running statistics, with their names (running_statistics),
  /// in stage order: what share_running_statistics and mpi::World's share.
  std::vector<std::pair<int, std::vector<std::string>>> held_running_statistics() const;
  /// Gives every other replica here the first replica's running statistics, as DDP's
  /// broadcast_buffers gives every rank rank 0's before a forward. In training mode the
  /// statistics are only written (each replica from its own microbatches), and the first
  /// replica's are the ones checkpoints and exports keep; an evaluation (RunOptions::forward_only)
  /// normalises with them, so stagerun's evaluation calls this first (under mpirun
  /// mpi::World::share_running_statistics, whose replicas are other processes). Nothing to do
  /// without data-parallel replicas or running statistics. Between runs.
  void share_running_statistics();
  /// Stage `stage`'s optimizer state whole, as a checkpoint holds it: the first replica's, or
  /// with ZeRO-1 every replica's shard put together (each weight's state tensors of its shape).
  /// `Error(kUnsupported)` with ZeRO-1 when a replica runs in another process.
  std::map<std::string, optim::OptimizerState> whole_optimizer_state(int stage) const;
  /// ZeRO-1's layout of stage `stage` (held here): its sharded weights (name, offset in the
  /// flattened parameters, elements) and the replicas' boundaries; no bounds when unsharded.
  struct ShardLayout {
    struct Part {
      std::string weight;
      int64_t offset = 0, elements = 0;
    };
    std::vector<Part> parts;
    std::vector<int64_t> bounds;
  };
  ShardLayout shard_layout(int stage) const;
  /// Replica `replica`'s weights of stage `stage` (every replica's should stay the same bytes;
  /// for checks). `Error(kInternal)` for a replica or stage out of range or not run here.
  const std::map<std::string, Tensor>& replica_weights(int replica, int stage) const;

 private:
  Pipeline() = default;

  /// Refuses (Error kPlan, naming plan.json's field) a shared weight missing from a holder's
  /// stage file or held there with another dtype or shape, and, in training, a weight that two
  /// stages train but plan.json does not list as shared.
  static void check_shared_weights(const Pipeline& p, const std::string& plan_json);
  /// Loads a stage's forward (and, training, backward) program, checked against plan.json.
  static void load_programs(const Pipeline& p, StageRuntime& rt);
  /// Training: where each trained weight of the stage goes in its gradient bucket, and with
  /// ZeRO-1 this replica's shard (checked against plan.json's `optimizer_shards`).
  static void lay_out_gradients(const Pipeline& p, StageRuntime& rt);
  /// Stage `stage` of the first replica this process runs.
  StageRuntime& first_replica_stage(int stage) const;

  // run() hands its device workers what they read and write of these as a `PipelineParts`
  // (runtime/exec/run_state.h).
  std::string plan_dir_;
  plan::Plan plan_;
  schedule::Schedule schedule_;
  schedule::PipelineShape shape_;
  const Backend* backend_ = nullptr;
  int threads_per_device_ = 1;
  int replicas_ = 1;
  /// Every replica's stages, replica-major: stage s of replica r at r x S + s (those of the
  /// devices this process does not run hold only what plan.json says of them).
  std::vector<std::shared_ptr<StageRuntime>> stages_;
  std::vector<ModelTensor> inputs_, outputs_;
  std::vector<Link> links_;
  std::vector<int> local_devices_;
  int64_t steps_done_ = 0;  ///< Optimizer steps taken by earlier runs (the lr schedule goes on).
  LossScale loss_scale_;
  /// Per device (R x P), what it keeps between runs (run()); made for this process's devices
  /// at their first run. `sync_host` (const: the host's view made current) lets go of stages.
  std::vector<std::shared_ptr<ResidentDevice>> resident_;
  /// Whether run() is running (its workers own the devices; `sync_host` leaves them be).
  bool running_ = false;
};

}  // namespace stagecraft::rt
