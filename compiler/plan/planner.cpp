#include "compiler/plan/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "compiler/model_info.h"
#include "compiler/partition/graph_problem.h"
#include "compiler/partition/search.h"
#include "compiler/plan/device_memory.h"
#include "compiler/plan/stage_files.h"
#include "compiler/schedule/build_schedule.h"
#include "compiler/schedule/simulator.h"
#include "cost_models/cluster.h"
#include "cost_models/device_spec.h"
#include "cost_models/memory.h"
#include "cost_models/op_cost.h"
#include "cost_models/roofline.h"
#include "passes/autodiff.h"
#include "runtime/format/error.h"
#include "runtime/format/memory_plan.h"

namespace stagecraft::plan {
namespace {

/// Everything the planner derives from the options once.
struct Setup {
  ScheduleKind kind;
  schedule::PipelineShape shape;
  OptimizerKind optimizer;
  Precision precision;
  cost::DeviceSpec device;
  cost::ClusterSpec cluster;
  int64_t microbatch_size = 1;
  /// Per stage: the most microbatches whose activations it holds at once under the schedule
  /// (schedule::stage_in_flight_peaks; an interleaved device's chunks differ).
  std::vector<int64_t> in_flight;
};

/// Per-node numbers in topological position order.
struct NodeFacts {
  std::vector<cost::OpTime> time;
  std::vector<int64_t> params;        ///< Weights first read by this node.
  /// Every weight this node reads (value, elements): a stage holds each weight its nodes read,
  /// so a weight read in several stages counts in each (span_params).
  std::vector<std::vector<std::pair<ir::ValueId, int64_t>>> weights_read;
  std::vector<int64_t> output_bytes;  ///< Floating outputs: kept for backward.
  std::vector<double> flops;
};

Setup make_setup(const PlanOptions& o) {
  Setup s;
  if (o.devices < 1) fail(ErrorKind::kUsage, "--devices {} must be at least 1", o.devices);
  if (o.objective != "speed" && o.objective != "memory") {
    fail(ErrorKind::kUsage, "--objective '{}' is not one of: speed, memory", o.objective);
  }
  std::string sched = o.schedule.empty() ? (o.training ? "1f1b" : "inference") : o.schedule;
  s.kind = parse_schedule(sched);
  if (o.training && s.kind == ScheduleKind::kInference) {
    fail(
        ErrorKind::kUsage,
        "--schedule inference runs forward only; training needs gpipe, 1f1b, interleaved or zb-h1");
  }
  if (!o.training && s.kind != ScheduleKind::kInference) {
    fail(ErrorKind::kUsage,
         "--schedule {} is a training schedule; add --train, or use --schedule inference", sched);
  }
  int chunks = o.chunks > 0 ? o.chunks : (s.kind == ScheduleKind::kInterleaved ? 2 : 1);
  if (o.chunks < 0) fail(ErrorKind::kUsage, "--chunks {} must be at least 1", o.chunks);
  if (chunks != 1 && s.kind != ScheduleKind::kInterleaved) {
    fail(ErrorKind::kUsage, "--chunks {} needs --schedule interleaved", chunks);
  }
  int m = o.microbatches > 0 ? o.microbatches : o.devices;
  if (o.microbatches < 0)
    fail(ErrorKind::kUsage, "--microbatches {} must be at least 1", o.microbatches);
  s.shape = schedule::PipelineShape{o.devices, chunks, m, o.training};
  if (o.batch) {
    if (*o.batch < 1) fail(ErrorKind::kUsage, "--batch {} must be at least 1", *o.batch);
    if (*o.batch % m != 0) {
      fail(
          ErrorKind::kUsage,
          "--batch {} is not divisible by --microbatches {}: each microbatch must be the same size",
          *o.batch, m);
    }
    s.microbatch_size = *o.batch / m;
  }
  s.optimizer = o.training ? parse_optimizer(o.optimizer) : OptimizerKind::kNone;
  s.precision = parse_precision(o.precision);
  if (o.recompute != "none" && o.recompute != "all" && o.recompute != "auto") {
    fail(ErrorKind::kUsage, "--recompute '{}' is not one of: none, all, auto", o.recompute);
  }
  if (o.recompute != "none" && !o.training) {
    fail(ErrorKind::kUsage, "--recompute {} needs --train: inference keeps no activations",
         o.recompute);
  }
  // The schedule's own counts: the order of its forwards and backwards does not depend on the
  // split (shared weights add only step-level exchanges).
  if (s.shape.training)
    s.in_flight =
        schedule::stage_in_flight_peaks(schedule::build_schedule(s.kind, s.shape), s.shape);
  s.device = cost::device_spec_from_name_or_file(o.device_spec);
  s.cluster = o.cluster.empty() ? cost::default_cluster(s.device.name)
                                : cost::cluster_spec_from_name_or_file(o.cluster);
  return s;
}

NodeFacts node_facts(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                     const cost::OpCostModel& costs, Precision precision) {
  // Mixed precision keeps activations in 16 bits whatever dtype the exporter wrote.
  const int64_t float_bytes_divisor = precision == Precision::kMixed ? 2 : 1;
  NodeFacts f;
  std::vector<bool> counted(g.num_values(), false);
  for (ir::NodeId id : order) {
    const ir::Node& node = g.node(id);
    f.time.push_back(costs.op_time(g, node));
    int64_t params = 0;
    f.weights_read.emplace_back();
    for (ir::ValueId in : node.inputs) {
      if (in == ir::kNoId || !g.value(in).is_weight) continue;
      f.weights_read.back().emplace_back(in, g.value(in).numel());
      if (counted[in]) continue;
      counted[in] = true;
      params += g.value(in).numel();
    }
    f.params.push_back(params);
    int64_t out = 0;
    for (ir::ValueId v : node.outputs) {
      if (v == ir::kNoId) continue;
      DType d = g.value(v).dtype;
      if (!is_floating(d)) continue;
      bool wide = d == DType::kFloat32 || d == DType::kFloat64;
      out += wide ? g.value(v).bytes() / float_bytes_divisor : g.value(v).bytes();
    }
    f.output_bytes.push_back(out);
    f.flops.push_back(cost::forward_work(g, node).flops);
  }
  return f;
}

/// Parameters a stage of positions [first, last] holds: every weight its nodes read, once
/// (a weight shared with other stages counts in each of them).
int64_t span_params(const NodeFacts& f, int first, int last) {
  std::vector<ir::ValueId> seen;
  int64_t params = 0;
  for (int i = first; i <= last; ++i)
    for (const auto& [weight, elements] : f.weights_read[i]) {
      if (std::find(seen.begin(), seen.end(), weight) != seen.end()) continue;
      seen.push_back(weight);
      params += elements;
    }
  return params;
}

double bytes_per_param(const Setup& s) {
  bool training = s.shape.training;
  return cost::weight_bytes_per_param(s.precision, training) +
         (training ? cost::gradient_bytes_per_param(s.precision) : 0.0) +
         cost::optimizer_state_bytes_per_param(s.optimizer, s.precision);
}

/// Microbatches whose activations global stage `k` keeps at once (1 for inference, which keeps
/// none for a backward).
double in_flight(const Setup& s, int k) {
  if (!s.shape.training) return 1;
  return static_cast<double>(std::max<int64_t>(1, s.in_flight.at(k)));
}

partition::GraphProblem build_problem(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                                      const Setup& s, const NodeFacts& facts,
                                      const PlanOptions& o) {
  double per_param = bytes_per_param(s);
  bool training = s.shape.training;
  std::vector<partition::PositionCost> costs;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto& t = facts.time[i];
    costs.push_back({t.forward_s + (training ? t.backward_s : 0.0),
                     static_cast<double>(facts.params[i]) * per_param,
                     training ? static_cast<double>(facts.output_bytes[i]) : 0.0});
  }
  auto gp = partition::make_graph_problem(g, order, std::move(costs));
  auto& p = gp.problem;
  p.stages = schedule::stage_count(s.shape);
  p.objective = o.objective == "memory" ? Objective::kMemory : Objective::kSpeed;
  const int devices = s.shape.devices;
  const cost::ClusterSpec cluster = s.cluster;
  // A stage sends activations forward and, in training, receives as many gradient bytes back.
  p.send_time = [cluster, devices, training](int k, double bytes) {
    double t = cost::transfer_seconds(cluster, k % devices, (k + 1) % devices, bytes);
    return training ? 2 * t : t;
  };
  p.in_flight = [s](int k) { return in_flight(s, k); };
  // Each stage alone within the whole device: not stricter than the check of the device's
  // stages together, which every candidate split gets (SplitEvaluator).
  const auto capacity = static_cast<double>(s.device.memory_bytes);
  p.capacity_bytes = [capacity](int) { return capacity; };
  p.recompute = training && o.recompute != "none";
  return gp;
}

/// Positions after which the named nodes end a stage (manual split points).
std::vector<int> split_positions(const ir::Graph& g, const partition::GraphProblem& gp,
                                 const std::vector<std::string>& names) {
  std::vector<int> cuts;
  for (const auto& name : names) {
    int pos = -1;
    for (std::size_t i = 0; i < gp.order.size(); ++i) {
      if (g.node(gp.order[i]).name == name) pos = static_cast<int>(i);
    }
    if (pos < 0) fail(ErrorKind::kUsage, "--split-after '{}' names no node of the model", name);
    if (pos + 1 >= static_cast<int>(gp.order.size())) {
      fail(ErrorKind::kUsage,
           "--split-after '{}' is the last op: the stage after it would be empty", name);
    }
    if (std::find(cuts.begin(), cuts.end(), pos) != cuts.end()) {
      fail(ErrorKind::kUsage, "--split-after '{}' is given twice", name);
    }
    cuts.push_back(pos);
  }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

/// Cuts that balance a per-position weight (parameters, or 1 per op) over the stages: the
/// baselines DeepSpeed calls 'parameters' and 'uniform'.
std::vector<int> balanced_cuts(const std::vector<double>& weight, int stages) {
  const auto n = static_cast<int>(weight.size());
  double total = 0;
  for (double w : weight) total += w;
  std::vector<int> cuts;
  double acc = 0;
  int pos = 0;
  for (int k = 1; k < stages; ++k) {
    double target = total * k / stages;
    while (pos < n && acc + weight[pos] <= target) acc += weight[pos++];
    // Each remaining stage needs an op of its own.
    int cut = std::clamp(pos - 1, cuts.empty() ? 0 : cuts.back() + 1, n - 1 - (stages - k));
    cuts.push_back(cut);
    while (pos <= cut) acc += weight[pos++];
  }
  return cuts;
}

/// Per stage of the plan: whether it recomputes, and the bytes of its inputs per microbatch
/// (what it keeps per microbatch in flight when it does). Empty: no stage recomputes.
struct Recompute {
  std::vector<bool> on;
  std::vector<double> input_bytes;
  /// Per stage: what a split backward holds from B to W (stage_files.h deferred_bytes).
  std::vector<double> deferred_bytes;
  /// Per stage: the step's exchange of its shared weights' gradients (Stage::shared_exchange_ms).
  std::vector<double> shared_exchange_s;
  bool at(std::size_t k) const { return k < on.size() && on[k]; }
};

/// Adding one microbatch's weight gradients into the step's sums: read both, write one (fp32),
/// memory-bound. Part of every backward's W.
double accumulate_s(const Setup& s, double params) {
  return s.shape.training ? 3.0 * 4.0 * params / s.device.memory_bandwidth : 0.0;
}

schedule::StageCosts stage_costs(const Setup& s, const partition::Solution& sol, const NodeFacts& f,
                                 const Recompute& rc = {}) {
  schedule::StageCosts c;
  double per_param = bytes_per_param(s);
  double optimizer_bytes = 0;
  for (const auto& st : sol.stages) {
    double fwd = 0, b = 0, w = 0, act = 0;
    for (int i = st.first; i <= st.last; ++i) {
      fwd += f.time[i].forward_s;
      b += f.time[i].backward_input_s;
      w += f.time[i].backward_weight_s;
      act += static_cast<double>(f.output_bytes[i]);
    }
    const auto params = static_cast<double>(span_params(f, st.first, st.last));
    const double stat = params * per_param;
    w += accumulate_s(s, params);
    const std::size_t k = c.forward_s.size();
    const bool recompute = s.shape.training && rc.at(k);
    c.forward_s.push_back(fwd);
    // Recomputation re-runs the forward just before the backward (B, which comes first); ZB-H1
    // runs W apart from B, and re-runs it before W too (one microbatch's values at a time).
    const bool split = s.kind == ScheduleKind::kZBH1;
    c.backward_input_s.push_back(s.shape.training ? b + (recompute ? fwd : 0.0) : 0.0);
    c.backward_weight_s.push_back(s.shape.training ? w + (recompute && split ? fwd : 0.0) : 0.0);
    c.send_s.push_back(s.shape.training ? st.send_s / 2 : st.send_s);
    // Recomputation keeps the stage inputs per microbatch in flight, and one microbatch's full
    // activations (the one being recomputed) while its backward runs.
    c.activation_bytes.push_back(s.shape.training ? (recompute ? rc.input_bytes[k] : act) : 0.0);
    c.static_bytes.push_back(stat);
    c.backward_bytes.push_back(recompute ? act : 0.0);
    c.deferred_bytes.push_back(split && k < rc.deferred_bytes.size() ? rc.deferred_bytes[k] : 0.0);
    c.shared_allreduce_s.push_back(k < rc.shared_exchange_s.size() ? rc.shared_exchange_s[k] : 0.0);
    optimizer_bytes = std::max(optimizer_bytes, stat);
  }
  // The optimizer streams every weight, gradient and state once: memory-bound.
  c.optimizer_s = s.shape.training ? optimizer_bytes / s.device.memory_bandwidth : 0.0;
  return c;
}

Prediction predict(const Setup& s, const schedule::Schedule& sched, const partition::Solution& sol,
                   const NodeFacts& f, const ir::Graph& g, const std::vector<ir::NodeId>& order,
                   int64_t batch, const Recompute& rc = {}) {
  auto sim = schedule::simulate(sched, s.shape, stage_costs(s, sol, f, rc));
  Prediction p;
  p.step_ms = sim.step_s * 1e3;
  p.bubble_fraction = sim.bubble_fraction;
  p.samples_per_s = sim.samples_per_s(static_cast<int>(batch));
  for (double b : sim.device_busy_s) p.device_busy_ms.push_back(b * 1e3);
  for (double b : sim.device_peak_bytes) p.device_peak_bytes.push_back(static_cast<int64_t>(b));
  p.peak_memory_bytes = p.device_peak_bytes.empty() ? 0
                                                    : *std::max_element(p.device_peak_bytes.begin(),
                                                                        p.device_peak_bytes.end());
  for (std::size_t k = 0; k + 1 < sol.stages.size(); ++k)
    p.split_after.push_back(g.node(order[sol.stages[k].last]).name);
  p.fits = sol.feasible;
  return p;
}

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
          : fmt::format("stage memory {} against a largest stage of {}",
                        format_bytes(st.memory_bytes), format_bytes(sol.peak_memory_bytes));
  std::string memory = st.memory_bytes > 0.9 * cap
                           ? fmt::format("; memory {} of {} is near the limit",
                                         format_bytes(st.memory_bytes), format_bytes(cap))
                           : "";
  return fmt::format("{}: {}; sends {} per microbatch{}", base, bound,
                     format_bytes(problem.cut_bytes[st.last]), memory);
}

[[noreturn]] void refuse(const Setup& s, const partition::Solution& sol, const NodeFacts& f,
                         double capacity) {
  const auto& st = sol.stages[sol.over_stage];
  int64_t params = span_params(f, st.first, st.last), acts = 0;
  for (int i = st.first; i <= st.last; ++i) acts += s.shape.training ? f.output_bytes[i] : 0;
  auto in = static_cast<int64_t>(in_flight(s, sol.over_stage));
  auto anatomy = cost::stage_memory(params, acts, 0, 0, in, s.optimizer, s.precision,
                                    s.shape.training, false, 0);
  fail(ErrorKind::kPlan,
       "no split into {} stages fits: even the split that needs least memory has stage {} needing "
       "{}; device has {} "
       "(use more devices, --precision mixed, a lighter --optimizer, or fewer --microbatches)",
       sol.stages.size(), sol.over_stage, cost::describe(anatomy, in), format_bytes(capacity));
}

/// Time to sum `bytes` of gradient over the devices of the holder stages `stages`: a ring
/// all-reduce, 2 (n - 1) steps of bytes / n over the slowest link of the ring of the n distinct
/// devices (0 when they are all one device).
double shared_exchange_s(const Setup& s, const std::vector<int>& stages, double bytes) {
  std::vector<int> devices;
  for (int stage : stages) devices.push_back(stage % s.shape.devices);
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  const auto n = static_cast<int>(devices.size());
  if (n < 2) return 0;
  double slowest = 0;
  for (int i = 0; i < n; ++i)
    slowest = std::max(slowest, cost::transfer_seconds(s.cluster, devices[i],
                                                       devices[(i + 1) % n], bytes / n));
  return 2.0 * (n - 1) * slowest;
}

/// Working memory of one microbatch through the stage beyond what the anatomy already holds.
/// Inference: the peak of the stage's own liveness (a tensor lives from its producer to its
/// last reader in the stage; tensors leaving the stage live to its end). Training keeps every
/// activation anyway, so the extra is one gradient buffer of the largest tensor.
int64_t stage_temporary_bytes(const ir::Graph& g, const std::vector<ir::NodeId>& order, int first,
                              int last, const std::vector<int>& stage_of, bool training) {
  std::vector<int> position(g.num_nodes(), -1);
  for (int i = first; i <= last; ++i) position[order[i]] = i;
  int64_t live = 0, peak = 0, largest = 0;
  std::vector<std::vector<int64_t>> free_after(last - first + 1);
  for (int i = first; i <= last; ++i) {
    for (ir::ValueId v : g.node(order[i]).outputs) {
      if (v == ir::kNoId) continue;
      int64_t bytes = g.value(v).bytes();
      largest = std::max(largest, bytes);
      int end = i;
      bool leaves = g.value(v).is_graph_output;
      for (ir::NodeId u : g.value(v).consumers) {
        if (stage_of[u] != stage_of[order[i]]) leaves = true;
        if (position[u] >= 0) end = std::max(end, position[u]);
      }
      live += bytes;
      free_after[(leaves ? last : end) - first].push_back(bytes);
    }
    peak = std::max(peak, live);
    for (int64_t bytes : free_after[i - first]) live -= bytes;
  }
  return training ? largest : peak;
}

/// The static memory plan of the stage's forward program: every tensor a node of the stage
/// produces and only the stage reads gets an offset in one arena (runtime/format/memory_plan.h);
/// the runtime allocates that arena and places the tensors where the plan says.
void plan_stage_arena(const ir::Graph& g, const std::vector<ir::NodeId>& order, int first, int last,
                      const std::vector<int>& stage_of, Stage& out) {
  std::vector<int> position(g.num_nodes(), -1);
  for (int i = first; i <= last; ++i) position[order[i]] = i;
  std::vector<plan::Lifetime> lifetimes;
  std::vector<std::string> names;
  for (int i = first; i <= last; ++i) {
    for (ir::ValueId v : g.node(order[i]).outputs) {
      if (v == ir::kNoId) continue;
      const ir::Value& value = g.value(v);
      bool leaves = value.is_graph_output;
      int end = i;
      for (ir::NodeId u : value.consumers) {
        if (stage_of[u] != stage_of[order[i]]) leaves = true;
        if (position[u] >= 0) end = std::max(end, position[u]);
      }
      if (leaves) continue;  // a stage output: the runtime hands it on, outside the arena
      lifetimes.push_back({value.bytes(), i - first, end - first});
      names.push_back(value.name);
    }
  }
  plan::MemoryPlan mp = plan::plan_memory(lifetimes);
  out.arena_bytes = mp.arena_bytes;
  for (size_t t = 0; t < names.size(); ++t)
    out.arena.push_back({names[t], mp.offsets[t], lifetimes[t].bytes});
}

Stage make_stage(const Setup& s, const partition::Solution& sol, std::size_t k, const NodeFacts& f,
                 const ir::Graph& g, const std::vector<ir::NodeId>& order,
                 const StageInterfaces& io, const std::vector<int>& stage_of, bool recompute,
                 int64_t backward_arena = 0) {
  const auto& st = sol.stages[k];
  Stage out;
  out.index = static_cast<int>(k);
  out.device = static_cast<int>(k) % s.shape.devices;
  out.chunk = static_cast<int>(k) / s.shape.devices;
  out.file = fmt::format("stage_{}.onnx", k);
  int64_t acts = 0;
  out.params = span_params(f, st.first, st.last);
  for (int i = st.first; i <= st.last; ++i) {
    out.nodes.push_back(g.node(order[i]).name);
    out.fwd_ms += f.time[i].forward_s * 1e3;
    out.bwd_ms += s.shape.training ? f.time[i].backward_s * 1e3 : 0.0;
    acts += s.shape.training ? f.output_bytes[i] : 0;
  }
  out.bwd_ms += accumulate_s(s, static_cast<double>(out.params)) * 1e3;
  // The solver's send time covers activations forward and, in training, gradients back; the
  // plan records one direction.
  out.send_ms = (s.shape.training ? st.send_s / 2 : st.send_s) * 1e3;
  out.in_flight = static_cast<int64_t>(in_flight(s, static_cast<int>(k)));
  for (const auto& cut : io.cut_tensors) {
    bool reads = std::find(cut.consumer_stages.begin(), cut.consumer_stages.end(),
                           static_cast<int>(k)) != cut.consumer_stages.end();
    StageTensor t{cut.name, std::string(dtype_name(cut.dtype)), cut.shape, -1, {}, false,
                  cut.bytes};
    if (reads) {
      t.peer_stage = cut.producer_stage;
      out.inputs.push_back(t);
    }
    if (cut.producer_stage == static_cast<int>(k)) {
      t.peer_stages = cut.consumer_stages;
      t.graph_output = g.value(*g.find_value(cut.name)).is_graph_output;
      out.outputs.push_back(t);
    }
  }
  for (std::size_t i = 0; i < g.inputs.size(); ++i) {
    const auto& readers = io.input_stages[i];
    if (std::find(readers.begin(), readers.end(), static_cast<int>(k)) == readers.end()) continue;
    const ir::Value& v = g.value(g.inputs[i]);
    out.inputs.push_back(
        StageTensor{v.name, std::string(dtype_name(v.dtype)), v.shape, -1, {}, false, v.bytes()});
  }
  for (ir::ValueId o : g.outputs) {
    const ir::Value& v = g.value(o);
    bool mine = v.producer != ir::kNoId && stage_of[v.producer] == static_cast<int>(k);
    bool listed = std::any_of(out.outputs.begin(), out.outputs.end(),
                              [&](const StageTensor& t) { return t.name == v.name; });
    if (mine && !listed)
      out.outputs.push_back(
          StageTensor{v.name, std::string(dtype_name(v.dtype)), v.shape, -1, {}, true, v.bytes()});
  }
  int64_t comm = 0;
  // Inference double-buffers what it receives (one microbatch computing, the next arriving:
  // the runtime's channels hold one message); training keeps one of each.
  for (const auto& t : out.inputs)
    comm += t.peer_stage >= 0 ? (s.shape.training ? 1 : 2) * t.bytes : 0;
  plan_stage_arena(g, order, st.first, st.last, stage_of, out);
  // The device's working arena: inference runs the forward in it; training keeps every
  // forward value (the activations) and runs the backward in it; a recomputing stage runs its
  // first forward there too (never at the same time as a backward).
  out.backward_arena_bytes = s.shape.training ? backward_arena : 0;
  int64_t temporary = s.shape.training ? backward_arena : out.arena_bytes;
  for (const auto& t : out.outputs) comm += t.peer_stages.empty() ? 0 : t.bytes;
  // Shared weights: the stage holds its own copy (in params already, with its gradient and
  // optimizer state); training sums the copies' float32 gradients across the holders before
  // the optimizer step, through one more buffer per weight.
  for (const SharedWeight& w : io.shared_weights) {
    if (std::find(w.stages.begin(), w.stages.end(), out.index) == w.stages.end()) continue;
    out.shared_weights.push_back(w);
    if (!s.shape.training) continue;
    int64_t elements = 1;
    for (int64_t d : w.shape) elements *= d;
    comm += 4 * elements;
    out.shared_exchange_ms += shared_exchange_s(s, w.stages, 4.0 * elements) * 1e3;
  }
  // Recomputation: the first forward runs in the arena (kept for the run), keeping only the
  // stage inputs; the backward's forward re-run rebuilds one microbatch's activations.
  out.recompute = recompute && s.shape.training;
  int64_t input_bytes = 0;
  for (const auto& t : out.inputs) input_bytes += t.bytes;
  if (out.recompute) {
    temporary = std::max(temporary, out.arena_bytes);
    // ZB-H1 runs B and W apart and re-runs the forward before each.
    out.bwd_ms += (s.kind == ScheduleKind::kZBH1 ? 2 : 1) * out.fwd_ms;
  }
  auto anatomy =
      cost::stage_memory(out.params, acts, temporary, comm, out.in_flight, s.optimizer, s.precision,
                         s.shape.training, out.recompute, out.recompute ? input_bytes : 0);
  out.memory = MemoryBytes{anatomy.weights,     anatomy.gradients, anatomy.optimizer,
                           anatomy.activations, anatomy.temporary, anatomy.communication};
  return out;
}

/// A stage's backward as the runtime will run it: its arena and what a split backward holds
/// from B to W.
struct BackwardFacts {
  int64_t arena = 0;
  double deferred = 0;
};

BackwardFacts backward_facts(const Setup& s, const partition::Solution& sol, std::size_t k,
                             const NodeFacts& f, const ir::Graph& g,
                             const std::vector<ir::NodeId>& order, const StageInterfaces& io,
                             const std::vector<int>& stage_of, const std::string& loss_output) {
  BackwardFacts out;
  if (!s.shape.training) return out;
  if (loss_output.empty()) {
    // No loss yet (a dry run): one gradient buffer of the largest tensor, at least.
    out.arena = stage_temporary_bytes(g, order, sol.stages[k].first, sol.stages[k].last, stage_of,
                                      true);
    return out;
  }
  // The backward program the writer will emit, and the arena the runtime runs it in.
  Stage shape = make_stage(s, sol, k, f, g, order, io, stage_of, false);
  onnx::ModelProto bwd = backward_stage_model(g, stage_of, shape, loss_output);
  out.arena = program_arena_bytes(bwd);
  out.deferred = static_cast<double>(deferred_bytes(bwd));
  return out;
}

/// What the simulator leaves to the stages: each device holds its working arena (one, shared
/// by its stages, which run one at a time) and one microbatch of every tensor it receives or
/// sends.
void add_working_memory(Prediction& pr, const std::vector<Stage>& stages, int devices) {
  std::vector<int64_t> arena(devices, 0), comm(devices, 0);
  for (const Stage& st : stages) {
    arena[st.device] = std::max(arena[st.device], st.memory.temporary);
    comm[st.device] += st.memory.communication;
  }
  for (int d = 0; d < devices && d < static_cast<int>(pr.device_peak_bytes.size()); ++d)
    pr.device_peak_bytes[d] += arena[d] + comm[d];
  if (!pr.device_peak_bytes.empty())
    pr.peak_memory_bytes =
        *std::max_element(pr.device_peak_bytes.begin(), pr.device_peak_bytes.end());
}

/// The stage's entries of the simulator's per-stage extras.
void note_stage(Recompute& rc, const Stage& st, const BackwardFacts& b) {
  rc.on.push_back(st.recompute);
  rc.deferred_bytes.push_back(b.deferred);
  rc.shared_exchange_s.push_back(st.shared_exchange_ms / 1e3);
  int64_t input_bytes = 0;
  for (const auto& t : st.inputs) input_bytes += t.bytes;
  rc.input_bytes.push_back(static_cast<double>(input_bytes));
}

/// One split as the plan would have it: its stages (recomputation decided), its schedule, the
/// prediction and the memory of every device.
struct Candidate {
  partition::Solution sol;
  std::vector<int> stage_of;
  Setup setup;  ///< With the split's shared-weight groups.
  schedule::Schedule schedule;
  std::vector<Stage> stages;
  Recompute rc;
  Prediction predicted;  ///< `fits`: every device within its memory.
  std::vector<DeviceMemory> devices;
  int worst_device = 0;       ///< The device with the least room (or the most over).
  double overflow_bytes = 0;  ///< Bytes over capacity, summed over devices.
};

/// Builds and checks splits the way the plan is built, so that every split the search compares
/// passes the plan's own memory check: the full anatomy of every stage and each device's stages
/// together under the schedule's in-flight counts, with recomputation where it is chosen.
/// Backward programs (the arena a training stage needs) are built once per span of positions.
class SplitEvaluator {
 public:
  SplitEvaluator(const Setup& s, const PlanOptions& o, const NodeFacts& f, const ir::Graph& g,
                 const std::vector<ir::NodeId>& order, const partition::GraphProblem& gp,
                 std::string loss_output, int64_t batch)
      : s_(s),
        o_(o),
        f_(f),
        g_(g),
        order_(order),
        gp_(gp),
        loss_output_(std::move(loss_output)),
        batch_(batch) {}

  double capacity() const { return static_cast<double>(s_.device.memory_bytes); }

  Candidate evaluate(const std::vector<int>& cuts) {
    Candidate c;
    c.sol = partition::evaluate_cuts(gp_.problem, cuts);
    c.stage_of = partition::stage_of_nodes(gp_, c.sol, g_.num_nodes());
    const auto stages = c.sol.stages.size();
    partition::validate_assignment(g_, c.stage_of, static_cast<int>(stages));
    const StageInterfaces io = stage_interfaces(g_, c.stage_of);
    // Stages holding a common weight exchange its gradients before their optimizer steps.
    c.setup = s_;
    c.setup.shape.shared_groups = shared_weight_groups(io.shared_weights);
    c.schedule = schedule::build_schedule(c.setup.kind, c.setup.shape);
    const bool training = s_.shape.training;
    const bool may_recompute = training && o_.recompute != "none";
    std::vector<Stage> plain, with;
    std::vector<BackwardFacts> bwd;
    std::vector<bool> on(stages, may_recompute && o_.recompute == "all");
    for (std::size_t k = 0; k < stages; ++k) {
      bwd.push_back(backward(c.sol, k, io, c.stage_of));
      plain.push_back(
          make_stage(c.setup, c.sol, k, f_, g_, order_, io, c.stage_of, false, bwd.back().arena));
      if (!may_recompute) continue;
      with.push_back(
          make_stage(c.setup, c.sol, k, f_, g_, order_, io, c.stage_of, true, bwd.back().arena));
      // Memory: every stage whose memory recomputation lowers (the extra forward is the price
      // of a smaller peak).
      if (o_.recompute == "auto" && o_.objective == "memory")
        on[k] = with[k].memory.total() < plain[k].memory.total();
    }
    std::vector<const Stage*> picked(stages);
    for (std::size_t k = 0; k < stages; ++k) picked[k] = on[k] ? &with[k] : &plain[k];
    if (may_recompute && o_.recompute == "auto" && o_.objective != "memory") {
      // Speed: recompute only on the devices that do not fit without it, the stage that saves
      // the most first, until the device fits.
      for (int d = 0; d < c.setup.shape.devices; ++d) {
        for (DeviceMemory dm = device_memory(d, picked, c.schedule, c.setup.shape);
             static_cast<double>(dm.total()) > capacity();
             dm = device_memory(d, picked, c.schedule, c.setup.shape)) {
          int pick = -1;
          int64_t most = 0;
          for (int k : dm.stages) {
            int64_t saves = plain[k].memory.total() - with[k].memory.total();
            if (!on[k] && saves > most) {
              most = saves;
              pick = k;
            }
          }
          if (pick < 0) break;
          on[pick] = true;
          picked[pick] = &with[pick];
        }
      }
    }
    for (std::size_t k = 0; k < stages; ++k)
      c.stages.push_back(std::move(on[k] ? with[k] : plain[k]));
    c.devices = device_memory(c.stages, c.schedule, c.setup.shape);
    for (std::size_t k = 0; k < stages; ++k) note_stage(c.rc, c.stages[k], bwd[k]);
    c.predicted = predict(c.setup, c.schedule, c.sol, f_, g_, order_, batch_, c.rc);
    add_working_memory(c.predicted, c.stages, c.setup.shape.devices);
    double least_room = std::numeric_limits<double>::infinity();
    for (const DeviceMemory& d : c.devices) {
      double room = capacity() - static_cast<double>(d.total());
      if (room < 0) c.overflow_bytes -= room;
      if (room < least_room) {
        least_room = room;
        c.worst_device = d.device;
      }
    }
    c.predicted.fits = c.overflow_bytes == 0;
    return c;
  }

  /// The search's key: the simulated step under the speed objective, the largest device peak
  /// under the memory objective, the other as the tie-breaker.
  partition::SplitScore score(const Candidate& c) const {
    const auto step = c.predicted.step_ms;
    const auto peak = static_cast<double>(c.predicted.peak_memory_bytes);
    const bool speed = o_.objective != "memory";
    return {c.predicted.fits, c.overflow_bytes, speed ? step : peak, speed ? peak : step};
  }

 private:
  BackwardFacts backward(const partition::Solution& sol, std::size_t k, const StageInterfaces& io,
                         const std::vector<int>& stage_of) {
    // The backward program of a span does not depend on the rest of the split.
    const std::pair<int, int> span{sol.stages[k].first, sol.stages[k].last};
    auto it = backward_cache_.find(span);
    if (it != backward_cache_.end()) return it->second;
    BackwardFacts facts = backward_facts(s_, sol, k, f_, g_, order_, io, stage_of, loss_output_);
    backward_cache_.emplace(span, facts);
    return facts;
  }

  const Setup& s_;
  const PlanOptions& o_;
  const NodeFacts& f_;
  const ir::Graph& g_;
  const std::vector<ir::NodeId>& order_;
  const partition::GraphProblem& gp_;
  std::string loss_output_;
  int64_t batch_;
  std::map<std::pair<int, int>, BackwardFacts> backward_cache_;
};

/// The cut-after positions of a solution.
std::vector<int> cuts_of(const partition::Solution& sol) {
  std::vector<int> cuts;
  for (std::size_t k = 0; k + 1 < sol.stages.size(); ++k) cuts.push_back(sol.stages[k].last);
  return cuts;
}

/// How the split was chosen.
struct SplitChoice {
  std::vector<int> cuts;
  std::vector<int> bottleneck_cuts;  ///< The exact solve's split; empty for a manual one.
  Prediction bottleneck;             ///< Its prediction.
  Prediction baseline_parameters, baseline_uniform;
  int64_t candidates = 0;  ///< Distinct splits simulated.
};

/// Candidate splits the search may simulate. One candidate costs about a simulation of its
/// schedule (some 8 instructions per stage and microbatch) and the stage interfaces of the
/// graph (its nodes); the budget is a fixed amount of that work (a few seconds: 1,700 candidates
/// for a 4,812-node model on 64 stages and 2 microbatches, 140 with 128 stages and 64), and at
/// most 16 sweeps of single-cut moves, which small models reach.
int candidate_budget(int stages, int microbatches, std::size_t nodes) {
  const double per_candidate = 8.0 * stages * microbatches + static_cast<double>(nodes);
  const double work = 1e7;
  const int sweeps = 16 * 2 * std::max(1, stages - 1);
  return std::clamp(static_cast<int>(work / per_candidate), 16, std::max(16, sweeps));
}

/// Most re-solves with tighter per-stage limits when the bottleneck-optimal split leaves a device
/// over its memory (the chunks of an interleaved device, checked together).
constexpr int kRepairRounds = 12;

/// Chooses the split: the manual one, or the exact bottleneck solve (under a per-stage limit that
/// is never stricter than the device check), re-solved with tighter limits when a device does
/// not fit, then the search by simulation from the best of those and the baselines. Every
/// candidate is built and checked by `evaluator`.
SplitChoice choose_split(SplitEvaluator& evaluator, const Setup& s, const NodeFacts& facts,
                         const partition::GraphProblem& gp, const std::vector<int>& manual_cuts) {
  struct Evaluated {
    partition::SplitScore score;
    Prediction predicted;
    std::vector<int64_t> device_bytes;
  };
  std::map<std::vector<int>, Evaluated> seen;
  auto evaluate = [&](const std::vector<int>& cuts) -> const Evaluated& {
    auto it = seen.find(cuts);
    if (it != seen.end()) return it->second;
    Candidate c = evaluator.evaluate(cuts);
    Evaluated e{evaluator.score(c), c.predicted, {}};
    for (const DeviceMemory& d : c.devices) e.device_bytes.push_back(d.total());
    return seen.emplace(cuts, std::move(e)).first->second;
  };
  const int stages = gp.problem.stages;
  std::vector<double> param_weight, op_weight;
  for (int64_t params : facts.params) {
    param_weight.push_back(static_cast<double>(params));
    op_weight.push_back(1.0);
  }
  const std::vector<int> parameter_cuts = balanced_cuts(param_weight, stages);
  const std::vector<int> uniform_cuts = balanced_cuts(op_weight, stages);
  SplitChoice choice;
  if (!manual_cuts.empty()) {
    choice.cuts = manual_cuts;
  } else {
    std::vector<double> limits(stages, evaluator.capacity());
    partition::Problem problem = gp.problem;
    problem.capacity_bytes = [&limits](int k) { return limits[k]; };
    partition::Solution sol = partition::solve(problem);
    if (!sol.feasible) refuse(s, sol, facts, evaluator.capacity());
    choice.bottleneck_cuts = cuts_of(sol);
    std::vector<std::vector<int>> seeds{choice.bottleneck_cuts};
    if (!evaluate(seeds.back()).score.fits) {
      // A device over its memory (the chunks of an interleaved device together, or what the
      // solver leaves out: temporaries, buffers): solve again with each stage limited to a
      // share of what its device has beyond what the solver does not count, the device's
      // chunks sharing it evenly or one taking more (a wide chunk beside a narrow one); where
      // that still leaves a device over, less by its excess.
      const Evaluated& first = evaluate(seeds.back());
      double uncounted = 0;
      for (std::size_t d = 0; d < first.device_bytes.size(); ++d) {
        double counted = 0;
        for (int k = static_cast<int>(d); k < stages; k += s.shape.devices)
          counted += sol.stages[k].memory_bytes;
        uncounted = std::max(uncounted, static_cast<double>(first.device_bytes[d]) - counted);
      }
      const int chunks = s.shape.chunks;
      int rounds = 0;
      bool fits = false;
      for (double tilt : {0.0, 0.05, -0.05, 0.1, -0.1, 0.15, -0.15, 0.2, -0.2, 0.3, -0.3}) {
        if (fits || rounds >= kRepairRounds || (chunks == 1 && tilt != 0)) break;
        double budget = evaluator.capacity() - uncounted;
        for (int shrink = 0; shrink < 3 && !fits && rounds < kRepairRounds; ++shrink, ++rounds) {
          for (int k = 0; k < stages; ++k) {
            const int chunk = k / s.shape.devices;
            const double share =
                1.0 / chunks + (chunk == 0 ? tilt : -tilt / std::max(1, chunks - 1));
            limits[k] = std::clamp(share, 0.0, 1.0) * budget;
          }
          partition::Solution tighter = partition::solve(problem);
          if (!tighter.feasible) break;
          seeds.push_back(cuts_of(tighter));
          const Evaluated& e = evaluate(seeds.back());
          fits = e.score.fits;
          const double worst =
              static_cast<double>(*std::max_element(e.device_bytes.begin(), e.device_bytes.end()));
          budget -= std::max(worst - evaluator.capacity(), 0.01 * budget);
        }
      }
    }
    seeds.push_back(parameter_cuts);
    seeds.push_back(uniform_cuts);
    partition::SearchLimits search_limits;
    search_limits.allowed_cuts = gp.problem.allowed_cuts;
    search_limits.max_candidates = candidate_budget(stages, s.shape.microbatches, gp.order.size());
    partition::SearchResult found = partition::search_cuts(
        static_cast<int>(gp.order.size()), stages, seeds,
        [&](const std::vector<int>& cuts) { return evaluate(cuts).score; }, search_limits);
    choice.cuts = found.cuts;
    choice.bottleneck = evaluate(choice.bottleneck_cuts).predicted;
  }
  choice.baseline_parameters = evaluate(parameter_cuts).predicted;
  choice.baseline_uniform = evaluate(uniform_cuts).predicted;
  choice.candidates = static_cast<int64_t>(seen.size());
  return choice;
}
}  // namespace

PlannedModel make_plan(const PlanOptions& o) {
  Setup s = make_setup(o);
  ImportOptions import;
  if (o.batch) import.batch = s.microbatch_size;
  import.dims = o.dims;
  PlannedModel out{import_model(o.model_path, import), {}, {}, {}, {}};
  // Training needs a loss to write a plan (write_plan says so); planning alone (--dry-run, the
  // memory and time of a model without one) goes ahead without.
  if (o.training && (!o.loss.kind.empty() || passes::scalar_output(out.model.graph))) {
    passes::AppendedLoss loss = passes::append_loss(out.model.graph, o.loss);
    out.loss_summary = loss.summary;
    out.plan.training_config = o.training_config;
    out.plan.training_config.loss = o.loss.kind.empty() ? "model" : o.loss.kind;
    out.plan.training_config.loss_output = out.model.graph.value(loss.value).name;
    out.plan.training_config.labels = o.loss.kind.empty() ? "" : o.loss.labels;
  }
  if (o.training) {
    std::vector<ir::NodeId> all = out.model.graph.topological_order();
    if (passes::trainable_weights(out.model.graph, all).empty())
      fail(ErrorKind::kModel,
           "{}: --train asked for a model with no trainable weights (no float32 initializer feeds "
           "a differentiable "
           "input)",
           o.model_path);
  }
  const ir::Graph& g = out.model.graph;
  if (!o.batch) {
    // A model with a fixed batch: each microbatch is that batch.
    const auto& first = g.value(g.inputs.at(0)).shape;
    s.microbatch_size = first.empty() ? 1 : first[0];
  }
  cost::RooflineCostModel roofline(s.device, s.precision);
  std::unique_ptr<cost::OpCostModel> custom_costs =
      o.cost_model ? o.cost_model(g, roofline) : nullptr;
  if (o.cost_model && !custom_costs)
    fail(ErrorKind::kInternal, "the cost model factory returned no model");
  const cost::OpCostModel& costs = custom_costs ? *custom_costs : roofline;
  auto order = g.topological_order();
  NodeFacts facts = node_facts(g, order, costs, s.precision);
  auto gp = build_problem(g, order, s, facts, o);
  const int stages = gp.problem.stages;
  if (stages > static_cast<int>(order.size())) {
    fail(ErrorKind::kUsage,
         "{} stages ({} devices x {} chunks) for a model of {} ops after import: every stage needs "
         "an op",
         stages, s.shape.devices, s.shape.chunks, order.size());
  }

  bool manual = !o.split_after.empty();
  SplitEvaluator evaluator(s, o, facts, g, order, gp, out.plan.training_config.loss_output,
                           s.microbatch_size * s.shape.microbatches);
  const SplitChoice choice = choose_split(
      evaluator, s, facts, gp, manual ? split_positions(g, gp, o.split_after) : std::vector<int>{});
  Candidate chosen = evaluator.evaluate(choice.cuts);
  if (!chosen.predicted.fits) {
    const DeviceMemory& worst = chosen.devices[chosen.worst_device];
    if (manual)
      fail(ErrorKind::kPlan, "{}; device has {}", describe(worst, chosen.stages),
           format_bytes(evaluator.capacity()));
    fail(ErrorKind::kPlan,
         "no split into {} stages fits: the best of {} simulated has {}; device has {} (use more "
         "devices, --recompute auto, --precision mixed, a lighter --optimizer, or fewer "
         "--microbatches)",
         stages, choice.candidates, describe(worst, chosen.stages),
         format_bytes(evaluator.capacity()));
  }
  const partition::Solution& sol = chosen.sol;
  out.stage_of = chosen.stage_of;
  s.shape.shared_groups = chosen.setup.shape.shared_groups;
  out.schedule = chosen.schedule;
  schedule::validate_schedule(out.schedule, s.shape);

  Plan& p = out.plan;
  p.generator = "stagec 0.1.0";
  p.model_path = o.model_path;
  p.model_hash = file_hash(o.model_path);
  p.objective = o.objective;
  p.schedule = std::string(to_string(s.kind));
  p.devices = s.shape.devices;
  p.chunks = s.shape.chunks;
  p.microbatches = s.shape.microbatches;
  p.microbatch_size = s.microbatch_size;
  p.batch = s.microbatch_size * s.shape.microbatches;
  p.training = s.shape.training;
  p.optimizer = std::string(to_string(s.optimizer));
  p.precision = std::string(to_string(s.precision));
  p.cost_model = costs.name();
  p.device_spec = cost::to_json(s.device);
  p.cluster = cost::to_json(s.cluster);
  p.stages = std::move(chosen.stages);
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    Stage& st = p.stages[k];
    st.why = why(sol, k, g, order, gp.problem, manual);
    if (k < choice.bottleneck_cuts.size() && k + 1 < p.stages.size() &&
        choice.bottleneck_cuts[k] != sol.stages[k].last)
      st.why += fmt::format("; the solver's optimum cuts after '{}', but {}",
                            g.node(order[choice.bottleneck_cuts[k]]).name,
                            choice.bottleneck.fits ? "this split simulates a shorter step"
                                                   : "that split leaves a device over its memory");
    if (st.recompute) st.why += "; recomputes its activations before the backward";
  }
  for (std::size_t i = 0; i < order.size(); ++i) {
    const ir::Node& node = g.node(order[i]);
    int64_t param_bytes =
        static_cast<int64_t>(static_cast<double>(facts.params[i]) * bytes_per_param(s));
    p.ops.push_back(OpRecord{node.name, node.op_type, out.stage_of[order[i]],
                             facts.time[i].forward_s * 1e3,
                             s.shape.training ? facts.time[i].backward_s * 1e3 : 0.0,
                             facts.flops[i], param_bytes, facts.output_bytes[i]});
  }
  p.predicted = chosen.predicted;
  p.baseline_parameters = choice.baseline_parameters;
  p.baseline_uniform = choice.baseline_uniform;
  p.search.candidates = choice.candidates;
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
  return fmt::format(
      "  split search: {} candidates simulated; step {} the {}-stage optimum's {:.3f} ms{}",
      search.candidates, against, p.objective == "memory" ? "largest" : "slowest",
      search.bottleneck_step_ms, search.bottleneck_fits ? "" : " (which does not fit)");
}

}  // namespace

std::string summarize(const Plan& p) {
  std::string out = fmt::format(
      "{} stages on {} devices ({} schedule, {} microbatches of {}; {}):\n", p.stages.size(),
      p.devices, p.schedule, p.microbatches, p.microbatch_size, p.cost_model);
  for (const auto& st : p.stages) {
    out += fmt::format(
        "  stage {} on device {}: {} ops, {} params, fwd {:.3f} ms, bwd {:.3f} ms, memory {}{}\n",
        st.index, st.device, st.nodes.size(), st.params, st.fwd_ms, st.bwd_ms,
        format_bytes(static_cast<double>(st.memory.total())), st.recompute ? " (recompute)" : "");
  }
  auto line = [](const char* label, const Prediction& pr) {
    return fmt::format("  {:<22} step {:.3f} ms, bubble {:.1f}%, {:.1f} samples/s, peak {}{}\n",
                       label, pr.step_ms, 100 * pr.bubble_fraction, pr.samples_per_s,
                       format_bytes(static_cast<double>(pr.peak_memory_bytes)),
                       pr.fits ? "" : " (does not fit)");
  };
  out += line("predicted:", p.predicted);
  out += line("parameter-balanced:", p.baseline_parameters);
  out += line("op-count-balanced:", p.baseline_uniform);
  out += search_line(p) + "\n";
  return out;
}

}  // namespace stagecraft::plan
