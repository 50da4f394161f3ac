// The planner's view of the model and the device: the setup derived from the options, per-node
// facts, the solver's problem and the simulated prediction of a split (planning.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "compiler/plan/planning.h"
#include "compiler/schedule/build_schedule.h"
#include "cost_models/memory.h"
#include "passes/autodiff.h"
#include "passes/passes.h"
#include "runtime/format/error.h"

namespace stagecraft::plan::planning {
namespace {

/// Gradient clipping's part of the optimizer step: the stage's gradients read once for their
/// squares, and the all-reduce of one float over every device of every replica (a tree's
/// 2 log2(N) hops over the slowest link the devices span).
double clip_seconds(const Setup& s, double gradient_bytes) {
  const int all = s.shape.devices * s.shape.data_parallel;
  double allreduce = 0;
  if (all > 1)
    allreduce = 2 * std::ceil(std::log2(all)) *
                cost::transfer_seconds(s.cluster, 0, all - 1, sizeof(float));
  return gradient_bytes / s.device.memory_bandwidth + allreduce;
}

}  // namespace

schedule::StageCosts stage_costs(const Setup& s, const partition::Solution& sol, const NodeFacts& f,
                                 const SimExtras& rc) {
  schedule::StageCosts c;
  for (const auto& st : sol.stages) {
    double fwd = 0, b = 0, w = 0, act = 0;
    for (int i = st.first; i <= st.last; ++i) {
      fwd += f.time[i].forward_s;
      b += f.time[i].backward_input_s;
      w += f.time[i].backward_weight_s;
      act += static_cast<double>(f.output_bytes[i]);
    }
    const SpanWeights held = span_weights(f, st.first, st.last);
    const double stat =
        weight_state_bytes(s, static_cast<double>(held.params), static_cast<double>(held.trainable),
                           static_cast<double>(held.constant_bytes));
    w += accumulate_s(s, static_cast<double>(held.trainable));
    const std::size_t k = c.forward_s.size();
    const bool recompute = s.shape.training && rc.at(k);
    c.forward_s.push_back(fwd);
    // Recomputation re-runs the forward just before the backward (B, which comes first); ZB-H1
    // runs W apart from B, and re-runs it before W too (one microbatch's values at a time).
    const bool split = splits_backward(s, static_cast<int>(k));
    c.backward_input_s.push_back(s.shape.training ? b + (recompute ? fwd : 0.0) : 0.0);
    c.backward_weight_s.push_back(s.shape.training ? w + (recompute && split ? fwd : 0.0) : 0.0);
    c.send_s.push_back(s.shape.training ? st.send_s / 2 : st.send_s);
    // Training keeps each microbatch's stage inputs with its activations until its backward
    // (make_stage). Recomputation keeps only the inputs per microbatch in flight, and one
    // microbatch's full activations (the one being recomputed) while its backward runs.
    const double inputs = k < rc.input_bytes.size() ? rc.input_bytes[k] : 0.0;
    c.activation_bytes.push_back(s.shape.training ? (recompute ? inputs : act + inputs) : 0.0);
    c.static_bytes.push_back(stat);
    c.backward_bytes.push_back(recompute ? act : 0.0);
    c.deferred_bytes.push_back(split && k < rc.deferred_bytes.size() ? rc.deferred_bytes[k] : 0.0);
    c.shared_allreduce_s.push_back(k < rc.shared_exchange_s.size() ? rc.shared_exchange_s[k] : 0.0);
    c.allreduce_s.push_back(k < rc.allreduce_s.size() ? rc.allreduce_s[k] : 0.0);
    c.allreduce_buckets.push_back(k < rc.allreduce_buckets.size() ? rc.allreduce_buckets[k] : 1.0);
    c.allgather_s.push_back(k < rc.allgather_s.size() ? rc.allgather_s[k] : 0.0);
    if (!s.shape.training) continue;
    // Each stage's optimizer step streams its own weights, gradients and state once
    // (memory-bound; ZeRO-1: 1/R of them), on its own device.
    const double shards = s.shard_optimizer ? s.shape.data_parallel : 1;
    double optimizer = stat / shards / s.device.memory_bandwidth;
    if (s.clips_gradients)
      optimizer += clip_seconds(s, 4.0 * static_cast<double>(held.trainable) / shards);
    c.optimizer_stage_s.push_back(optimizer);
  }
  return c;
}

namespace {

/// --devices-per-processor (else the cluster's) and --processor-overlap into `s`, checked with
/// the flag named.
void set_processors(const PlanOptions& o, Setup& s) {
  const int devices = s.shape.devices;
  if (o.devices_per_processor) {
    const int k = *o.devices_per_processor;
    if (k < 1 || k > devices)
      fail(ErrorKind::kUsage,
           "--devices-per-processor {} must be from 1 to the pipeline's {} device{}", k, devices,
           devices == 1 ? "" : "s");
    s.cluster.devices_per_processor = k;
  }
  // A cluster file's K is what its machines have; a smaller pipeline has as many per processor.
  s.cluster.devices_per_processor = std::min(s.cluster.devices_per_processor, devices);
  if (s.cluster.devices_per_processor > 1 && s.shape.data_parallel > 1)
    fail(ErrorKind::kUsage,
         "{} devices per processor with --data-parallel {}: devices that share a processor are "
         "planned for one pipeline only (use --data-parallel 1)",
         s.cluster.devices_per_processor, s.shape.data_parallel);
  if (!(o.processor_overlap >= 0 && o.processor_overlap < 1))
    fail(ErrorKind::kUsage, "--processor-overlap {} must be in [0, 1)", o.processor_overlap);
  s.processors.processor_of = processor_of_devices(devices, s.cluster.devices_per_processor);
  s.processors.overlap = o.processor_overlap;
}

}  // namespace

Setup make_setup(const PlanOptions& o) {
  Setup s;
  s.objective = o.objective;
  s.keep_over_memory = o.keep_over_memory;
  s.prune_split_search = o.prune_split_search;
  if (o.devices < 1) fail(ErrorKind::kUsage, "--devices {} must be at least 1", o.devices);
  const int replicas = o.data_parallel;
  if (replicas < 1) fail(ErrorKind::kUsage, "--data-parallel {} must be at least 1", replicas);
  if (o.devices % replicas != 0)
    fail(ErrorKind::kUsage,
         "--devices {} is not divisible by --data-parallel {}: each replica runs a pipeline of "
         "the same number of devices",
         o.devices, replicas);
  const int pipeline_devices = o.devices / replicas;
  if (o.shard_optimizer && (!o.training || replicas < 2))
    fail(ErrorKind::kUsage,
         "--shard-optimizer shards the optimizer state across data-parallel replicas: it needs "
         "--train and --data-parallel R with R >= 2 (got {}{})",
         o.training ? "" : "no --train, ", fmt::format("--data-parallel {}", replicas));
  s.shard_optimizer = o.shard_optimizer;
  const double clip = o.training_config.clip_grad_norm;
  if (clip != 0 && (!o.training || !std::isfinite(clip) || clip < 0))
    fail(ErrorKind::kUsage, "--clip-grad-norm {}: {}", clip,
         o.training ? "must be a finite number > 0"
                    : "clips a training plan's gradients: add --train");
  s.clips_gradients = o.training && clip > 0;
  s.kind = o.schedule.value_or(o.training ? ScheduleKind::k1F1B : ScheduleKind::kInference);
  if (!o.schedule_csv.empty()) {
    if (o.schedule && *o.schedule != ScheduleKind::kCustom)
      fail(ErrorKind::kUsage, "--schedule {} and --schedule-csv: give one of them",
           to_string(*o.schedule));
    s.kind = ScheduleKind::kCustom;
    s.custom = schedule::read_torch_csv_file(o.schedule_csv);
    s.custom_source = o.schedule_csv;
  } else if (s.kind == ScheduleKind::kCustom) {
    fail(ErrorKind::kUsage, "--schedule custom reads its order from a file: give --schedule-csv "
                            "FILE (torch.distributed.pipelining's CSV) instead");
  }
  // A custom schedule's file says how many chunks and microbatches it runs.
  // Interleaved runs 2 unless --chunks says otherwise; zb-v always 2, the others 1.
  const int fixed = schedule::fixed_chunks(s.kind);
  int chunks = o.chunks > 0 ? o.chunks : s.custom ? s.custom->chunks : (fixed > 0 ? fixed : 2);
  if (o.chunks < 0) fail(ErrorKind::kUsage, "--chunks {} must be at least 1", o.chunks);
  int m = o.microbatches > 0 ? o.microbatches
          : s.custom         ? s.custom->microbatches
                             : pipeline_devices;
  if (o.microbatches < 0)
    fail(ErrorKind::kUsage, "--microbatches {} must be at least 1", o.microbatches);
  s.shape = schedule::PipelineShape{pipeline_devices, chunks, m, o.training, replicas};
  s.shape.placement = schedule::placement_of(s.kind);
  if (o.batch) {
    if (*o.batch < 1) fail(ErrorKind::kUsage, "--batch {} must be at least 1", *o.batch);
    // Not given, the microbatch count is the pipeline's device count: say so, and what to give.
    const std::string count =
        o.microbatches > 0 ? fmt::format("--microbatches {}", m)
        : s.custom
            ? fmt::format("the {} microbatches of --schedule-csv {}", m, o.schedule_csv)
            : fmt::format("{} microbatches (the default: one per pipeline device; give "
                          "--microbatches M with M dividing the batch)",
                          m);
    if (replicas == 1 && *o.batch % m != 0)
      fail(ErrorKind::kUsage,
           "--batch {} is not divisible by {}: each microbatch must be the same size", *o.batch,
           count);
    if (*o.batch % (static_cast<int64_t>(replicas) * m) != 0) {
      fail(ErrorKind::kUsage,
           "--batch {} is not divisible by --data-parallel {} x {} = {}: every replica's "
           "microbatches must be the same size",
           *o.batch, replicas, count, static_cast<int64_t>(replicas) * m);
    }
    s.microbatch_size = *o.batch / (static_cast<int64_t>(replicas) * m);
  }
  // The schedule rules (runtime/format/schedule.h), with the flag named.
  with_context(fmt::format("--schedule {}", to_string(s.kind)), ErrorKind::kUsage,
               [&] { check_schedule_shape(s.kind, s.shape, ErrorKind::kUsage); });
  s.optimizer = o.training ? o.optimizer : OptimizerKind::kNone;
  s.precision = o.precision;
  s.recompute = o.training ? o.recompute : Recompute::kNone;
  if (o.recompute != Recompute::kNone && !o.training) {
    fail(ErrorKind::kUsage, "--recompute {} needs --train: inference keeps no activations",
         to_string(o.recompute));
  }
  // The schedule's own counts: the order of its forwards and backwards does not depend on the
  // split (shared weights add only step-level exchanges).
  // A custom schedule is checked against the shape here, before any costing, and once more
  // with each split's shared-weight exchanges (setup_schedule).
  if (s.custom) setup_schedule(s);
  if (s.shape.training) s.in_flight = schedule::stage_in_flight_peaks(setup_schedule(s), s.shape);
  s.device = cost::device_spec_from_name_or_file(o.device_spec);
  s.cluster = o.cluster.empty() ? cost::default_cluster(s.device.name)
                                : cost::cluster_spec_from_name_or_file(o.cluster);
  s.placement = pipeline_major_placement(s.shape.data_parallel, s.shape.devices);
  set_processors(o, s);
  return s;
}

schedule::Schedule setup_schedule(const Setup& s) {
  if (s.custom) return schedule::check_torch_csv(*s.custom, s.shape, s.custom_source);
  return schedule::build_schedule(s.kind, s.shape);
}

bool splits_backward(const Setup& s, int stage) {
  if (s.kind == ScheduleKind::kZBH1 || s.kind == ScheduleKind::kZBV) return true;
  // DualPipeV splits some backwards of every stage (its zero-bubble steps), except stage 1 of a
  // single device, whose backwards are all full (dualpipev_test.cpp checks it).
  if (s.kind == ScheduleKind::kDualPipeV) return !(s.shape.devices == 1 && stage == 1);
  if (!s.custom || s.shape.devices < 1) return false;
  const auto& device = s.custom->order.at(static_cast<size_t>(stage % s.shape.devices));
  return std::any_of(device.begin(), device.end(), [&](const schedule::Instruction& in) {
    return in.stage == stage && in.op == schedule::Op::kBackwardInput;
  });
}

schedule::Processors sim_processors(const Setup& s) {
  if (!shares_processors(s.processors)) return {};
  return {s.processors.processor_of, s.processors.overlap};
}

std::string fit_suggestions(const Setup& s) {
  std::vector<std::string> ways{"more devices"};
  if (s.shape.training && s.recompute != Recompute::kAll && s.recompute != Recompute::kAuto)
    ways.push_back("--recompute auto");
  if (s.precision == Precision::kFp32) ways.push_back("--precision mixed");
  if (s.shape.training && s.optimizer != OptimizerKind::kSgd) ways.push_back("a lighter --optimizer");
  if (s.shape.microbatches > 1) ways.push_back("fewer --microbatches");
  // GPipe keeps every microbatch's values until the backwards, interleaved more than 1F1B.
  if (s.shape.training && s.shape.microbatches > 1 &&
      (s.kind == ScheduleKind::kGPipe || s.kind == ScheduleKind::kInterleaved))
    ways.push_back("--schedule 1f1b (fewer microbatches in flight)");
  std::string out = "use ";
  for (std::size_t k = 0; k < ways.size(); ++k)
    out += (k == 0 ? "" : k + 1 == ways.size() ? ", or " : ", ") + ways[k];
  return out;
}

int rank_of(const Setup& s, int replica, int device) {
  const auto g = static_cast<size_t>(replica * s.shape.devices + device);
  if (replica < 0 || device < 0 || device >= s.shape.devices || g >= s.placement.size())
    fail(ErrorKind::kInternal,
         "rank_of: replica {}, device {} of a placement of {} ranks ({} devices)", replica, device,
         s.placement.size(), s.shape.devices);
  return s.placement[g];
}

NodeFacts node_facts(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                     const cost::OpCostModel& costs, Precision precision,
                     const cost::InstructionTerms& terms) {
  // Mixed precision keeps activations in 16 bits whatever dtype the exporter wrote.
  const int64_t float_bytes_divisor = is_16bit(precision) ? 2 : 1;
  NodeFacts f;
  std::vector<bool> counted(g.num_values(), false);
  std::vector<bool> trainable(g.num_values(), false);
  for (ir::ValueId v : passes::trainable_weights(g, order)) trainable[v] = true;
  std::vector<int> last_read(g.num_values(), -1);  // position of each weight's latest read
  for (ir::NodeId id : order) {
    const int position = static_cast<int>(f.time.size());
    const ir::Node& node = g.node(id);
    f.time.push_back(costs.op_time(g, node));
    if (terms.follows_ops()) f.factors.push_back(terms.factors_of(node.name, node.op_type));
    int64_t params = 0, trained = 0, constants = 0;
    f.weights_read.emplace_back();
    for (ir::ValueId in : node.inputs) {
      if (in == ir::kNoId || !g.value(in).is_initializer()) continue;
      const ir::Value& v = g.value(in);
      const int64_t constant_bytes = v.is_weight ? 0 : v.bytes();
      f.weights_read.back().push_back(
          {in, v.is_weight ? v.numel() : 0, trainable[in], constant_bytes, last_read[in]});
      last_read[in] = position;
      if (counted[in]) continue;
      counted[in] = true;
      params += v.is_weight ? v.numel() : 0;
      trained += trainable[in] ? v.numel() : 0;
      constants += constant_bytes;
    }
    f.params.push_back(params);
    f.trainable_params.push_back(trained);
    f.constant_bytes.push_back(constants);
    int64_t out = 0;
    // Every output a training forward keeps for the backward: the runtime keeps each value whose
    // bytes the backward reads, whatever its type (a Dropout's bool mask is a quarter of its
    // float output's bytes), and no other. In 16 bits, but for the float operands the
    // mixed-precision pass keeps in float32: every one of a node it keeps in float32
    // (passes::needs_float32: the loss, BatchNormalization before opset 15), and those of a
    // fused op or BatchNormalization it does not name (passes::sixteen_bit_operands: Attention's
    // mask and log-sum-exp, BatchNormalization's running statistics). Such an output stays
    // float32, with a 16-bit copy for 16-bit readers; such an input of a 16-bit producer is read
    // through a float32 copy (but a loss's 16-bit scores).
    const bool sixteen = float_bytes_divisor > 1;
    const bool float32_node = sixteen && passes::needs_float32(g, node);
    const passes::SixteenBitOperands* fused =
        sixteen ? passes::sixteen_bit_operands(g, node) : nullptr;
    auto is_float = [&](ir::ValueId v) {
      const DType d = g.value(v).dtype;
      return d == DType::kFloat32 || d == DType::kFloat64;
    };
    for (std::size_t k = 0; k < node.outputs.size(); ++k) {
      const ir::ValueId v = node.outputs[k];
      if (v == ir::kNoId || !passes::backward_reads_bytes(g, v)) continue;
      if (dtype_size(g.value(v).dtype) <= 0) continue;
      if (!is_float(v)) {
        out += g.value(v).bytes();
      } else if (!float32_node && (!fused || fused->output(k))) {
        out += g.value(v).bytes() / float_bytes_divisor;
      } else {
        out += g.value(v).bytes();
        const auto& readers = g.value(v).consumers;
        if (std::any_of(readers.begin(), readers.end(),
                        [&](ir::NodeId r) { return !passes::needs_float32(g, g.node(r)); }))
          out += g.value(v).bytes() / float_bytes_divisor;
      }
    }
    // A loss on 16-bit scores reads them as they are (passes::reads_sixteen_bit_scores): the
    // backward keeps the producer's 16-bit output, counted with it, and no float32 copy.
    const bool sixteen_bit_scores = sixteen && passes::reads_sixteen_bit_scores(g, node);
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      const ir::ValueId in = node.inputs[k];
      const bool float32_input =
          (float32_node || (fused && !fused->input(k))) && !(k == 0 && sixteen_bit_scores);
      if (!float32_input || in == ir::kNoId || g.value(in).is_initializer() || !is_float(in) ||
          g.value(in).producer == ir::kNoId ||
          passes::needs_float32(g, g.node(g.value(in).producer)) ||
          !passes::backward_reads_bytes(g, in))
        continue;
      out += g.value(in).bytes();
    }
    f.output_bytes.push_back(out);
    f.flops.push_back(cost::forward_work(g, node).flops);
  }
  return f;
}

/// Parameters a stage of positions [first, last] holds: every weight its nodes read, once
/// (a weight shared with other stages counts in each of them).
SpanWeights span_weights(const NodeFacts& f, int first, int last) {
  SpanWeights out;
  for (int i = first; i <= last; ++i)
    for (const WeightRead& w : f.weights_read[i]) {
      if (w.previous >= first) continue;  // read before in the span: counted there
      out.params += w.elements;
      out.trainable += w.trainable ? w.elements : 0;
      out.constant_bytes += w.constant_bytes;
    }
  return out;
}

double weight_state_bytes(const Setup& s, double params, double trainable, double constant_bytes) {
  const bool training = s.shape.training;
  // ZeRO-1: a replica keeps 1/R of the optimizer state.
  const double optimizer_share = s.shard_optimizer ? 1.0 / s.shape.data_parallel : 1.0;
  const double state =
      training
          ? cost::gradient_bytes_per_param(s.precision) +
                cost::optimizer_state_bytes_per_param(s.optimizer, s.precision) * optimizer_share
          : 0.0;
  return params * cost::weight_bytes_per_param(s.precision, training) + trainable * state +
         constant_bytes;
}

/// Microbatches whose activations global stage `k` keeps at once (1 for inference, which keeps
/// none for a backward).
double in_flight(const Setup& s, int k) {
  if (!s.shape.training) return 1;
  return static_cast<double>(std::max<int64_t>(1, s.in_flight.at(k)));
}

partition::GraphProblem build_problem(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                                      const Setup& s, const NodeFacts& facts) {
  bool training = s.shape.training;
  std::vector<partition::PositionCost> costs;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto& t = facts.time[i];
    costs.push_back({t.forward_s + (training ? t.backward_s : 0.0),
                     weight_state_bytes(s, static_cast<double>(facts.params[i]),
                                        static_cast<double>(facts.trainable_params[i]),
                                        static_cast<double>(facts.constant_bytes[i])),
                     training ? static_cast<double>(facts.output_bytes[i]) : 0.0});
  }
  auto gp = partition::make_graph_problem(g, order, std::move(costs));
  auto& p = gp.problem;
  p.stages = schedule::stage_count(s.shape);
  p.objective = s.objective;
  const int devices = s.shape.devices;
  // A stage sends activations forward and, in training, receives as many gradient bytes back;
  // every replica over its own link, the slowest setting the pace. Between two devices on one
  // processor it is a copy in the processor's memory.
  p.send_time = [s, devices, training](int k, double bytes) {
    const int from = schedule::device_of_stage(k, s.shape),
              to = schedule::device_of_stage(k + 1, s.shape);
    const std::vector<int>& processor = s.processors.processor_of;
    if (from != to && static_cast<size_t>(devices) == processor.size() &&
        processor[from] == processor[to]) {
      const double t = cost::local_copy_seconds(s.cluster, s.device.memory_bandwidth, bytes);
      return training ? 2 * t : t;
    }
    double t = 0;
    for (int r = 0; r < s.shape.data_parallel; ++r)
      t = std::max(
          t, cost::transfer_seconds(s.cluster, rank_of(s, r, from), rank_of(s, r, to), bytes));
    return training ? 2 * t : t;
  };
  p.in_flight = [s](int k) { return in_flight(s, k); };
  // Each stage alone within the whole device: not stricter than the check of the device's
  // stages together, which every candidate split gets (SplitEvaluator).
  const auto capacity = static_cast<double>(s.device.memory_bytes);
  p.capacity_bytes = [capacity](int) { return capacity; };
  p.recompute = s.recompute != Recompute::kNone;
  return gp;
}

/// Adding one microbatch's weight gradients into the step's sums: read both, write one (fp32),
/// memory-bound. Part of every backward's W.
double accumulate_s(const Setup& s, double params) {
  return s.shape.training ? 3.0 * 4.0 * params / s.device.memory_bandwidth : 0.0;
}

schedule::StageCosts with_terms(const cost::InstructionTerms& terms, schedule::StageCosts c,
                                int devices) {
  using schedule::Op;
  if (terms.empty()) return c;
  const std::size_t stages = c.forward_s.size();
  for (std::size_t k = 0; k < stages; ++k) {
    const int stage = static_cast<int>(k);
    c.forward_s[k] *= terms.factor(stage, Op::kForward);
    // A stage runs either full backwards (BWD) or B and W apart: each has its own factor.
    const bool split = terms.factor(stage, Op::kBackwardInput) != 1.0 ||
                       terms.factor(stage, Op::kBackwardWeight) != 1.0;
    if (k < c.backward_input_s.size())
      c.backward_input_s[k] *= terms.factor(stage, split ? Op::kBackwardInput : Op::kBackward);
    if (k < c.backward_weight_s.size())
      c.backward_weight_s[k] *= terms.factor(stage, split ? Op::kBackwardWeight : Op::kBackward);
  }
  for (std::size_t k = 0; k < c.optimizer_stage_s.size(); ++k)  // training: one per stage
    c.optimizer_stage_s[k] *= terms.factor(static_cast<int>(k), Op::kOptimizerStep);
  if (!terms.device_start_ms.empty()) {
    c.device_start_s.assign(static_cast<std::size_t>(devices), 0.0);
    for (int d = 0; d < devices && d < static_cast<int>(terms.device_start_ms.size()); ++d)
      c.device_start_s[static_cast<std::size_t>(d)] =
          terms.device_start_ms[static_cast<std::size_t>(d)] * 1e-3;
  }
  c.instruction_s.assign(schedule::kInstructionKinds, 0.0);
  for (std::size_t i = 0; i < schedule::kInstructionKinds; ++i)
    c.instruction_s[i] = terms.fixed_ms(static_cast<Op>(i)) * 1e-3;
  c.step_overhead_s = terms.step_overhead_ms * 1e-3;
  return c;
}

cost::InstructionTerms split_terms(const Setup& s, const partition::Solution& sol,
                                   const NodeFacts& f) {
  if (!s.terms.follows_ops() || f.factors.empty()) return s.terms;
  std::vector<cost::StageFactorSum> stages(sol.stages.size());
  for (std::size_t k = 0; k < sol.stages.size(); ++k)
    for (int i = sol.stages[k].first; i <= sol.stages[k].last; ++i)
      stages[k].add(f.factors[i], f.time[i].forward_s, f.time[i].backward_input_s,
                    f.time[i].backward_weight_s);
  return s.terms.for_split(stages);
}

schedule::StageCosts with_terms(const Setup& s, const partition::Solution& sol, const NodeFacts& f,
                                schedule::StageCosts raw) {
  // Without factors that follow the ops, no copy of the terms (the split search calls this for
  // every split it bounds).
  if (!s.terms.follows_ops() || f.factors.empty())
    return with_terms(s.terms, std::move(raw), s.shape.devices);
  return with_terms(split_terms(s, sol, f), std::move(raw), s.shape.devices);
}

Prediction predict(const Setup& s, const schedule::Schedule& sched, const partition::Solution& sol,
                   const NodeFacts& f, const ir::Graph& g, const std::vector<ir::NodeId>& order,
                   int64_t batch, const std::vector<Stage>& stages, const SimExtras& rc,
                   std::vector<schedule::TimelineEvent>* timeline, std::vector<DevicePeak>* peaks,
                   const schedule::PreparedSchedule* prepared) {
  const schedule::StageCosts costs = with_terms(s, sol, f, stage_costs(s, sol, f, rc));
  const schedule::SimDetail detail =
      timeline ? schedule::SimDetail::kFull : schedule::SimDetail::kPeaks;
  auto sim = prepared ? schedule::simulate(*prepared, costs, sim_processors(s), detail)
                      : schedule::simulate(sched, s.shape, costs, sim_processors(s), detail);
  Prediction p;
  p.step_ms = sim.step_s * 1e3;
  p.bubble_fraction = sim.bubble_fraction;
  p.samples_per_s = sim.samples_per_s(static_cast<int>(batch));
  for (double b : sim.device_busy_s) p.device_busy_ms.push_back(b * 1e3);
  std::vector<DevicePeak> device = schedule::device_peaks(sim, stages, s.shape.devices);
  schedule::set_peaks(p, device);
  if (peaks) *peaks = std::move(device);
  if (timeline) *timeline = std::move(sim.events);
  for (std::size_t k = 0; k + 1 < sol.stages.size(); ++k)
    p.split_after.push_back(g.node(order[sol.stages[k].last]).name);
  p.fits = sol.feasible;
  return p;
}

}  // namespace stagecraft::plan::planning
