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

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/core/tensor.h"
#include "runtime/exec/transport.h"
#include "runtime/format/plan.h"
#include "runtime/format/schedule.h"
#include "runtime/optim/optimizer.h"

namespace stagecraft::rt {

struct StageRuntime;
struct RunState;
class DeviceWorker;

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
  /// A pipeline loaded for some of the plan's devices (a rank of mpirun, runtime/mpi): the
  /// transport joining replica `replica`'s devices here to the others', made for every run
  /// from the plan's links, a link's capacity and the callback for a message's arrival (the
  /// receiver's memory meter). Unset: the in-process transports (need every device here).
  std::function<std::unique_ptr<Transport>(int replica, const std::vector<Link>&, int,
                                           InProcessTransport::OnDelivered)>
      make_transport;
  /// Called once this process's devices reach a step's start or end: waits for the other
  /// processes' (their steps start and end together, so step times mean the same on each).
  /// Takes this process's flag, whether one of its devices found an inf or NaN gradient in the
  /// step (dynamic loss scaling), and returns whether any process's flag is set: every rank
  /// then skips the same steps.
  std::function<bool(bool overflow)> step_barrier;
  /// Seconds a device waits for another (a message, a shared sum, another rank at a step's
  /// start or end) before the run stops with `Error(kTimeout)` naming the instruction and the
  /// peer; 0: no limit. Compute is not limited: a peer computing longer than this between two
  /// of its sends also ends the run (stagerun --timeout).
  double timeout_s = 60;
  /// Called by a device's worker before each instruction of its list (`index` in it) in step
  /// `step` (counted from 1 over every run of the pipeline): what the rank is doing, for a line
  /// when it is stopped (runtime/mpi/world.h), and a test's hook. Runs on the worker's thread.
  std::function<void(int device, int64_t step, size_t index)> before_instruction;
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
};

/// A device's metered bytes (`DeviceReport::peak_bytes`' count: weights, arena, tensors held)
/// at one instant, seconds from the run's start.
struct MemorySample {
  int device;
  double time_s;
  int64_t bytes;
};

struct RunReport {
  std::vector<double> step_s;  ///< Wall time of every step.
  int reported_step = 0;       ///< The step the figures below describe (`median_step`).
  double bubble_fraction = 0;  ///< 1 - busy / (devices x step), of the reported step.
  std::vector<DeviceReport> devices;  ///< Every device of every replica (R x P).
  /// Compute of every step, the all-reduces, the receives' waits and the sends, seconds from
  /// the start.
  std::vector<schedule::TimelineEvent> events;
  /// Every device's metered bytes at each step's start and after each of its instructions,
  /// in time order per device.
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
};

/// The step whose time is the median of `step_s` without the first step, the warm-up (it pays
/// for first-touch allocations, oneDNN's primitive creation and cold caches: several times a
/// steady step); the lower of the two middle steps for an even count. With one step, that step.
int median_step(const std::vector<double>& step_s);

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
  RunReport run(const std::map<std::string, Tensor>& inputs, const RunOptions& options);

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
  friend struct RunState;
  friend class DeviceWorker;
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
};

}  // namespace stagecraft::rt
