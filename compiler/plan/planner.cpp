#include "compiler/plan/planner.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <span>

#include "compiler/model_info.h"
#include "compiler/plan/planning.h"
#include "compiler/plan/trained_weights.h"
#include "cost_models/memory.h"
#include "cost_models/roofline.h"
#include "passes/autodiff.h"
#include "passes/passes.h"
#include "runtime/format/error.h"

namespace stagecraft::plan {

using namespace planning;

namespace {

/// Why stage `k` ends where it does, for plan.json's "why".
std::string why(const partition::Solution& sol, std::size_t k, const ir::Graph& g,
                const std::vector<ir::NodeId>& order, const partition::Problem& problem,
                bool manual) {
  const auto& st = sol.stages[k];
  if (k + 1 == sol.stages.size()) return "last stage: takes the remaining ops";
  std::string base =
      manual ? fmt::format("cut after '{}' as --split-after asked", g.node(order[st.last]).name)
             : fmt::format("cut after '{}'", g.node(order[st.last]).name);
  double cap = problem.capacity_bytes(static_cast<int>(k));
  std::string bound =
      problem.objective == Objective::kSpeed
          ? fmt::format("stage time {:.3f} ms against a bottleneck of {:.3f} ms", st.time_s * 1e3,
                        sol.bottleneck_s * 1e3)
          : fmt::format("the solver's stage memory estimate {} against its largest of {}",
                        format_bytes(st.memory_bytes), format_bytes(sol.peak_memory_bytes));
  std::string memory = st.memory_bytes > 0.9 * cap
                           ? fmt::format(
                                 "; the solver's stage memory estimate {} is near the "
                                 "device's {}",
                                 format_bytes(st.memory_bytes), format_bytes(cap))
                           : "";
  return fmt::format("{}: {}; sends {} per microbatch{}", base, bound,
                     format_bytes(problem.cut_bytes[st.last]), memory);
}

/// One device's predicted peak for people: "device 1 (stages 1, 3) peaks at 4.06 MiB, 3.20 ms
/// into the step: weights ..., activations ... for 6 in flight, ..." (its parts add up to it).
std::string peak_line(const DevicePeak& peak, const std::vector<Stage>& stages) {
  std::vector<int> own;
  bool recomputes = false;
  for (const Stage& st : stages)
    if (st.device == peak.device) {
      own.push_back(st.index);
      recomputes = recomputes || st.recompute;
    }
  return fmt::format(
      "device {} ({} {}{}) peaks at {}, {:.3f} ms into the step: {}", peak.device,
      own.size() == 1 ? "stage" : "stages", fmt::join(own, ", "), recomputes ? ", recomputing" : "",
      format_bytes(static_cast<double>(peak.peak_bytes)), peak.peak_ms, describe_parts(peak));
}

/// ZeRO-1: each stage's trained weights that no other stage holds, flattened in name order (as
/// the runtime lays out its gradient bucket), split evenly over the replicas. The writer counts
/// them again from the backward file it writes (write_plan).
void set_optimizer_shards(Plan& p, const ir::Graph& g, const std::vector<ir::NodeId>& order,
                          const partition::Solution& sol) {
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    Stage& st = p.stages[k];
    std::vector<ir::NodeId> nodes(order.begin() + sol.stages[k].first,
                                  order.begin() + sol.stages[k].last + 1);
    int64_t elements = 0;
    for (ir::ValueId w : passes::trainable_weights(g, nodes)) {
      const std::string& name = g.value(w).name;
      if (std::none_of(st.shared_weights.begin(), st.shared_weights.end(),
                       [&](const SharedWeight& sw) { return sw.name == name; }))
        elements += g.value(w).numel();
    }
    st.optimizer_shards = even_shards(elements, p.data_parallel);
  }
}

}  // namespace

namespace {

/// --data-parallel auto: every replica count that divides the devices, planned; the fastest.
PlannedModel choose_data_parallel(const PlanOptions& o) {
  if (o.devices < 1) fail(ErrorKind::kUsage, "--devices {} must be at least 1", o.devices);
  std::optional<PlannedModel> best;
  std::vector<std::string> lines;
  for (int replicas = 1; replicas <= o.devices; ++replicas) {
    if (o.devices % replicas != 0) continue;
    PlanOptions one = o;
    one.data_parallel_auto = false;
    one.data_parallel = replicas;
    one.shard_optimizer = o.shard_optimizer && replicas > 1;  // one replica has nothing to shard
    try {
      PlannedModel planned = make_plan(one);
      const Prediction& p = planned.plan.predicted;
      lines.push_back(fmt::format("{} x {} devices: step {:.3f} ms, {:.1f} samples/s", replicas,
                                  o.devices / replicas, p.step_ms, p.samples_per_s));
      if (!best || p.samples_per_s > best->plan.predicted.samples_per_s) best = std::move(planned);
    } catch (const Error& e) {
      // A replica count the batch or the memory does not allow; anything else is a fault.
      if (e.kind() != ErrorKind::kUsage && e.kind() != ErrorKind::kPlan) throw;
      lines.push_back(fmt::format("{} x {} devices: {}", replicas, o.devices / replicas, e.what()));
    }
  }
  if (!best)
    fail(ErrorKind::kPlan,
         "--data-parallel auto: no replica count of {} devices can be planned: {}", o.devices,
         fmt::join(lines, "; "));
  best->data_parallel_choice = fmt::format(
      "--data-parallel auto: {} replica{} (the highest predicted throughput); tried {}\n",
      best->plan.data_parallel, best->plan.data_parallel == 1 ? "" : "s", fmt::join(lines, "; "));
  return std::move(*best);
}

/// The split for one placement of the devices on the cluster's ranks (Setup::placement).
struct Attempt {
  Setup setup;
  std::unique_ptr<partition::GraphProblem> gp;
  SplitChoice choice;
  Candidate chosen;
};

Attempt plan_split(const Setup& s, std::vector<int> placement, const ir::Graph& g,
                   const std::vector<ir::NodeId>& order, const NodeFacts& facts,
                   const PlanOptions& o, const std::string& loss_output) {
  Attempt a{s, nullptr, {}, {}};
  a.setup.placement = std::move(placement);
  a.gp = std::make_unique<partition::GraphProblem>(build_problem(g, order, a.setup, facts));
  const int stages = a.gp->problem.stages;
  if (stages > static_cast<int>(order.size())) {
    fail(ErrorKind::kUsage,
         "{} stages ({} devices x {} chunks) for a model of {} ops after import: every stage "
         "needs an op",
         stages, s.shape.devices, s.shape.chunks, order.size());
  }
  // Throughput counts the samples of every replica.
  SplitEvaluator evaluator(a.setup, facts, g, order, *a.gp, loss_output,
                           s.microbatch_size * s.shape.microbatches * s.shape.data_parallel);
  a.choice = choose_split(
      evaluator, a.setup, facts, *a.gp,
      o.split_after.empty() ? std::vector<int>{} : split_positions(g, *a.gp, o.split_after));
  a.chosen = evaluator.evaluate(a.choice.cuts);
  return a;
}

/// Replicas on a cluster of several nodes: pipelines within nodes (the identity) or each
/// device's replicas within nodes, whichever the simulation predicts the shorter step for (the
/// first on a tie; one that fits before one that does not); `line` says which and the other's
/// step. One node or one replica: the identity, "" in `line`.
Attempt choose_placement(const Setup& s, const ir::Graph& g, const std::vector<ir::NodeId>& order,
                         const NodeFacts& facts, const PlanOptions& o,
                         const std::string& loss_output, std::string& line) {
  const int replicas = s.shape.data_parallel, pipeline = s.shape.devices;
  Attempt best =
      plan_split(s, pipeline_major_placement(replicas, pipeline), g, order, facts, o, loss_output);
  if (replicas < 2 || replicas * pipeline <= s.cluster.devices_per_node) return best;
  Attempt other =
      plan_split(s, replica_major_placement(replicas, pipeline), g, order, facts, o, loss_output);
  const Prediction &a = best.chosen.predicted, &b = other.chosen.predicted;
  const bool better = b.fits != a.fits ? b.fits : b.step_ms < a.step_ms;
  line = fmt::format(
      "placement: {} (predicted step {:.3f} ms; {} {:.3f} ms{}); {} devices per node\n",
      better ? "each device's replicas on neighbouring ranks (rank = device x replicas + replica)"
             : "each pipeline on neighbouring ranks (rank = replica x devices + device)",
      better ? b.step_ms : a.step_ms,
      better ? "pipelines on neighbouring ranks" : "replicas on neighbouring ranks",
      better ? a.step_ms : b.step_ms, (better ? a.fits : b.fits) ? "" : ", does not fit",
      s.cluster.devices_per_node);
  return better ? std::move(other) : std::move(best);
}

/// How the model's BatchNormalizations train (PlannedModel::batch_norm_summary).
std::string batch_norm_summary(const ir::Graph& g, const Setup& s) {
  int training = 0, inference = 0;
  std::string first_inference;
  for (ir::NodeId id : g.topological_order()) {
    const ir::Node& node = g.node(id);
    if (node.op_type != "BatchNormalization" || !node.domain.empty()) continue;
    if (node.attr_int("training_mode", 0) != 0) {
      ++training;
    } else if (inference++ == 0) {
      first_inference = node.name;
    }
  }
  std::string out;
  if (training > 0)
    out += fmt::format(
        "{} BatchNormalization node{} in training mode (training_mode=1): each microbatch is "
        "normalised by its own statistics, and the running mean and variance are updated after "
        "every microbatch's forward (ONNX's momentum rule) and saved by checkpoints and "
        "--export{}\n",
        training, training == 1 ? "" : "s",
        s.shape.data_parallel > 1 ? "; each data-parallel replica updates its own copy from its "
                                    "microbatches, the first replica's is saved"
                                  : "");
  if (inference > 0)
    out += fmt::format(
        "{} BatchNormalization node{} in inference mode (training_mode absent or 0, as an "
        "eval-mode export writes them; the first: '{}'): the running statistics are used as "
        "constants and never updated, so the network trains without batch statistics (export "
        "with training=TrainingMode.TRAINING to train them)\n",
        inference, inference == 1 ? "" : "s", first_inference);
  return out;
}

/// Training: refuses a model with nothing to train, says how its BatchNormalizations train and
/// gives its training-mode Dropouts their masks (a Dropout's gradient reads the mask its
/// forward drew).
void prepare_training(PlannedModel& out, const Setup& s, const PlanOptions& o) {
  const std::string& model_path = o.model_path;
  freeze_weights(out, o);
  freeze_untrainable(out, o);
  keep_padding_rows(out, o);
  std::vector<ir::NodeId> all = out.model.graph.topological_order();
  if (passes::trainable_weights(out.model.graph, all).empty())
    fail(ErrorKind::kModel,
         "{}: --train asked for a model with no trainable weights (no float32 initializer feeds "
         "a differentiable "
         "input)",
         model_path);
  out.batch_norm_summary = batch_norm_summary(out.model.graph, s);
  passes::keep_dropout_masks(out.model.graph);
}

/// Inference: Dropout and BatchNormalization left in training mode by a training-mode export run
/// as in inference (the inference-mode pass), unless --keep-training-mode; one line says so.
void prepare_inference(PlannedModel& out, const PlanOptions& o) {
  passes::PassContext context;
  if (o.keep_training_mode) {
    // Only counted, to say what stays in training mode.
    ir::Graph copy = out.model.graph;
    passes::InferenceMode{}.run(copy, context);
  } else {
    passes::InferenceMode{}.run(out.model.graph, context);
    // Attention blocks whose probabilities went through a training-mode Dropout fuse now that
    // the Dropout passes them through.
    if (o.fuse_attention && context.counters["inference-mode: Dropout"] > 0) {
      passes::PassContext fusing;
      passes::FuseAttention().run(out.model.graph, fusing);
      out.model.attention_not_fused = fusing.not_fused;
    }
  }
  const int64_t dropout = context.counters["inference-mode: Dropout"];
  const int64_t bn = context.counters["inference-mode: BatchNormalization"];
  const int64_t kept = context.counters["inference-mode: BatchNormalization kept"];
  const auto nodes = [](int64_t n, const char* op) {
    return fmt::format("{} {} node{}", n, op, n == 1 ? "" : "s");
  };
  std::string found;
  if (dropout > 0) found = nodes(dropout, "Dropout");
  if (bn > 0) found += (found.empty() ? "" : " and ") + nodes(bn, "BatchNormalization");
  if (!found.empty()) {
    out.inference_mode_summary =
        o.keep_training_mode
            ? fmt::format("--keep-training-mode: {} exported in training mode stay in it (Dropout "
                          "drops at random, BatchNormalization uses each batch's statistics)\n",
                          found)
            : fmt::format("inference plan: {} exported in training mode run in inference mode, as "
                          "PyTorch's eval() (Dropout passes its input through, BatchNormalization "
                          "uses its running statistics); --keep-training-mode keeps them\n",
                          found);
  }
  if (kept > 0)
    out.inference_mode_summary += fmt::format(
        "inference plan: {} in training mode stay in it: the model reads its running-statistics "
        "outputs, which inference mode does not have\n",
        nodes(kept, "BatchNormalization"));
}

/// `--precision mixed` on the chosen split: the stage records take the tensors, arenas and
/// activations of the bfloat16 stage graphs (stage_files.h `make_mixed`), and the split is
/// simulated again with them.
void apply_mixed_precision(ir::Graph& g, const std::string& loss_output, Candidate& chosen,
                           const Setup& s, const NodeFacts& facts,
                           const std::vector<ir::NodeId>& order, double capacity) {
  // The stage graphs compute in bfloat16 (passes/mixed_precision.cpp): the stage records take
  // the tensors and arenas of those graphs, and the chosen split is simulated again with them.
  const MixedStages mixed =
      make_mixed(g, chosen.stage_of, chosen.stages, loss_output, s.shape.training,
                 s.precision == Precision::kFp16 ? DType::kFloat16 : DType::kBFloat16);
  for (std::size_t k = 0; k < chosen.stages.size() && k < chosen.rc.input_bytes.size(); ++k)
    chosen.rc.input_bytes[k] += static_cast<double>(mixed.input_bytes_delta[k]);
  // Activations: the planner counted the float outputs at half their float32 bytes; the
  // graph now holds their real dtypes, and the input and loss Casts' outputs besides. The
  // difference goes on each stage's last op, which is where the simulation sums a stage's
  // activations. Weights: the planner counted 6 B/param, the float32 master and one 16-bit
  // copy; a stage holds the master and the copies its backward reads, one for the whole step
  // (`MixedStages::weight_copy_bytes`), none of the weights that stay float32
  // (BatchNormalization's).
  NodeFacts mixed_facts = facts;
  for (std::size_t k = 0; k < chosen.stages.size(); ++k) {
    const partition::StageSpan& span = chosen.sol.stages[k];
    int64_t planned = 0;
    for (int i = span.first; i <= span.last; ++i) planned += facts.output_bytes[i];
    plan::Stage& st = chosen.stages[k];
    const int64_t delta = mixed.activation_bytes[k] - planned;
    mixed_facts.output_bytes[span.last] += delta;
    if (s.shape.training) {
      st.memory.activations += st.recompute ? delta : st.in_flight * delta;
      // The float32 masters (fp32's bytes per parameter) and the 16-bit copies kept.
      st.memory.weights =
          static_cast<int64_t>(cost::weight_bytes_per_param(Precision::kFp32, true)) * st.params +
          mixed.weight_copy_bytes[k] + span_weights(facts, span.first, span.last).constant_bytes;
    }
  }
  chosen.predicted = predict(chosen.setup, chosen.schedule, chosen.sol, mixed_facts, g, order,
                             s.microbatch_size * s.shape.microbatches * s.shape.data_parallel,
                             chosen.stages, chosen.rc, &chosen.timeline, &chosen.peaks);
  chosen.overflow_bytes = 0;
  for (const DevicePeak& d : chosen.peaks)
    chosen.overflow_bytes += std::max(0.0, static_cast<double>(d.peak_bytes) - capacity);
  chosen.predicted.fits = chosen.overflow_bytes == 0;
}

/// The chosen split with its stage graphs in 16 bits (`apply_mixed_precision`), the graph of
/// `out` converted. The search estimates a 16-bit stage from the float32 graph; where the
/// converted stages then leave a device over its memory that the search thought fit, and
/// `--recompute auto` could still recompute more, the search runs again with the devices that
/// much smaller (at most twice), and the first plan that fits is kept (else the first one,
/// which the caller refuses).
Attempt with_mixed_precision(Attempt best, PlannedModel& out, const Setup& s,
                             const std::vector<ir::NodeId>& order, const NodeFacts& facts,
                             const PlanOptions& o) {
  const double capacity = static_cast<double>(s.device.memory_bytes);
  const std::string& loss = out.plan.training_config.loss_output;
  // Only a split the search thought fit: one it knew to be over is not an estimate's error.
  const bool may_retry = s.shape.training && s.recompute == Recompute::kAuto &&
                         s.objective == Objective::kSpeed && best.chosen.predicted.fits;
  ir::Graph mixed = out.model.graph;  // the weights' bytes are shared, not copied
  apply_mixed_precision(mixed, loss, best.chosen, best.setup, facts, order, capacity);
  double smaller = 0;
  for (int round = 0; round < 2 && may_retry && !best.chosen.predicted.fits; ++round) {
    double over = 0;
    for (const DevicePeak& d : best.chosen.peaks)
      over = std::max(over, static_cast<double>(d.peak_bytes) - capacity);
    smaller += over + 0.005 * capacity;
    Setup tighter = s;
    tighter.device.memory_bytes = static_cast<int64_t>(capacity - smaller);
    if (tighter.device.memory_bytes <= 0) break;
    std::string placement_line;
    Attempt retry;
    try {
      retry = choose_placement(tighter, out.model.graph, order, facts, o, loss, placement_line);
    } catch (const Error&) {
      break;  // nothing fits the smaller device: the first plan stands
    }
    retry.setup.device.memory_bytes = s.device.memory_bytes;
    retry.chosen.setup.device.memory_bytes = s.device.memory_bytes;
    ir::Graph again = out.model.graph;
    apply_mixed_precision(again, loss, retry.chosen, retry.setup, facts, order, capacity);
    if (!retry.chosen.predicted.fits) continue;
    best = std::move(retry);
    mixed = std::move(again);
    if (!placement_line.empty()) out.placement_choice = placement_line;
  }
  out.model.graph = std::move(mixed);
  return best;
}

/// The plan's cluster and processors (`p.predicted` set): where `s` puts its devices, and what
/// sharing them costs (the step of `sched` with `times` and each device computing on its own).
void set_cluster(Plan& p, const Setup& s, const schedule::Schedule& sched,
                 const partition::Solution& sol, const NodeFacts& f,
                 const schedule::StageCosts& times) {
  p.cluster = s.cluster;
  p.processors = s.processors;
  p.processors.separate_step_ms =
      shares_processors(s.processors)
          ? schedule::simulate(sched, s.shape, with_terms(s, sol, f, times), {},
                               schedule::SimDetail::kPeaks)
                    .step_s *
                1e3
          : p.predicted.step_ms;
}

/// PlanOptions::instruction_terms for the plan's shape, into `s` (its microbatch size known).
void set_instruction_terms(Setup& s, const PlanOptions& o) {
  if (!o.instruction_terms) return;
  const std::string key = cost::calibration_key(
      file_hash(o.model_path), s.shape.training, std::string(to_string(s.kind)), s.shape.devices,
      s.shape.chunks, s.shape.microbatches,
      static_cast<long long>(s.microbatch_size * s.shape.microbatches * s.shape.data_parallel));
  cost::TermsChoice choice = o.instruction_terms(key);
  s.profiled_terms = choice.profiled;
  s.terms = choice.calibrated ? *choice.calibrated : choice.profiled;
}

/// plan.json's "instruction_costs": what `s.terms` charged; for a calibration, the step the split
/// simulates with the profiled costs alone too.
PlanInstructionCosts plan_instruction_costs(const Setup& s, const schedule::Schedule& sched,
                                            const partition::Solution& sol, const NodeFacts& f,
                                            const schedule::StageCosts& times) {
  PlanInstructionCosts out;
  if (s.terms.empty()) return out;
  out.source = s.terms.source;
  out.instruction_ms = s.terms.instruction_ms;
  if (out.source != "calibration") return out;
  // The factors this split's stages got: their own ops' where the factors follow the ops.
  out.stage_factors = split_terms(s, sol, f).stage_factors;
  out.op_factors = s.terms.op_factors;
  out.device_start_ms = s.terms.device_start_ms;
  out.trace = s.terms.trace;
  out.measured_step_ms = s.terms.measured_step_ms;
  out.step_overhead_ms = s.terms.step_overhead_ms;
  out.uncalibrated_step_ms =
      schedule::simulate(sched, s.shape, with_terms(s.profiled_terms, times, s.shape.devices),
                         sim_processors(s), schedule::SimDetail::kPeaks)
          .step_s *
      1e3;
  return out;
}

/// The model imported with `import`: from `o.import_cache` when set (a copy), else the file.
ImportedModel imported(const PlanOptions& o, const ImportOptions& import) {
  if (!o.import_cache) return import_model(o.model_path, import);
  std::string key = fmt::format("{}|{}|{}|{}|{}|{}", o.model_path, import.batch.value_or(-1),
                                import.untie_merged_weights, import.training, import.fuse_attention,
                                import.fuse_gelu);
  for (const auto& [name, value] : import.dims) key += fmt::format("|{}={}", name, value);
  auto it = o.import_cache->models.find(key);
  if (it == o.import_cache->models.end())
    it = o.import_cache->models.emplace(key, import_model(o.model_path, import)).first;
  return it->second;
}

/// The stage times the simulation of the chosen split played (`times`), B and W apart, and each
/// stage's own optimizer step, into plan.json's stages.
void record_stage_times(std::vector<Stage>& stages, const schedule::StageCosts& times) {
  for (std::size_t k = 0; k < stages.size(); ++k) {
    stages[k].backward_input_ms = times.backward_input_s[k] * 1e3;
    stages[k].backward_weight_ms = times.backward_weight_s[k] * 1e3;
    const std::vector<double>& optimizer = times.optimizer_stage_s;  // training: one per stage
    stages[k].optimizer_ms = k < optimizer.size() ? optimizer[k] * 1e3 : 0.0;
  }
}

}  // namespace

PlannedModel make_plan(const PlanOptions& o) {
  if (o.data_parallel_auto) return choose_data_parallel(o);
  Setup s = make_setup(o);
  ImportOptions import{.batch = o.batch ? std::optional<int64_t>(s.microbatch_size) : std::nullopt,
                       .dims = o.dims,
                       .untie_merged_weights = o.training && !o.keep_merged,
                       .training = o.training,
                       .fuse_attention = o.fuse_attention,
                       .fuse_gelu = o.fuse_gelu};
  PlannedModel out{imported(o, import), {}, {}, {}, {}};
  out.untie_summary = untie_summary(out.model.untied);
  // Training needs a loss to write a plan (write_plan says so); planning alone (--dry-run, the
  // memory and time of a model without one) goes ahead without.
  if (o.training && (!o.loss.kind.empty() || passes::scalar_output(out.model.graph))) {
    passes::AppendedLoss loss = passes::append_loss(out.model.graph, o.loss);
    out.loss_summary = loss.summary;
    out.plan.training_config = o.training_config;
    // The global batch grows with the replicas; the rate may grow with it (--lr-scaling).
    const double replicas = s.shape.data_parallel;
    const double factor = o.lr_scaling == LrScaling::kLinear ? replicas
                          : o.lr_scaling == LrScaling::kSqrt ? std::sqrt(replicas)
                                                             : 1.0;
    out.plan.training_config.base_lr = o.training_config.lr;
    out.plan.training_config.lr = o.training_config.lr * factor;
    out.plan.training_config.lr_scaling = std::string(to_string(o.lr_scaling));
    out.plan.training_config.loss = o.loss.kind.empty() ? "model" : o.loss.kind;
    out.plan.training_config.loss_output = out.model.graph.value(loss.value).name;
    out.plan.training_config.labels = o.loss.kind.empty() ? "" : o.loss.labels;
  }
  if (o.training)
    prepare_training(out, s, o);
  else
    prepare_inference(out, o);
  const ir::Graph& g = out.model.graph;
  if (g.inputs.empty()) {
    fail(ErrorKind::kModel,
         "{}: the model has no graph inputs (every value is a constant); a pipeline plan feeds "
         "an input per microbatch",
         o.model_path);
  }
  if (!o.batch) {
    // A model with a fixed batch: each microbatch is that batch.
    const ir::Value& first = g.value(g.inputs[0]);
    s.microbatch_size = first.shape.empty() ? 1 : first.shape[0];
    if (s.microbatch_size < 1) {
      fail(ErrorKind::kModel,
           "{}: input '{}' has the fixed shape {}, a batch of 0; a microbatch needs at least one "
           "sample",
           o.model_path, first.name, ir::shape_string(first.shape));
    }
  }
  set_instruction_terms(s, o);
  cost::RooflineCostModel roofline(s.device, s.precision);
  std::unique_ptr<cost::OpCostModel> custom_costs =
      o.cost_model ? o.cost_model(g, roofline) : nullptr;
  if (o.cost_model && !custom_costs)
    fail(ErrorKind::kInternal, "the cost model factory returned no model");
  const cost::OpCostModel& costs = custom_costs ? *custom_costs : roofline;
  auto order = partition::partition_order(g);
  NodeFacts facts = node_facts(g, order, costs, s.precision, s.terms);
  const bool manual = !o.split_after.empty();
  Attempt best = choose_placement(s, g, order, facts, o, out.plan.training_config.loss_output,
                                  out.placement_choice);
  if (is_16bit(s.precision))  // the stage graphs in bfloat16 or float16 (mixed_precision.cpp)
    best = with_mixed_precision(std::move(best), out, s, order, facts, o);
  s = best.setup;
  const partition::GraphProblem& gp = *best.gp;
  const SplitChoice& choice = best.choice;
  Candidate& chosen = best.chosen;
  const int stages = gp.problem.stages;
  if (!chosen.predicted.fits && !o.keep_over_memory) {
    const std::string worst = peak_line(chosen.peaks[chosen.worst_device], chosen.stages);
    const std::string capacity = format_bytes(static_cast<double>(s.device.memory_bytes));
    if (manual) fail(ErrorKind::kPlan, "{}; device has {}", worst, capacity);
    fail(ErrorKind::kPlan,
         "no split into {} stages fits: the best of {} simulated has {}; device has {} ({})",
         stages, choice.candidates, worst, capacity, fit_suggestions(s));
  }
  const partition::Solution& sol = chosen.sol;
  out.stage_of = chosen.stage_of;
  s.shape.shared_groups = chosen.setup.shape.shared_groups;
  out.schedule = chosen.schedule;
  schedule::validate_schedule(out.schedule, s.shape);
  Plan& p = out.plan;
  p.generator = "stagec " STAGECRAFT_VERSION;  // the CMake project's version
  p.model_path = o.model_path;
  p.model_hash = file_hash(o.model_path);
  p.objective = s.objective;
  p.schedule = s.kind;
  p.devices = s.shape.devices;
  p.chunks = s.shape.chunks;
  p.microbatches = s.shape.microbatches;
  p.microbatch_size = s.microbatch_size;
  p.data_parallel = s.shape.data_parallel;
  p.placement = s.placement;
  p.batch = s.microbatch_size * s.shape.microbatches * s.shape.data_parallel;
  p.training = s.shape.training;
  p.optimizer = s.optimizer;
  p.precision = s.precision;
  p.cost_model = costs.name();
  p.device = {s.device.name,          s.device.kind,          s.device.memory_bytes,
              s.device.peak_flops_fp32, s.device.peak_flops_fp16, s.device.memory_bandwidth};
  p.stages = std::move(chosen.stages);
  const schedule::StageCosts times = stage_costs(chosen.setup, chosen.sol, facts, chosen.rc);
  record_stage_times(p.stages, times);
  if ((p.shard_optimizer = s.shard_optimizer)) set_optimizer_shards(p, g, order, sol);
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    Stage& st = p.stages[k];
    st.why = why(sol, k, g, order, gp.problem, manual);
    if (k < choice.bottleneck_cuts.size() && k + 1 < p.stages.size() &&
        choice.bottleneck_cuts[k] != sol.stages[k].last)
      st.why += fmt::format("; the solver's optimum cuts after '{}', but {}",
                            g.node(order[choice.bottleneck_cuts[k]]).name,
                            choice.bottleneck.fits ? "this split simulates a shorter step"
                                                   : "that split leaves a device over its memory");
    if (k < choice.fastest_cuts.size() && k + 1 < p.stages.size() &&
        choice.fastest_cuts[k] != sol.stages[k].last)
      st.why += fmt::format(
          "; the fastest split found cuts after '{}' ({:.3f} ms), but this one's step ({:.3f} ms) "
          "is within 1% of it and its cuts send {} per microbatch instead of {}",
          g.node(order[choice.fastest_cuts[k]]).name, choice.fastest.step_ms,
          choice.tied_step_ms, format_bytes(choice.crossing_bytes),
          format_bytes(choice.fastest_crossing_bytes));
    if (st.recompute) st.why += "; recomputes its activations before the backward";
  }
  for (std::size_t i = 0; i < order.size(); ++i) {
    const ir::Node& node = g.node(order[i]);
    const auto param_bytes = static_cast<int64_t>(weight_state_bytes(
        s, static_cast<double>(facts.params[i]), static_cast<double>(facts.trainable_params[i]),
        static_cast<double>(facts.constant_bytes[i])));
    p.ops.push_back(OpRecord{node.name, node.op_type, out.stage_of[order[i]],
                             facts.time[i].forward_s * 1e3,
                             s.shape.training ? facts.time[i].backward_s * 1e3 : 0.0,
                             facts.flops[i], param_bytes, facts.output_bytes[i]});
  }
  p.predicted = chosen.predicted;
  out.instruction_costs = plan_instruction_costs(s, out.schedule, chosen.sol, facts, times);
  set_cluster(p, s, out.schedule, chosen.sol, facts, times);
  p.device_memory = std::move(chosen.peaks);
  p.timeline = std::move(chosen.timeline);
  p.baseline_parameters = choice.baseline_parameters;
  p.baseline_uniform = choice.baseline_uniform;
  p.search.candidates = choice.candidates;
  p.search.pruned = choice.pruned;
  p.search.bottleneck_step_ms = choice.bottleneck.step_ms;
  p.search.bottleneck_fits = choice.bottleneck.fits;
  p.search.bottleneck_split_after = choice.bottleneck.split_after;
  return out;
}

namespace {

/// How the split search went, in one line.
std::string search_line(const Plan& p) {
  const SplitSearch& search = p.search;
  if (search.bottleneck_split_after.empty() && search.bottleneck_step_ms == 0)
    return fmt::format("  split search: {} candidates simulated (manual split or one stage)",
                       search.candidates);
  const double gain =
      search.bottleneck_step_ms > 0 ? 1 - p.predicted.step_ms / search.bottleneck_step_ms : 0;
  std::string against = gain >= 0 ? fmt::format("{:.1f}% shorter than", 100 * gain)
                                  : fmt::format("{:.1f}% longer than", -100 * gain);
  const std::string pruned =
      search.pruned > 0 ? fmt::format(" ({} more ruled out by a lower bound)", search.pruned) : "";
  return fmt::format(
      "  split search: {} candidates simulated{}; step {} the {}-stage optimum's {:.3f} ms{}",
      search.candidates, pruned, against, p.objective == Objective::kMemory ? "largest" : "slowest",
      search.bottleneck_step_ms, search.bottleneck_fits ? "" : " (which does not fit)");
}

}  // namespace

std::string summarize(const Plan& p) {
  std::string out = fmt::format(
      "{} stages on {} devices ({} schedule, {} microbatches of {}; {}):\n", p.stages.size(),
      p.devices, to_string(p.schedule), p.microbatches, p.microbatch_size, p.cost_model);
  if (p.data_parallel > 1) {
    const int64_t share = p.batch / p.data_parallel;
    out =
        fmt::format(
            "data parallel: {} replicas of a {}-device pipeline, {} devices (replica r on devices "
            "r x {} .. r x {} + {}); global batch {} = {} replicas x {} microbatches x {}: replica "
            "r takes rows [r x {}, (r + 1) x {}) of every batch{}\n",
            p.data_parallel, p.devices, p.data_parallel * p.devices, p.devices, p.devices,
            p.devices - 1, p.batch, p.data_parallel, p.microbatches, p.microbatch_size, share,
            share,
            p.training ? "; each stage's gradients are summed over the replicas (ALLREDUCE) before "
                         "its optimizer step"
                       : "") +
        (p.training && p.training_config.lr_scaling != "none"
             ? fmt::format("learning rate {:g} = {:g} scaled {} by {} replicas\n",
                           p.training_config.lr, p.training_config.base_lr,
                           p.training_config.lr_scaling, p.data_parallel)
             : "") +
        (p.shard_optimizer
             ? fmt::format(
                   "optimizer state sharded over the {} replicas (ZeRO-1): each keeps 1/{} of "
                   "every stage's (its shard of the stage's parameters; shared weights whole); "
                   "ALLREDUCE reduce-scatters the gradients, OPT_STEP updates the shard and "
                   "all-gathers the weights (through the same bucket, no more memory)\n",
                   p.data_parallel, p.data_parallel)
             : "") +
        "each replica: " + out;
  }
  for (const auto& st : p.stages) {
    out += fmt::format(
        "  stage {} on device {}: {} ops, {} params, fwd {:.3f} ms, bwd {:.3f} ms{}{}\n", st.index,
        st.device, st.nodes.size(), st.params, st.fwd_ms, st.bwd_ms,
        p.data_parallel > 1 && p.training
            ? p.shard_optimizer
                  ? fmt::format(", reduce-scatter {:.3f} ms, all-gather {:.3f} ms, optimizer "
                                "shard {} of {} params",
                                st.allreduce_ms, st.allgather_ms,
                                st.optimizer_shards.size() > 1
                                    ? st.optimizer_shards[1] - st.optimizer_shards[0]
                                    : 0,
                                st.optimizer_shards.empty() ? 0 : st.optimizer_shards.back())
                  : fmt::format(", all-reduce {:.3f} ms", st.allreduce_ms)
            : "",
        st.recompute ? " (recompute)" : "");
  }
  out += "predicted peak memory per device (the parts it holds then add up to it):\n";
  for (const DevicePeak& peak : p.device_memory) out += "  " + peak_line(peak, p.stages) + "\n";
  auto line = [](const char* label, const Prediction& pr) {
    return fmt::format("  {:<22} step {:.3f} ms, bubble {:.1f}%, {:.1f} samples/s, peak {}{}\n",
                       label, pr.step_ms, 100 * pr.bubble_fraction, pr.samples_per_s,
                       format_bytes(static_cast<double>(pr.peak_memory_bytes)),
                       pr.fits ? "" : " (does not fit)");
  };
  out += line("predicted:", p.predicted);
  if (const std::string shared = describe_sharing(p); !shared.empty()) out += "  " + shared + "\n";
  out += line("parameter-balanced:", p.baseline_parameters);
  out += line("op-count-balanced:", p.baseline_uniform);
  out += search_line(p) + "\n";
  return out;
}

}  // namespace stagecraft::plan
