#include "compiler/plan/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "compiler/model_info.h"
#include "compiler/partition/graph_problem.h"
#include "compiler/plan/stage_files.h"
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
  schedule::ScheduleKind kind;
  cost::Schedule memory_schedule;
  schedule::PipelineShape shape;
  cost::Optimizer optimizer;
  cost::Precision precision;
  cost::DeviceSpec device;
  cost::ClusterSpec cluster;
  int64_t microbatch_size = 1;
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
  s.kind = schedule::parse_schedule(sched);
  s.memory_schedule = cost::parse_schedule(sched);
  if (o.training && s.kind == schedule::ScheduleKind::kInference) {
    fail(
        ErrorKind::kUsage,
        "--schedule inference runs forward only; training needs gpipe, 1f1b, interleaved or zb-h1");
  }
  if (!o.training && s.kind != schedule::ScheduleKind::kInference) {
    fail(ErrorKind::kUsage,
         "--schedule {} is a training schedule; add --train, or use --schedule inference", sched);
  }
  int chunks = o.chunks > 0 ? o.chunks : (s.kind == schedule::ScheduleKind::kInterleaved ? 2 : 1);
  if (o.chunks < 0) fail(ErrorKind::kUsage, "--chunks {} must be at least 1", o.chunks);
  if (chunks != 1 && s.kind != schedule::ScheduleKind::kInterleaved) {
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
  // Memory per parameter: nesterov keeps what momentum keeps, adagrad one sum like momentum.
  s.optimizer = o.training
                    ? cost::parse_optimizer(o.optimizer == "nesterov" || o.optimizer == "adagrad"
                                                ? std::string("momentum")
                                                : o.optimizer)
                    : cost::Optimizer::kNone;
  s.precision = cost::parse_precision(o.precision);
  if (o.recompute != "none" && o.recompute != "all" && o.recompute != "auto") {
    fail(ErrorKind::kUsage, "--recompute '{}' is not one of: none, all, auto", o.recompute);
  }
  if (o.recompute != "none" && !o.training) {
    fail(ErrorKind::kUsage, "--recompute {} needs --train: inference keeps no activations",
         o.recompute);
  }
  s.device = cost::device_spec_from_name_or_file(o.device_spec);
  s.cluster = o.cluster.empty() ? cost::default_cluster(s.device.name)
                                : cost::cluster_spec_from_name_or_file(o.cluster);
  return s;
}

NodeFacts node_facts(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                     const cost::OpCostModel& costs, cost::Precision precision) {
  // Mixed precision keeps activations in 16 bits whatever dtype the exporter wrote.
  const int64_t float_bytes_divisor = precision == cost::Precision::kMixed ? 2 : 1;
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

/// Microbatches whose activations global stage `k` keeps: per device for the schedule, spread
/// over the device's chunks for interleaved.
double in_flight(const Setup& s, int k) {
  int p = s.shape.devices;
  int device = k % p;
  auto n = static_cast<double>(cost::microbatches_in_flight(s.memory_schedule, p, device,
                                                            s.shape.microbatches, s.shape.chunks));
  return s.shape.chunks > 1 ? std::ceil(n / s.shape.chunks) : n;
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
  p.objective =
      o.objective == "memory" ? partition::Objective::kMemory : partition::Objective::kSpeed;
  const int devices = s.shape.devices;
  const cost::ClusterSpec cluster = s.cluster;
  // A stage sends activations forward and, in training, receives as many gradient bytes back.
  p.send_time = [cluster, devices, training](int k, double bytes) {
    double t = cost::transfer_seconds(cluster, k % devices, (k + 1) % devices, bytes);
    return training ? 2 * t : t;
  };
  p.in_flight = [s](int k) { return in_flight(s, k); };
  const double capacity = static_cast<double>(s.device.memory_bytes) / s.shape.chunks;
  p.capacity_bytes = [capacity](int) { return capacity; };
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
    const bool split = s.kind == schedule::ScheduleKind::kZBH1;
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
      problem.objective == partition::Objective::kSpeed
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
    out.bwd_ms += (s.kind == schedule::ScheduleKind::kZBH1 ? 2 : 1) * out.fwd_ms;
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
  partition::Solution sol;
  if (manual) {
    sol = partition::evaluate_cuts(gp.problem, split_positions(g, gp, o.split_after));
  } else {
    sol = partition::solve(gp.problem);
  }
  if (!sol.feasible && o.recompute != "none") {
    // The solver counts every activation; recomputation keeps fewer. Split by time alone and
    // check each stage's memory (with recomputation where it is on) below.
    partition::Problem relaxed = gp.problem;
    relaxed.capacity_bytes = [](int) { return 1e300; };
    sol = manual ? partition::evaluate_cuts(relaxed, split_positions(g, gp, o.split_after))
                 : partition::solve(relaxed);
  }
  if (!sol.feasible) refuse(s, sol, facts, gp.problem.capacity_bytes(0));

  out.stage_of = partition::stage_of_nodes(gp, sol, g.num_nodes());
  partition::validate_assignment(g, out.stage_of, stages);
  auto io = stage_interfaces(g, out.stage_of);
  // Stages holding a common weight exchange its gradients before their optimizer steps.
  s.shape.shared_groups = shared_weight_groups(io.shared_weights);
  out.schedule = schedule::build_schedule(s.kind, s.shape);
  schedule::validate_schedule(out.schedule, s.shape);

  Plan& p = out.plan;
  p.generator = "stagec 0.1.0";
  p.model_path = o.model_path;
  p.model_hash = file_hash(o.model_path);
  p.objective = o.objective;
  p.schedule = schedule::to_string(s.kind);
  p.devices = s.shape.devices;
  p.chunks = s.shape.chunks;
  p.microbatches = s.shape.microbatches;
  p.microbatch_size = s.microbatch_size;
  p.batch = s.microbatch_size * s.shape.microbatches;
  p.training = s.shape.training;
  p.optimizer = s.shape.training ? o.optimizer : std::string(cost::to_string(s.optimizer));
  p.precision = std::string(cost::to_string(s.precision));
  p.cost_model = costs.name();
  p.device_spec = cost::to_json(s.device);
  p.cluster = cost::to_json(s.cluster);
  Recompute rc;
  for (std::size_t k = 0; k < sol.stages.size(); ++k) {
    double capacity = gp.problem.capacity_bytes(static_cast<int>(k));
    const BackwardFacts bwd = backward_facts(s, sol, k, facts, g, order, io, out.stage_of,
                                             p.training_config.loss_output);
    const int64_t backward_arena = bwd.arena;
    bool recompute = o.recompute == "all";
    if (o.recompute == "auto" && s.shape.training) {
      // Speed: recompute exactly the stages that do not fit without it. Memory: every stage
      // whose memory recomputation lowers (the extra forward is the price of a smaller peak).
      Stage plain = make_stage(s, sol, k, facts, g, order, io, out.stage_of, false, backward_arena);
      Stage with = make_stage(s, sol, k, facts, g, order, io, out.stage_of, true, backward_arena);
      recompute = o.objective == "memory" ? with.memory.total() < plain.memory.total()
                                          : static_cast<double>(plain.memory.total()) > capacity;
    }
    p.stages.push_back(
        make_stage(s, sol, k, facts, g, order, io, out.stage_of, recompute, backward_arena));
    p.stages.back().why = why(sol, k, g, order, gp.problem, manual);
    if (p.stages.back().recompute)
      p.stages.back().why += "; recomputes its activations before the backward";
    note_stage(rc, p.stages.back(), bwd);
    // The solver leaves temporaries out; the full anatomy must still fit.
    const auto& m = p.stages.back().memory;
    if (static_cast<double>(m.total()) > capacity) {
      cost::MemoryAnatomy a{m.weights,     m.gradients, m.optimizer,
                            m.activations, m.temporary, m.communication};
      fail(ErrorKind::kPlan, "stage {} needs {}; device has {}", k,
           cost::describe(a, p.stages.back().in_flight), format_bytes(capacity));
    }
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
  p.predicted = predict(s, out.schedule, sol, facts, g, order, p.batch, rc);
  add_working_memory(p.predicted, p.stages, p.devices);

  std::vector<double> param_weight, op_weight;
  for (std::size_t i = 0; i < order.size(); ++i) {
    param_weight.push_back(static_cast<double>(facts.params[i]));
    op_weight.push_back(1.0);
  }
  // The baselines' stages are costed like ours (recomputing where ours would with "all"), so
  // their peaks compare like for like.
  auto baseline = [&](const std::vector<double>& weight) {
    auto b = partition::evaluate_cuts(gp.problem, balanced_cuts(weight, stages));
    std::vector<int> b_stage_of = partition::stage_of_nodes(gp, b, g.num_nodes());
    auto b_io = stage_interfaces(g, b_stage_of);
    Recompute b_rc;
    std::vector<Stage> b_stages;
    for (std::size_t k = 0; k < b.stages.size(); ++k) {
      BackwardFacts bwd = backward_facts(s, b, k, facts, g, order, b_io, b_stage_of,
                                         p.training_config.loss_output);
      b_stages.push_back(make_stage(s, b, k, facts, g, order, b_io, b_stage_of,
                                    o.recompute == "all", bwd.arena));
      note_stage(b_rc, b_stages.back(), bwd);
    }
    // Its own shared weights' exchanges (the holders may differ from ours).
    Setup b_setup = s;
    b_setup.shape.shared_groups = shared_weight_groups(b_io.shared_weights);
    schedule::Schedule b_schedule = schedule::build_schedule(b_setup.kind, b_setup.shape);
    Prediction pr = predict(b_setup, b_schedule, b, facts, g, order, p.batch, b_rc);
    add_working_memory(pr, b_stages, p.devices);
    return pr;
  };
  p.baseline_parameters = baseline(param_weight);
  p.baseline_uniform = baseline(op_weight);
  return out;
}

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
  return out;
}

}  // namespace stagecraft::plan
