#pragma once
/// \file
/// The plan format: what `stagec` writes into a plan directory and what `stagedump` and
/// `stagerun` read. The runtime's only input; versioned, and validated before use.
///
///   PLAN_DIR/plan.json      this structure (to_json / plan_from_json)
///   PLAN_DIR/schedule.json  per-device instruction streams (compiler/schedule to_json)
///   PLAN_DIR/stage_K.onnx   stage K's forward graph with its weights (a valid ONNX model)

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/format/auto_search.h"
#include "runtime/format/schedule.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::plan {

/// Bumped whenever a reader of an older plan would misread a newer one. Version 3: every stage
/// lists its shared weights (`shared_weights`, `shared_exchange_ms`). Version 4: a typed
/// `device` (name, kind, capacity) instead of the cost model's free-form spec; per stage the
/// backward's B and W parts and the optimizer step (`backward_input_ms`, `backward_weight_ms`,
/// `optimizer_ms`); the planner's predicted `timeline`. Version 5: plan.json holds its own hash
/// (`plan_hash`) and schedule.json's (`schedule_hash`). Version 6: `device_memory`, the one
/// predicted peak per device with its parts and its memory over the step; a stage's `memory`
/// lists its anatomy without a `total` (only a device has a peak). Version 7: data parallelism
/// (`data_parallel` replicas of the pipeline, `batch` the global batch over all of them, per
/// stage `allreduce_ms`, `training_config.lr_scaling` and `base_lr`). Version 8: optimizer-state
/// sharding across the replicas (ZeRO-1): `shard_optimizer`, per stage `optimizer_shards` (the
/// shards' boundaries in its flattened parameters) and `allgather_ms`. Version 9: `placement`,
/// the rank (cluster slot) of every device of every replica. Version 11: devices that share a
/// processor (`cluster.devices_per_processor`, `processors`). Older plans are refused ("re-run
/// stagec").
inline constexpr int kPlanFormatVersion = 11;

/// What a recorded file hash starts with: "fnv1a64:<16 hex digits>".
inline constexpr std::string_view kHashPrefix = "fnv1a64:";

/// A tensor at a stage boundary. For a stage input, `peer_stage` is the stage that produces it
/// (-1: a graph input, fed by the user); for an output, `peer_stages` are the stages that read
/// it (empty when it is only a graph output).
struct StageTensor {
  std::string name;
  std::string dtype;             ///< "float32", "int64", ... (runtime/format/dtype.h names).
  std::vector<int64_t> shape;    ///< Per microbatch.
  int peer_stage = -1;           ///< Inputs only.
  std::vector<int> peer_stages;  ///< Outputs only.
  bool graph_output = false;     ///< Outputs only.
  int64_t bytes = 0;
};

/// One intermediate tensor of a stage's forward program in the stage's arena (the static
/// memory plan of runtime/format/memory_plan.h).
struct ArenaTensor {
  std::string name;
  int64_t offset = 0;
  int64_t bytes = 0;
};

/// A weight that several stages read (a GPT's tied input embedding and output head, layers an
/// exporter deduplicated). Every stage that reads it holds a copy in its stage file; training
/// sums the copies' gradients across those stages before any optimizer step (the schedule's
/// ALLREDUCE_SHARED), so every copy takes the same update and stays bit-identical. A checkpoint
/// and an export hold it once, from the lowest holder. Each holder lists it alike.
struct SharedWeight {
  std::string name;
  std::string dtype;  ///< runtime/format/dtype.h names.
  std::vector<int64_t> shape;
  std::vector<int> stages;  ///< Every holder, ascending, at least two; this stage among them.
};

/// Bytes one stage holds at its peak, by what holds them: the cost model's memory anatomy
/// (cost_models/memory.h computes it) and plan.json's `memory`.
struct MemoryBytes {
  int64_t weights = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;
  int64_t activations = 0;    ///< Kept for backward across the microbatches in flight.
  int64_t temporary = 0;      ///< Peak of short-lived buffers and workspace.
  int64_t communication = 0;  ///< Send and receive buffers.

  /// The sum; throws `Error(kPlan)` when it does not fit in int64.
  int64_t total() const;
};

/// What a device holds at the instant of its predicted peak, by what holds it. The parts add up
/// to the peak exactly (`total`).
struct PeakParts {
  int64_t weights = 0;    ///< Its stages' weights (each stage holds its own copy).
  int64_t gradients = 0;  ///< Their gradients (training).
  int64_t optimizer = 0;  ///< Their optimizer state (training).
  /// Kept for backward at that instant: the forward values of every (stage, microbatch) in
  /// flight (a recomputing stage keeps only its inputs).
  int64_t activations = 0;
  int64_t recomputed = 0;     ///< Rebuilt by recomputation for the backward running then.
  int64_t deferred = 0;       ///< Held by split backwards (zb-h1) from their B to their W.
  int64_t arena = 0;          ///< The working arena: the largest of its stages' (they take turns).
  int64_t communication = 0;  ///< Send and receive buffers of its stages.

  /// The sum; throws `Error(kPlan)` when it does not fit in int64.
  int64_t total() const;
};

/// The one memory figure of a device: the peak of the planner's simulation of the step, with
/// the working arena and the communication buffers of its stages (plan.json `device_memory`).
/// It is `Prediction::device_peak_bytes`, what the planner checks against the device's
/// capacity, what stagedump draws and what stagerun compares its measurement with.
struct DevicePeak {
  int device = 0;
  int64_t peak_bytes = 0;  ///< `parts.total()`.
  double peak_ms = 0;      ///< When the step first reaches it.
  int64_t in_flight = 0;   ///< (stage, microbatch) pairs whose activations are held then.
  PeakParts parts;
  /// The device's memory over the step: at time_ms[i] (from 0, non-decreasing) it holds
  /// bytes[i] until the next entry; the largest entry is `peak_bytes`.
  std::vector<double> time_ms;
  std::vector<int64_t> bytes;
};

/// The parts of `peak` that are not zero, for people, in the order of `PeakParts`: "weights
/// 1.00 MiB, gradients 1.00 MiB, optimizer 2.00 MiB, activations 1.50 MiB for 6 in flight, arena
/// 64.0 KiB, communication 8.00 KiB" (in flight: the (stage, microbatch) pairs held).
std::string describe_parts(const DevicePeak& peak);

/// The device a plan was made for: what the runtime checks the machine that runs it against.
struct DeviceSpec {
  std::string name;          ///< The cost model's device: "h100", "cpu", a device file's name.
  DeviceKind kind = DeviceKind::kGpu;  ///< The backend kind that runs it ("cpu", "gpu").
  int64_t memory_bytes = 0;  ///< One device's memory capacity.
  /// The cost model's rates for the device (cost_models/device_spec.h): dense fp32 and 16-bit
  /// tensor FLOP/s and memory bytes/s, what stagerun --profile-nodes sets achieved rates
  /// against. Optional in plan.json (plans written before them read as 0: not known).
  double peak_flops_fp32 = 0;
  double peak_flops_fp16 = 0;
  double memory_bandwidth = 0;
};

/// One point-to-point link in one direction.
struct LinkSpec {
  double bandwidth = 0;  ///< Bytes/s in one direction, as one transfer sees it.
  double latency_s = 0;  ///< Fixed cost of one message, seconds.
};

/// How the devices are connected: nodes of `devices_per_node` devices joined by a fast link,
/// nodes joined by a network (cost_models/cluster.h has the presets and reads cluster files).
struct ClusterSpec {
  int devices_per_node = 1;
  LinkSpec intra_node;  ///< Between two devices of one node.
  LinkSpec inter_node;  ///< Between devices of different nodes (one NIC per device).
  /// K: how many pipeline devices share one processor (several devices on one GPU, CPU devices
  /// whose threads outnumber the cores). Device d runs on processor d mod ceil(P / K), as the
  /// runtime places devices on GPUs (`processor_of_devices`). 1: each device has its own.
  int devices_per_processor = 1;
};

/// Which processor each pipeline device runs on, and what sharing them costs (plan.json
/// `processors`). Devices on one processor take turns computing: the planner's simulation runs
/// one compute instruction of theirs at a time (compiler/schedule/simulator.h), and their
/// transfers are local copies.
struct ProcessorSharing {
  /// Per pipeline device, its processor: `processor_of_devices(devices,
  /// cluster.devices_per_processor)`.
  std::vector<int> processor_of;
  /// In [0, 1): the part of a compute instruction another device of its processor may overlap
  /// (the processor is held for 1 - overlap of its time). 0: co-located kernels take turns.
  double overlap = 0;
  /// The predicted step of the same plan with every device on its own processor (its compute at
  /// once with the others'): `predicted.step_ms` minus this is what sharing costs. Equals
  /// `predicted.step_ms` when no processor is shared.
  double separate_step_ms = 0;
};

/// Device d of `devices` on processor d mod ceil(devices / devices_per_processor): round robin,
/// as the CUDA backend places devices on GPUs. Throws `Error(kUsage)` unless 1 <=
/// devices_per_processor <= devices.
std::vector<int> processor_of_devices(int devices, int devices_per_processor);

/// True when some processor of `sharing` runs more than one device.
bool shares_processors(const ProcessorSharing& sharing);

struct Plan;

/// One line when some of the plan's devices share a processor: which, and what it costs: "devices
/// 0 and 2 share processor 0, 1 and 3 share processor 1 (2 per processor, overlap 0): predicted
/// step 3.100 ms, 2.000 ms if each had its own (+55.0%)". "" when each device has its own.
std::string describe_sharing(const Plan& plan);

/// A file outside the plan directory whose bytes stage files use as ONNX external data: the
/// model's own external-data file, referenced rather than copied (a plan of a 700 GB model is
/// small). Stage files name it by `location`; the runtime resolves that name only through this
/// entry, and refuses the plan when the file's size is not `bytes`.
struct WeightFile {
  std::string location;  ///< The name stage files use: "model_weights/" + the model's location.
  std::string path;      ///< The file itself, absolute.
  int64_t bytes = 0;     ///< Its size when the plan was written.
};

struct Stage {
  int index = 0;
  int device = 0;
  int chunk = 0;          ///< Which of the device's V chunks (interleaved), else 0.
  std::string file;       ///< "stage_0.onnx", relative to the plan directory.
  std::string file_hash;  ///< "fnv1a64:<16 hex digits>" of the stage file's bytes ("" in dry runs).
  /// Training: the stage's backward program ("stage_0_bwd.onnx", gradient ops of
  /// runtime/format/grad_ops.h) and its hash; "" for inference plans and dry runs.
  std::string backward_file;
  std::string backward_file_hash;
  /// The bytes of the stage file's initializers kept as ONNX external data (in the plan's
  /// `stage_K.weights` or in one of `Plan::weight_files`), and their `WeightsHasher` digest in
  /// the file's initializer order; the runtime hashes what it reads and refuses a mismatch.
  /// 0 and "" when the stage file embeds every weight (or in dry runs).
  int64_t weights_bytes = 0;
  std::string weights_hash;
  std::vector<std::string> nodes;  ///< Node names in execution order.
  int64_t params = 0;
  std::vector<StageTensor> inputs;
  std::vector<StageTensor> outputs;
  double fwd_ms = 0;  ///< Per microbatch.
  double bwd_ms = 0;  ///< Per microbatch (0 for inference).
  /// Training: the two parts of bwd_ms (B + W = bwd_ms) as the planner simulated them: B, the
  /// input gradient (with the forward re-run under recomputation), and W, the weight gradients
  /// (with their accumulation into the step's sums). Only ZB-H1 runs them apart. 0 for inference.
  double backward_input_ms = 0;
  double backward_weight_ms = 0;
  double optimizer_ms = 0;  ///< Training: the stage's optimizer step, once per step.
  double send_ms = 0;       ///< Sending its outputs to the next stage, per microbatch.
  int64_t in_flight = 1;    ///< Microbatches whose activations it holds at its peak.
  /// Training: activation recomputation. The stage keeps only its inputs per microbatch in
  /// flight and re-runs its forward just before the backward (bwd_ms includes that forward).
  bool recompute = false;
  MemoryBytes memory;
  int64_t arena_bytes = 0;         ///< The forward program's arena (one microbatch).
  std::vector<ArenaTensor> arena;  ///< Where each intermediate lives in it.
  /// Training: the backward program's arena (one microbatch's gradients in flight inside the
  /// backward, placed by runtime/format/memory_plan.h over the backward file's node order); the
  /// runtime checks its own plan of the backward file against it. 0 for inference.
  int64_t backward_arena_bytes = 0;
  /// Weights this stage holds that other stages hold too, by name (ascending).
  std::vector<SharedWeight> shared_weights;
  /// Training: predicted time of the step's exchange of the shared weights' gradients (0 when
  /// none); the optimizer step of the stage waits for it.
  double shared_exchange_ms = 0;
  /// Training with data parallelism: predicted time of the stage's ALLREDUCE (its weight
  /// gradients summed over the replicas, a ring: 2 (R - 1) steps of 1/R of them over the
  /// slowest link between its replicas' devices); 0 with one replica.
  double allreduce_ms = 0;
  /// Training with `Plan::shard_optimizer`: R + 1 element offsets into the stage's sharded
  /// parameters (its trained float32 weights that no other stage holds, flattened one after
  /// another in name order): replica r keeps the optimizer state of, and updates, elements
  /// [optimizer_shards[r], optimizer_shards[r + 1]). Starts at 0, never decreases, ends at the
  /// count of those elements (the runtime checks it against the stage's files). Empty without
  /// sharding. Shared weights (`shared_weights`) are not sharded: every replica keeps their
  /// state and updates them whole, after an all-reduce.
  std::vector<int64_t> optimizer_shards;
  /// Training with `Plan::shard_optimizer`: predicted time of the all-gather of the updated
  /// weights after the optimizer step (a ring: R - 1 steps of 1/R of them); 0 otherwise.
  double allgather_ms = 0;
  std::string why;  ///< Why the stage ends where it does.
};

/// One op's predictions.
struct OpRecord {
  std::string name;
  std::string op_type;
  int stage = 0;
  double fwd_ms = 0;
  double bwd_ms = 0;
  double flops = 0;
  int64_t param_bytes = 0;
  int64_t output_bytes = 0;
};

/// Predicted figures of a whole step, for a split (ours or a baseline).
struct Prediction {
  double step_ms = 0;
  double bubble_fraction = 0;
  double samples_per_s = 0;
  int64_t peak_memory_bytes = 0;  ///< Largest device peak.
  std::vector<double> device_busy_ms;
  /// Per device, the predicted peak (`DevicePeak`): the simulated peak with the arena and
  /// buffers.
  std::vector<int64_t> device_peak_bytes;
  std::vector<std::string> split_after;  ///< Node names after which each cut falls.
  bool fits = true;                      ///< Every device within its memory.
};

/// How the split was chosen: the exact solve (that minimises the slowest stage's time, or for
/// the memory objective the largest stage's memory), then a search by simulation (plan.json
/// "search").
struct SplitSearch {
  /// Distinct splits built, checked for memory and simulated: the solver's optimum, its
  /// re-solves for devices over their memory, the baselines, and local moves of each cut.
  int64_t candidates = 0;
  /// Splits the search moved to and did not simulate: their lower bound on the step (the
  /// busiest device's compute, or one microbatch's path through every stage) was already past
  /// the best fitting step found (optional in plan.json: 0 when absent).
  int64_t pruned = 0;
  /// The solver's optimum's predicted step (0 for a manual split, which has none).
  double bottleneck_step_ms = 0;
  bool bottleneck_fits = true;  ///< Whether that split fits every device.
  std::vector<std::string> bottleneck_split_after;
};

/// How a training plan trains (ignored by inference plans).
struct TrainingConfig {
  std::string loss;         ///< "mse" | "cross-entropy" | "model" (the model's own scalar output).
  std::string loss_output;  ///< The loss value's name.
  std::string labels;       ///< The labels input ("" for "model").
  double lr = 1e-3;         ///< The rate the optimizer uses: `base_lr` scaled by `lr_scaling`.
  /// How `lr` was scaled with the replica count R: "none" | "linear" (R x base_lr) | "sqrt"
  /// (sqrt(R) x base_lr), runtime/format/vocabulary.h LrScaling.
  std::string lr_scaling = "none";
  double base_lr = 1e-3;  ///< The rate given (stagec --lr).
  double weight_decay = 0;
  double momentum = 0.9;                              ///< momentum and nesterov.
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;  ///< adam and adamw.
  std::string lr_schedule = "constant";               ///< "constant" | "warmup-linear" | "cosine".
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  ///< Where warmup-linear and cosine reach 0 (0: constant after warm-up).
  /// C of gradient clipping (stagec --clip-grad-norm; 0: none): before the optimizer step every
  /// gradient is scaled by min(1, C / (norm + 1e-6)), the norm the global L2 norm over every
  /// trained weight (each shared weight once, the replicas' summed gradients), as PyTorch's
  /// torch.nn.utils.clip_grad_norm_. plan.json "clip_grad_norm", written only when set.
  double clip_grad_norm = 0;
};

struct Plan {
  int format_version = kPlanFormatVersion;
  std::string generator;  ///< "stagec 0.1.0".
  std::string model_path;
  std::string model_hash;  ///< "fnv1a64:<16 hex digits>" of the model file's bytes.
  /// "fnv1a64:<16 hex digits>" of schedule.json's bytes ("" when no schedule file was written).
  std::string schedule_hash;
  Objective objective = Objective::kSpeed;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  /// P: the devices of one pipeline (one replica). Stages, the schedule's lists and the
  /// predictions are per pipeline device; every replica runs the same.
  int devices = 1;
  int chunks = 1;        ///< V.
  int microbatches = 1;  ///< M, per replica.
  /// R: replicas of the pipeline (data parallelism), R x P devices in all. Replica r runs on
  /// devices (ranks of mpirun) r x P .. r x P + P - 1, takes rows [r x M x b, (r + 1) x M x b)
  /// of every batch, and sums its weight gradients with the other replicas' (ALLREDUCE)
  /// before each optimizer step.
  int data_parallel = 1;
  /// Where each device runs: for replica r's pipeline device d, `placement[r x P + d]` is its
  /// rank (mpirun's rank, filled node by node: rank k is on node k / cluster.devices_per_node),
  /// a permutation of 0 .. R x P - 1. The identity puts each pipeline on consecutive ranks
  /// (pipeline neighbours share a node); `replica_major_placement` puts the replicas of each
  /// pipeline device on consecutive ranks (the all-reduce inside a node). The planner picks by
  /// predicted step; one process ignores it (every device is a thread).
  std::vector<int> placement;
  /// ZeRO-1 (training, R >= 2): each replica keeps only its shard of every stage's optimizer
  /// state (`Stage::optimizer_shards`); a stage's ALLREDUCE is then a reduce-scatter of its
  /// sharded gradients (each replica gets its shard summed), its OPT_STEP updates that shard and
  /// all-gathers the updated weights from the other replicas.
  bool shard_optimizer = false;
  int64_t batch = 1;  ///< Global batch B = R x M x microbatch_size.
  int64_t microbatch_size = 1;
  bool training = false;
  OptimizerKind optimizer = OptimizerKind::kNone;
  TrainingConfig training_config;
  Precision precision = Precision::kFp32;
  std::string cost_model;  ///< e.g. "roofline(h100, fp32)".
  DeviceSpec device;
  ClusterSpec cluster;
  ProcessorSharing processors;  ///< Where the pipeline devices compute (`cluster`'s K).
  std::vector<Stage> stages;
  /// The model's external-data files the stage files reference (empty when the plan directory
  /// holds every weight: an inline model, or `stagec --copy-weights`).
  std::vector<WeightFile> weight_files;
  std::vector<OpRecord> ops;
  Prediction predicted;
  /// instruction_costs.step_overhead_ms (a calibrated plan's time a step takes beyond its
  /// instructions: the predicted step ends that long after its timeline); 0 for any other.
  double step_overhead_ms = 0;
  Prediction baseline_parameters;  ///< DeepSpeed's 'parameters' method: balance parameter counts.
  Prediction baseline_uniform;     ///< DeepSpeed's 'uniform' method: balance op counts.
  SplitSearch search;
  /// stagec --auto: every configuration it considered, the plan's own first (plan.json
  /// "auto_search", written only when not empty; runtime/format/auto_search.h).
  std::vector<AutoCandidate> auto_search;
  /// Per device (index = device), the predicted peak of `predicted` with its parts.
  std::vector<DevicePeak> device_memory;
  /// What the planner's simulation of `predicted` played, every instruction of every device
  /// (per device in list order): stagedump draws it and stagerun sets its measured run beside
  /// it. plan.json writes the times in milliseconds ("start_ms", "end_ms").
  std::vector<schedule::TimelineEvent> timeline;
};

nlohmann::ordered_json to_json(const Plan& plan);

/// Reads a plan; throws `Error(kFormat)` naming `source` and the field ("plan.json: field
/// 'stages[2].device' is missing") for anything missing or of the wrong type, and
/// `Error(kUnsupported)` for another format version.
Plan plan_from_json(const nlohmann::json& json, const std::string& source);

/// Throws `Error(kUnsupported)` naming `source` and both versions unless `version` is
/// `kPlanFormatVersion`.
void check_format_version(int version, const std::string& source);

/// Checks every cross reference of a plan: stage indices dense and in order, devices in
/// range, each stage input's producer stage exists, lists it as an output with the same
/// dtype and shape and names this stage among its readers, every node in exactly one stage,
/// no empty stage, ops referring to existing stages, every shared weight listed alike (dtype,
/// shape, holders) by each of its holders. Throws `Error(kPlan)` naming `source` and
/// the field.
void validate_plan(const Plan& plan, const std::string& source);

/// The identity placement of `replicas` x `devices` devices: replica r's device d on rank
/// r x devices + d.
std::vector<int> pipeline_major_placement(int replicas, int devices);

/// Replica r's device d on rank d x replicas + r: the replicas of a pipeline device side by side.
std::vector<int> replica_major_placement(int replicas, int devices);

/// ZeRO-1's split of `elements` sharded parameters over `replicas` (>= 1): the R + 1 boundaries
/// {0, elements / R, 2 elements / R, ..., elements} (rounded down; shards differ by at most one
/// element), what stagec records as a stage's `optimizer_shards`.
std::vector<int64_t> even_shards(int64_t elements, int replicas);

/// The distinct holder sets of `weights` (each ascending, the sets in ascending order): the
/// groups whose weight gradients ALLREDUCE_SHARED sums (schedule::PipelineShape::shared_groups).
std::vector<std::vector<int>> shared_weight_groups(const std::vector<SharedWeight>& weights);

/// The same for every stage's shared weights.
std::vector<std::vector<int>> shared_weight_groups(const Plan& plan);

/// Refuses a plan that does not fit the machine that is to run it: `Error(kPlan)` naming
/// `source`, the device and both numbers when a device's predicted peak
/// (`predicted.device_peak_bytes`) exceeds `capacity_bytes`, the memory of one of the machine's
/// devices (`capacity_name` says which, e.g. "this machine's physical memory").
void check_fits(const Plan& plan, int64_t capacity_bytes, std::string_view capacity_name,
                const std::string& source);

/// The physical device a plan device runs on (several may share one: all the CPU backend's
/// devices share the machine, a plan's devices may share one GPU).
struct Capacity {
  int index = 0;  ///< The physical device.
  int64_t bytes = 0;
  std::string name;  ///< "GPU 0 (NVIDIA H100 80GB HBM3)".
};

/// As above, with the plan devices that share a physical device summed: `Error(kPlan)` naming
/// the devices, their summed peak and the capacity when it does not fit. With data parallelism
/// the devices are all R x P of them (device g peaks as pipeline device g % P).
void check_fits(const Plan& plan, const std::function<Capacity(int device)>& capacity_of,
                const std::string& source);

/// Reads and validates PLAN_DIR/plan.json, and checks that every stage file exists and (when
/// a hash is recorded) matches it.
Plan load_plan(const std::string& plan_dir);

/// PLAN_DIR's file `name` ("plan.json", "schedule.json", a stage's `file`) as a path: the one
/// spelling of a plan directory's paths.
std::string plan_file(const std::string& plan_dir, std::string_view name);

/// "fnv1a64:<16 hex digits>" of a file's bytes (streamed). Throws `Error(kIo)`.
std::string file_hash(const std::string& path);

/// "fnv1a64:<16 hex digits>" of `bytes`.
std::string bytes_hash(std::string_view bytes);

/// The hash of a JSON value: of its compact text with the keys in order, so re-indenting a file
/// keeps it and changing any value does not.
std::string json_hash(const nlohmann::json& json);

/// plan.json's own hash: `json_hash` of its value without the `plan_hash` field.
std::string plan_json_hash(nlohmann::json json);

/// plan.json's text as stagec writes it: `json` with its `plan_hash` set (or replaced).
std::string plan_json_text(const nlohmann::ordered_json& json);

/// Throws `Error(kPlan)` naming `path` when schedule.json (`schedule`, as read from `path`) does
/// not hash to the plan's `schedule_hash`: it was changed after stagec wrote it.
void check_schedule_hash(const nlohmann::json& schedule, const Plan& plan, const std::string& path);

}  // namespace stagecraft::plan
