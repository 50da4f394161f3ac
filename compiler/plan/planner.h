#pragma once
/// \file
/// The planning driver: model -> costs -> partition -> schedule -> simulation -> plan.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compiler/import.h"
#include "compiler/plan/stage_weights.h"
#include "cost_models/calibration.h"
#include "cost_models/roofline.h"
#include "passes/loss.h"
#include "runtime/format/instruction_costs.h"
#include "runtime/format/plan.h"
#include "runtime/format/schedule.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::plan {

/// Imported models by file and import options, for the plans of one search: stagec --auto plans
/// every configuration whole, and those of one microbatch size import the same graph. Each plan
/// takes a copy (planning changes its graph); an import that fails is not kept.
struct ImportCache {
  std::map<std::string, ImportedModel> models;
};

/// What `stagec MODEL -o PLAN_DIR ...` asks for. The choices are the plan's vocabulary, parsed
/// once where the command line is read.
struct PlanOptions {
  std::string model_path;
  int devices = 1;  ///< All devices: data_parallel replicas of devices / data_parallel each.
  /// R: replicas of the pipeline (data parallelism); `devices` must be a multiple of it, and
  /// the global batch of R x microbatches.
  int data_parallel = 1;
  /// --data-parallel auto: the planner plans every R that divides `devices` and keeps the one
  /// with the highest predicted throughput that fits (`data_parallel` is then ignored).
  bool data_parallel_auto = false;
  /// With --train: how the learning rate grows with R (the rate given is kept as base_lr).
  LrScaling lr_scaling = LrScaling::kNone;
  /// With training: glob patterns (fnmatch) of float32 initializers to leave untrained
  /// (stagec --freeze), such as a FrozenBatchNorm's statistics and affine parameters.
  std::vector<std::string> freeze;
  /// With training: glob patterns of float32 initializers to train although they look like
  /// PyTorch buffers (stagec --train-also): non-finite values, or an additive attention mask.
  /// By default those are frozen and listed.
  std::vector<std::string> train_also;
  /// --shard-optimizer (ZeRO-1, training with R >= 2): each replica keeps 1/R of every stage's
  /// optimizer state (plan.json `shard_optimizer`); with `data_parallel_auto`, the replica
  /// counts above 1 are planned sharded.
  bool shard_optimizer = false;
  Objective objective = Objective::kSpeed;
  std::optional<ScheduleKind> schedule;  ///< Default: 1f1b for training, inference otherwise.
  /// A custom schedule in torch.distributed.pipelining's CSV (stagec --schedule-csv FILE;
  /// compiler/schedule/torch_csv.h): the plan's schedule is 'custom', and its chunks and
  /// microbatches default to the file's.
  std::string schedule_csv;
  int chunks = 0;                        ///< V; default 2 for interleaved, else 1.
  int microbatches = 0;                  ///< M per replica; default: the pipeline's device count.
  std::optional<int64_t> batch;          ///< Global batch B; split into R x M microbatches.
  std::map<std::string, int64_t> dims;   ///< Other symbolic dims (--dim).
  bool training = false;
  /// Inference plans only: keep Dropout and BatchNormalization that a training-mode export left
  /// in training mode as they are (stagec --keep-training-mode); by default they run in
  /// inference mode (the inference-mode pass), as PyTorch's eval() runs them.
  bool keep_training_mode = false;
  /// Training: keep the sharing of weights the exporter merged into equal ones (stagec
  /// --keep-merged); by default each merged name trains apart, as PyTorch trains it.
  bool keep_merged = false;
  /// Each attention block becomes one fused Attention node (on by default; stagec
  /// --no-fuse-attention turns it off).
  bool fuse_attention = true;
  /// Each GELU becomes one fused Gelu node (on by default; stagec --no-fuse-gelu turns it off).
  bool fuse_gelu = true;
  /// A split that leaves a device over its memory is returned (its `predicted.fits` false)
  /// instead of refused: stagec --auto compares such configurations' peaks.
  bool keep_over_memory = false;
  /// The split search leaves unsimulated the splits its lower bound rules out (the same choice
  /// either way; tests turn it off to check that).
  bool prune_split_search = true;
  OptimizerKind optimizer = OptimizerKind::kAdamW;  ///< With --train.
  passes::LossOptions loss;  ///< With --train: --loss, --labels, --loss-axis, --ignore-index.
  TrainingConfig
      training_config;  ///< With --train: lr, weight decay, schedule (loss fields are filled in).
  Precision precision = Precision::kFp32;
  std::string device_spec = "h100";      ///< Preset name or JSON file.
  std::string cluster;                   ///< JSON file; default: the device kind's.
  /// K pipeline devices per processor (--devices-per-processor; default: the cluster's, else
  /// 1): device d computes on processor d mod ceil(P / K), taking turns with the others there
  /// (plan.json `cluster.devices_per_processor`, `processors`).
  std::optional<int> devices_per_processor;
  /// The part of a compute instruction another device of its processor may overlap, in [0, 1)
  /// (--processor-overlap; 0: they take turns).
  double processor_overlap = 0;
  std::vector<std::string> split_after;  ///< Manual split points (node names).
  /// Activation recomputation (training): none, all (every stage), or auto (speed: on the
  /// devices that do not fit without it, the stages that save most first; memory: every stage
  /// whose memory it lowers). The split is chosen with it counted where it is on.
  Recompute recompute = Recompute::kNone;
  /// The op-time model, when not the analytic roofline (e.g. measured profiles: stagec
  /// --profile). Called once with the graph imported at the microbatch size and the roofline
  /// of the device spec and precision; plan.json's cost_model records the model's name().
  std::function<std::unique_ptr<cost::OpCostModel>(const ir::Graph& graph,
                                                   const cost::RooflineCostModel& roofline)>
      cost_model;
  /// Set by a search that plans the same model many times (auto_plan): imports are done once per
  /// set of import options and copied (ImportCache). Unset: every plan imports the file.
  std::shared_ptr<ImportCache> import_cache;
  /// Fixed instruction costs and calibration (stagec --profile; cost_models/calibration.h):
  /// called once the plan's shape is known with its `cost::calibration_key`; returns the
  /// profiled costs and the calibration kept for that key, if any. Unset: none are charged.
  std::function<cost::TermsChoice(const std::string& key)> instruction_terms;
};

/// A computed plan: the plan file's content, the schedule, and the graph the stages come from.
struct PlannedModel {
  ImportedModel model;  ///< Imported at the microbatch size.
  Plan plan;
  schedule::Schedule schedule;
  std::vector<int> stage_of;  ///< Node id -> stage.
  /// Training: one line saying which loss was appended (for cross-entropy: the class axis and
  /// why, the labels' shape per microbatch, the ignore index); "" otherwise.
  std::string loss_summary;
  /// --data-parallel auto: one line per replica count tried (its predicted step and
  /// throughput, or why it was not possible) and the one chosen; "" otherwise.
  std::string data_parallel_choice = {};
  /// Data parallelism on several nodes: which placement of the ranks was chosen, and the other's
  /// predicted step ("" otherwise).
  std::string placement_choice = {};
  /// Training a model with BatchNormalization: one line per kind present, saying how it trains
  /// (training_mode=1: the microbatch's statistics, running statistics updated and saved;
  /// inference mode: the running statistics as constants, no batch statistics); "" otherwise.
  std::string batch_norm_summary = {};
  /// --freeze: one line saying how many initializers (and parameters) it froze; "" otherwise.
  std::string freeze_summary = {};
  /// An inference plan of a training-mode export: one line saying which Dropout and
  /// BatchNormalization nodes now run in inference mode (and which could not); "" otherwise.
  std::string inference_mode_summary = {};
  /// Training: one line naming the weights the exporter had merged that now train apart; ""
  /// otherwise.
  std::string untie_summary = {};
  /// What the prediction charged beyond the ops' times (plan.json "instruction_costs"; empty
  /// without PlanOptions::instruction_terms).
  PlanInstructionCosts instruction_costs = {};
};

/// Plans the model. Refuses (Error) bad options with the flag named, and a model that fits in
/// no split with the stage, its memory anatomy and the device's capacity. With
/// `data_parallel_auto`, plans each replica count R dividing the devices and returns the plan
/// of the highest predicted samples/s among those that can be made and fit (ties: the fewer
/// replicas); refuses, listing every R and why, when none can.
PlannedModel make_plan(const PlanOptions& options);

/// Writes PLAN_DIR/{plan.json, schedule.json, stage_K.onnx, stage_K.weights}. Stage files
/// reference the model's external data where it has some (`writing.copy`: copy it too); see
/// plan/stage_weights.h. The directory is built beside the target and renamed into place, so a
/// failed write leaves the old plan as it was; an existing directory that holds no plan.json is
/// never replaced.
void write_plan(PlannedModel& planned, const std::string& plan_dir,
                const WeightWriting& writing = {});

/// Throws `Error(kUsage)` naming the model when `plan` trains but has no loss to write (stagec
/// says so before printing the plan; write_plan checks it too).
void check_has_loss(const Plan& plan);

/// A few lines for the terminal: stages, predicted step, bubble, baselines.
std::string summarize(const Plan& plan);

}  // namespace stagecraft::plan
