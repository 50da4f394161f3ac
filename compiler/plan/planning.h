#pragma once
/// \file
/// The planner's parts, shared by its files (not an interface): what it derives from the options
/// (planner_costs.cpp: the setup, per-node facts, the solver's problem, the simulated
/// prediction), the candidate splits as the plan would build them (candidates.cpp) and the choice
/// of the split (split_choice.cpp). planner.cpp assembles the plan from them.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/partition/graph_problem.h"
#include "compiler/partition/search.h"
#include "compiler/plan/device_memory.h"
#include "compiler/plan/planner.h"
#include "compiler/plan/stage_files.h"
#include "compiler/schedule/device_peak.h"
#include "compiler/schedule/simulator.h"
#include "compiler/schedule/torch_csv.h"
#include "cost_models/cluster.h"
#include "cost_models/device_spec.h"
#include "cost_models/op_cost.h"

namespace stagecraft::plan::planning {

/// Everything the planner derives from the options once.
struct Setup {
  ScheduleKind kind;
  Objective objective;
  Recompute recompute;  ///< kNone unless training.
  schedule::PipelineShape shape;
  OptimizerKind optimizer;
  Precision precision;
  cost::DeviceSpec device;
  cost::ClusterSpec cluster;
  int64_t microbatch_size = 1;
  /// ZeRO-1: the optimizer state of each replica is 1/R of the stage's (`Plan::shard_optimizer`).
  bool shard_optimizer = false;
  /// Gradient clipping (`TrainingConfig::clip_grad_norm` > 0): the optimizer step also reads
  /// every gradient for the global norm and sums it over the devices (`stage_costs`).
  bool clips_gradients = false;
  /// The rank (cluster slot) of replica r's pipeline device d at r x P + d (`Plan::placement`).
  std::vector<int> placement;
  /// Which processor each pipeline device computes on (`cluster.devices_per_processor` of them
  /// per processor) and how much co-located compute overlaps; `separate_step_ms` unset.
  ProcessorSharing processors;
  /// Per stage: the most microbatches whose activations it holds at once under the schedule
  /// (schedule::stage_in_flight_peaks; an interleaved device's chunks differ).
  std::vector<int64_t> in_flight;
  /// A custom schedule's compute order (--schedule-csv; kind is kCustom), and its file.
  std::optional<schedule::TorchCsvSchedule> custom;
  std::string custom_source;
  /// PlanOptions::keep_over_memory: even a model whose least-memory split is over a device's
  /// memory is split and simulated (stagec --auto compares the peaks), not refused.
  bool keep_over_memory = false;
  bool prune_split_search = true;  ///< PlanOptions::prune_split_search.
  /// What the simulation charges beyond the ops' times (PlanOptions::instruction_terms):
  /// `terms` is played (the calibration when there is one, else the profiled costs).
  cost::InstructionTerms terms;
  cost::InstructionTerms profiled_terms;
};

/// The schedule of `s.kind` (or of its custom order) for `s.shape`: what every candidate runs.
schedule::Schedule setup_schedule(const Setup& s);

/// Whether the schedule runs stage `stage`'s backward as B and a deferred W (ZB-H1, ZB-V, for
/// some microbatches DualPipeV, or a custom order with BWD_INPUT for it): its W holds values
/// from B and re-runs a recomputed forward.
bool splits_backward(const Setup& s, int stage);

/// The cluster slot of replica `replica`'s pipeline device `device` (s.placement).
int rank_of(const Setup& s, int replica, int device);

/// The simulator's view of `s.processors`: empty when every device has its own processor.
schedule::Processors sim_processors(const Setup& s);

/// What a plan that does not fit could change, as a refusal's closing words: "use more devices,
/// --recompute auto, --precision mixed, a lighter --optimizer, or fewer --microbatches", less
/// whatever the setup already has (recomputation, 16-bit precision, SGD, one microbatch).
std::string fit_suggestions(const Setup& s);

/// A weight a node reads: its elements, and whether training updates it (a gradient and
/// optimizer state: passes::trainable_weights; not a frozen weight or a buffer such as
/// BatchNormalization's running statistics). Or a constant it reads (any other initializer: a
/// causal mask kept as a bool buffer, a folded float mask, index and shape operands): no
/// elements, its bytes in `constant_bytes`; the runtime loads it with the stage's weights.
struct WeightRead {
  ir::ValueId value = ir::kNoId;
  int64_t elements = 0;
  bool trainable = false;
  int64_t constant_bytes = 0;
  /// Position of the read of the same weight just before this one (an earlier node's, or this
  /// node's when it reads the weight twice); -1 for its first read. A span counts the weight at
  /// the read whose previous one lies before the span: once, with no search.
  int previous = -1;
};

/// Per-node numbers in topological position order.
struct NodeFacts {
  std::vector<cost::OpTime> time;
  std::vector<int64_t> params;            ///< Weights first read by this node.
  std::vector<int64_t> trainable_params;  ///< The trainable ones among them.
  std::vector<int64_t> constant_bytes;    ///< Constants first read by this node (WeightRead).
  /// Every weight this node reads: a stage holds each weight its nodes read, so a weight read
  /// in several stages counts in each (span_weights).
  std::vector<std::vector<WeightRead>> weights_read;
  std::vector<int64_t> output_bytes;  ///< Outputs of every type: kept for backward.
  std::vector<double> flops;
  /// Per node: its calibration factors where they follow the ops
  /// (cost::InstructionTerms::follows_ops); empty otherwise.
  std::vector<cost::OpFactors> factors;
};

/// Per stage of the plan: whether it recomputes, and the bytes of its inputs per microbatch
/// (what it keeps per microbatch in flight when it does). Empty: no stage recomputes.
struct SimExtras {
  std::vector<bool> on;
  std::vector<double> input_bytes;
  /// Per stage: what a split backward holds from B to W (stage_files.h deferred_bytes).
  std::vector<double> deferred_bytes;
  /// Per stage: the step's exchange of its shared weights' gradients (Stage::shared_exchange_ms).
  std::vector<double> shared_exchange_s;
  /// Per stage: the all-reduce of its weight gradients over the replicas (Stage::allreduce_ms).
  std::vector<double> allreduce_s;
  /// Per stage: the buckets the runtime cuts its all-reduce into (stagerun's default size).
  std::vector<double> allreduce_buckets;
  /// Per stage: ZeRO-1's all-gather of its updated weights (Stage::allgather_ms).
  std::vector<double> allgather_s;
  bool at(std::size_t k) const { return k < on.size() && on[k]; }
};

/// A stage's backward as the runtime will run it: its arena and what a split backward holds
/// from B to W.
struct BackwardFacts {
  int64_t arena = 0;
  double deferred = 0;
};

/// One split as the plan would have it: its stages (recomputation decided), its schedule, the
/// prediction and the memory of every device.
struct Candidate {
  partition::Solution sol;
  std::vector<int> stage_of;
  Setup setup;  ///< With the split's shared-weight groups.
  schedule::Schedule schedule;
  std::vector<Stage> stages;
  SimExtras rc;
  Prediction predicted;                           ///< `fits`: every device within its memory.
  std::vector<schedule::TimelineEvent> timeline;  ///< What the simulation of `predicted` played.
  /// Per device, its predicted peak and the parts of it: what `fits` is judged by.
  std::vector<DevicePeak> peaks;
  int worst_device = 0;       ///< The device with the least room (or the most over).
  double overflow_bytes = 0;  ///< Bytes over capacity, summed over devices.
};

/// How the split was chosen.
struct SplitChoice {
  std::vector<int> cuts;
  std::vector<int> bottleneck_cuts;  ///< The exact solve's split; empty for a manual one.
  Prediction bottleneck;             ///< Its prediction.
  Prediction baseline_parameters, baseline_uniform;
  int64_t candidates = 0;  ///< Distinct splits simulated.
  int64_t pruned = 0;      ///< Splits not simulated: their step's lower bound was too long.
  /// When the tie-break chose another split than the fastest found (a step within 1% that sends
  /// fewer bytes across its cuts): the fastest one's cuts and prediction, the chosen one's step
  /// and the bytes per microbatch each sends across its cuts (before --precision mixed). Empty cuts otherwise.
  std::vector<int> fastest_cuts;
  Prediction fastest;
  double tied_step_ms = 0;  ///< The chosen split's step under the same simulation.
  double fastest_crossing_bytes = 0;
  double crossing_bytes = 0;
};

/// The setup of `o`: parsed shape, schedule rules checked (with the flag named), device and
/// cluster read, the schedule's in-flight counts.
Setup make_setup(const PlanOptions& o);

/// The cost, parameters, weights read, kept bytes and FLOPs of every node of `order`, and its
/// factors in `terms` where they follow the ops.
NodeFacts node_facts(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                     const cost::OpCostModel& costs, Precision precision,
                     const cost::InstructionTerms& terms);

/// The parameters a stage of positions [first, last] holds, and the trainable ones among them:
/// every weight its nodes read, once (a weight shared with other stages counts in each); and
/// the bytes of the constants they read, once each.
struct SpanWeights {
  int64_t params = 0;
  int64_t trainable = 0;
  int64_t constant_bytes = 0;
};
SpanWeights span_weights(const NodeFacts& f, int first, int last);

/// The bytes `params` weights take, `trainable` of them with a gradient and optimizer state
/// (training), and `constant_bytes` of constants beside them.
double weight_state_bytes(const Setup& s, double params, double trainable, double constant_bytes);

/// Microbatches whose activations global stage `k` keeps at once (1 for inference, which keeps
/// none for a backward).
double in_flight(const Setup& s, int k);

/// The solver's problem: per-position costs, cut bytes, send times, in-flight counts, capacity.
partition::GraphProblem build_problem(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                                      const Setup& s, const NodeFacts& facts);

/// Adding one microbatch's weight gradients into the step's sums: read both, write one (fp32),
/// memory-bound. Part of every backward's W.
double accumulate_s(const Setup& s, double params);

/// The simulator's per-stage costs of the split `sol` (B and W apart, the optimizer step), with
/// `rc`'s per-stage extras: what `predict` plays.
schedule::StageCosts stage_costs(const Setup& s, const partition::Solution& sol, const NodeFacts& f,
                                 const SimExtras& rc);

/// `raw` (stage_costs) with `terms` applied: each stage's op times times its factors, the fixed
/// instruction costs, the start delay of each of `devices` pipeline devices. What the simulation
/// plays; plan.json's stage times are `raw`.
schedule::StageCosts with_terms(const cost::InstructionTerms& terms, schedule::StageCosts raw,
                                int devices);

/// `s.terms` for the split `sol`: where its factors follow the ops, each stage gets its own ops'
/// factors (`f.factors`) weighted by their times, wherever the cuts fall
/// (cost::InstructionTerms::for_split); otherwise `s.terms` as they are.
cost::InstructionTerms split_terms(const Setup& s, const partition::Solution& sol,
                                   const NodeFacts& f);

/// `raw` (stage_costs of the split `sol`) with `split_terms(s, sol, f)` applied.
schedule::StageCosts with_terms(const Setup& s, const partition::Solution& sol, const NodeFacts& f,
                                schedule::StageCosts raw);

/// The simulated step of `sched` for the split `sol` into `stages` (their anatomies filled in),
/// with `rc`'s per-stage extras; its device peaks are `peaks` (schedule/device_peak.h), the
/// events it played `timeline`. Without a `timeline` the peaks come without their memory over
/// time (SimDetail::kPeaks: a search's candidates).
/// `prepared`: `sched` prepared for `s.shape` (schedule::prepare_schedule), to play without
/// asking its rules again.
Prediction predict(const Setup& s, const schedule::Schedule& sched, const partition::Solution& sol,
                   const NodeFacts& f, const ir::Graph& g, const std::vector<ir::NodeId>& order,
                   int64_t batch, const std::vector<Stage>& stages, const SimExtras& rc,
                   std::vector<schedule::TimelineEvent>* timeline, std::vector<DevicePeak>* peaks,
                   const schedule::PreparedSchedule* prepared = nullptr);

/// A stage's forward arena (candidates.cpp plan_stage_arena) depends only on its span of
/// positions: what its nodes produce and which values leave the span. SplitEvaluator keeps it
/// per span across the candidate splits of a search, which share most of their stages.
struct SpanArena {
  int64_t bytes = 0;
  std::vector<ArenaTensor> tensors;
};
using SpanArenas = std::map<std::pair<int, int>, SpanArena>;

/// Builds and checks splits the way the plan is built, so that every split the search compares
/// passes the plan's own memory check: the full anatomy of every stage and each device's stages
/// together under the schedule's in-flight counts, with recomputation where it is chosen.
/// Backward programs (the arena a training stage needs) are built once per span of positions.
class SplitEvaluator {
 public:
  /// Evaluates splits of `order` (the problem `gp`) under `s`; `loss_output` is the training
  /// loss ("" before one is appended), `batch` the samples of one step.
  SplitEvaluator(const Setup& s, const NodeFacts& f, const ir::Graph& g,
                 const std::vector<ir::NodeId>& order, const partition::GraphProblem& gp,
                 std::string loss_output, int64_t batch)
      : s_(s),
        f_(f),
        g_(g),
        order_(order),
        gp_(gp),
        loss_output_(std::move(loss_output)),
        batch_(batch) {}

  /// The device's memory, bytes.
  double capacity() const { return static_cast<double>(s_.device.memory_bytes); }

  /// Builds the split with stages ending after `cuts` and checks it. `scoring_only`: its
  /// stages leave out their node names and arena tensors (their sizes stay), which the score,
  /// the prediction and the device peaks do not read: the search's many candidates.
  Candidate evaluate(const std::vector<int>& cuts, bool scoring_only = false);
  /// The same for the split `sol` (`solution(cuts)`).
  Candidate evaluate(partition::Solution sol, bool scoring_only = false);

  /// The stages, times and sends of the split with stages ending after `cuts`.
  partition::Solution solution(const std::vector<int>& cuts) const;

  /// A lower bound on the step `evaluate(cuts)` predicts, ms, from the stage times the
  /// simulator plays: the busiest device's compute, and per stage its fill (microbatch 1's
  /// forward through the stages before it), its own microbatches one at a time, the round trip
  /// microbatch 1 makes through the stages after it before the stage can run its backward, the
  /// last gradient's way back to stage 0, the transfers between devices and the optimizer step.
  /// The simulator only adds to these (waits, link contention, fixed costs, recomputation,
  /// shared processors); every simulated split checks it (split_choice.cpp).
  double step_bound_ms(const partition::Solution& sol) const;

  /// The stages of `sol` that recompute in any fitting plan of it (every one with --recompute
  /// all; with auto, those whose own memory is past the device without recomputation): what
  /// `step_bound_ms` charges the forward re-run for.
  SimExtras must_recompute(const partition::Solution& sol) const;

  /// The search's key: the simulated step under the speed objective, the largest device peak
  /// under the memory objective, the other as the tie-breaker.
  partition::SplitScore score(const Candidate& c) const;

 private:
  /// The backward facts of stage `k`, built once per span of positions.
  BackwardFacts backward(const partition::Solution& sol, std::size_t k, const StageInterfaces& io,
                         const std::vector<int>& stage_of);

  const Setup& s_;
  const NodeFacts& f_;
  const ir::Graph& g_;
  const std::vector<ir::NodeId>& order_;
  const partition::GraphProblem& gp_;
  std::string loss_output_;
  int64_t batch_;
  std::map<std::pair<int, int>, BackwardFacts> backward_cache_;
  SpanArenas arena_cache_;
  /// The schedule of the setup, by the split's shared-weight groups (all of the shape a split
  /// changes): built once, not once per candidate.
  /// With it, its activation moments (device_memory's peaks without walking the lists).
  struct KnownSchedule {
    schedule::PreparedSchedule prepared;  ///< The schedule, checked and its order of play kept.
    schedule::ActivationMoments moments;
  };
  std::map<std::vector<std::vector<int>>, KnownSchedule> schedules_;
  std::optional<std::vector<ir::ValueId>> trainable_;  ///< The graph's trainable weights.
};

/// Positions after which the named nodes end a stage (manual split points).
std::vector<int> split_positions(const ir::Graph& g, const partition::GraphProblem& gp,
                                 const std::vector<std::string>& names);

/// Chooses the split: the manual one, or the exact bottleneck solve (under a per-stage limit that
/// is never stricter than the device check), re-solved with tighter limits when a device does
/// not fit, then the search by simulation from the best of those and the baselines. Every
/// candidate is built and checked by `evaluator`.
SplitChoice choose_split(SplitEvaluator& evaluator, const Setup& s, const NodeFacts& facts,
                         const partition::GraphProblem& gp, const std::vector<int>& manual_cuts);

}  // namespace stagecraft::plan::planning
