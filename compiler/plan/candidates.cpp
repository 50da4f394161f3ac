// Candidate splits as the plan would build them: each stage's files-to-be (interfaces, arena,
// backward, memory anatomy, recomputation), the schedule, the prediction and every device's
// memory (planning.h SplitEvaluator).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "compiler/model_info.h"
#include "compiler/plan/planning.h"
#include "compiler/schedule/build_schedule.h"
#include "cost_models/memory.h"
#include "passes/autodiff.h"
#include "runtime/format/error.h"
#include "runtime/format/lifetimes.h"
#include "runtime/format/memory_plan.h"

namespace stagecraft::plan::planning {
namespace {

/// Time to sum `bytes` over `devices` (distinct, in ring order): a ring all-reduce, 2 (n - 1)
/// steps of bytes / n over the slowest link of the ring, 2 (n - 1)/n x bytes / bandwidth plus
/// 2 (n - 1) latencies on a uniform ring (0 for one device).
double ring_allreduce_s(const Setup& s, const std::vector<int>& devices, double bytes) {
  const auto n = static_cast<int>(devices.size());
  if (n < 2) return 0;
  double slowest = 0;
  for (int i = 0; i < n; ++i)
    slowest = std::max(
        slowest, cost::transfer_seconds(s.cluster, devices[i], devices[(i + 1) % n], bytes / n));
  return 2.0 * (n - 1) * slowest;
}

/// Time to sum `bytes` of gradient over the devices of the holder stages `stages` (replica 0's).
double shared_exchange_s(const Setup& s, const std::vector<int>& stages, double bytes) {
  std::vector<int> devices;
  for (int stage : stages) devices.push_back(rank_of(s, 0, stage % s.shape.devices));
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  return ring_allreduce_s(s, devices, bytes);
}

/// Time to sum `bytes` of a stage's gradients on pipeline device `device` over the replicas:
/// a ring over the ranks the placement gives that device in each replica (the cluster fills
/// nodes in rank order: with the identity placement pipeline neighbours share a node first and
/// a replicas' ring crosses nodes when a node holds fewer than R x P devices; replica-major
/// placement keeps the ring in a node first).
double replica_allreduce_s(const Setup& s, int device, double bytes) {
  std::vector<int> devices;
  for (int r = 0; r < s.shape.data_parallel; ++r) devices.push_back(rank_of(s, r, device));
  return ring_allreduce_s(s, devices, bytes);
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
  // The stage's program as the runtime will see it (lifetimes.h): its nodes in partition order
  // over the values they touch; a value is the program's output when it leaves the stage (a
  // graph output, or read by another stage): the runtime hands it on, outside the arena.
  plan::ProgramGraph program;
  std::vector<int> index(g.num_values(), -1);
  std::vector<ir::ValueId> value_of;
  auto number = [&](ir::ValueId v) {
    if (v == ir::kNoId) return -1;
    if (index[v] < 0) {
      index[v] = static_cast<int>(value_of.size());
      value_of.push_back(v);
    }
    return index[v];
  };
  for (int i = first; i <= last; ++i) {
    const ir::Node& node = g.node(order[i]);
    plan::ProgramNode pn;
    pn.op_type = node.op_type;
    for (ir::ValueId v : node.inputs) pn.inputs.push_back(number(v));
    for (ir::ValueId v : node.outputs) pn.outputs.push_back(number(v));
    program.nodes.push_back(std::move(pn));
  }
  program.values = static_cast<int>(value_of.size());
  std::vector<int64_t> bytes;
  std::vector<bool> is_output;
  for (ir::ValueId v : value_of) {
    const ir::Value& value = g.value(v);
    bool leaves = value.is_graph_output;
    for (ir::NodeId u : value.consumers)
      if (value.producer != ir::kNoId && stage_of[u] != stage_of[value.producer]) leaves = true;
    bytes.push_back(value.shape_known ? value.bytes() : 0);
    is_output.push_back(leaves);
  }
  const plan::Intermediates in = plan::intermediate_lifetimes(program, bytes, is_output);
  const plan::MemoryPlan mp = plan::plan_memory(in.lifetimes);
  out.arena_bytes = mp.arena_bytes;
  for (size_t t = 0; t < in.values.size(); ++t)
    out.arena.push_back({g.value(value_of[in.values[t]]).name, mp.offsets[t], in.lifetimes[t].bytes});
}

/// plan_stage_arena through `arenas` (kept per span) when given; `named`: the tensors too, not
/// only the arena's size.
void span_arena(const ir::Graph& g, const std::vector<ir::NodeId>& order, int first, int last,
                const std::vector<int>& stage_of, SpanArenas* arenas, bool named, Stage& out) {
  if (arenas == nullptr) return plan_stage_arena(g, order, first, last, stage_of, out);
  auto [it, added] = arenas->try_emplace({first, last});
  if (added) {
    Stage planned;
    plan_stage_arena(g, order, first, last, stage_of, planned);
    it->second = {planned.arena_bytes, std::move(planned.arena)};
  }
  out.arena_bytes = it->second.bytes;
  if (named) out.arena = it->second.tensors;
}

/// The receive buffers of what a stage sends (training: the gradients that come back).
// Every output the stage sends is a buffer; so is a graph output the stage hands back to the
// caller (no peer stage), which the arena does not hold either. Training keeps the sent
// outputs with the activations; the buffers are then the gradients received for them, which
// queue while the backward works through them: at most one per microbatch in flight (a
// gradient comes back only for a microbatch whose activations the stage still holds) and at
// most what the link holds (kTrainingLinkCapacity: the sender waits for a slot) beside the
// one the backward is reading, so they do not grow with the microbatch count.
int64_t output_buffer_bytes(const Stage& out, bool training) {
  int64_t comm = 0;
  for (const auto& t : out.outputs) {
    if (t.peer_stages.empty() && !t.graph_output) continue;
    const bool gradients_back = training && !t.peer_stages.empty();
    const int64_t queued = std::min<int64_t>(std::max<int64_t>(out.in_flight, 1),
                                             schedule::kTrainingLinkCapacity + 1);
    comm += (gradients_back ? queued : 1) * t.bytes;
  }
  return comm;
}

Stage make_stage(const Setup& s, const partition::Solution& sol, std::size_t k, const NodeFacts& f,
                 const ir::Graph& g, const std::vector<ir::NodeId>& order,
                 const StageInterfaces& io, const std::vector<int>& stage_of, bool recompute,
                 int64_t backward_arena = 0, SpanArenas* arenas = nullptr, bool named = true) {
  const auto& st = sol.stages[k];
  Stage out;
  out.index = static_cast<int>(k);
  out.device = schedule::device_of_stage(static_cast<int>(k), s.shape);
  out.chunk = static_cast<int>(k) / s.shape.devices;
  out.file = fmt::format("stage_{}.onnx", k);
  int64_t acts = 0;
  const SpanWeights held = span_weights(f, st.first, st.last);
  out.params = held.params;
  for (int i = st.first; i <= st.last; ++i) {
    if (named) out.nodes.push_back(g.node(order[i]).name);
    out.fwd_ms += f.time[i].forward_s * 1e3;
    out.bwd_ms += s.shape.training ? f.time[i].backward_s * 1e3 : 0.0;
    acts += s.shape.training ? f.output_bytes[i] : 0;
  }
  out.bwd_ms += accumulate_s(s, static_cast<double>(held.trainable)) * 1e3;
  // The solver's send time covers activations forward and, in training, gradients back; the
  // plan records one direction.
  out.send_ms = (s.shape.training ? st.send_s / 2 : st.send_s) * 1e3;
  out.in_flight = static_cast<int64_t>(in_flight(s, static_cast<int>(k)));
  // A tensor the stage reads or writes (scoring reads its bytes and peers, not its name).
  auto tensor = [&](const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                    int64_t bytes, bool graph_output) {
    return named ? StageTensor{name, std::string(dtype_name(dtype)), shape, -1, {}, graph_output,
                               bytes}
                 : StageTensor{{}, {}, {}, -1, {}, graph_output, bytes};
  };
  for (const auto& cut : io.cut_tensors) {
    bool reads = std::find(cut.consumer_stages.begin(), cut.consumer_stages.end(),
                           static_cast<int>(k)) != cut.consumer_stages.end();
    if (!reads && cut.producer_stage != static_cast<int>(k)) continue;  // another stage's
    StageTensor t = tensor(cut.name, cut.dtype, cut.shape, cut.bytes, false);
    if (reads) {
      t.peer_stage = cut.producer_stage;
      out.inputs.push_back(t);
    }
    if (cut.producer_stage == static_cast<int>(k)) {
      t.peer_stage = -1;
      t.peer_stages = cut.consumer_stages;
      t.graph_output = cut.graph_output;
      out.outputs.push_back(std::move(t));
    }
  }
  for (std::size_t i = 0; i < g.inputs.size(); ++i) {
    const auto& readers = io.input_stages[i];
    if (std::find(readers.begin(), readers.end(), static_cast<int>(k)) == readers.end()) continue;
    const ir::Value& v = g.value(g.inputs[i]);
    out.inputs.push_back(tensor(v.name, v.dtype, v.shape, v.bytes(), false));
  }
  for (ir::ValueId o : g.outputs) {
    const ir::Value& v = g.value(o);
    bool mine = v.producer != ir::kNoId && stage_of[v.producer] == static_cast<int>(k);
    // Listed already when another stage reads it too.
    bool listed = std::any_of(io.cut_tensors.begin(), io.cut_tensors.end(),
                              [&](const CutTensor& c) { return c.value == o; });
    if (mine && !listed) out.outputs.push_back(tensor(v.name, v.dtype, v.shape, v.bytes(), true));
  }
  int64_t comm = 0;
  // What a stage receives is double-buffered: one microbatch computing, the next arriving
  // (inference's links hold one message). Training also keeps each received input in the stash
  // with the activations (below) until its backward; its link holds at most
  // kTrainingLinkCapacity more (a sender running ahead waits: runtime/format/readiness.h).
  for (const auto& t : out.inputs) comm += t.peer_stage >= 0 ? 2 * t.bytes : 0;
  span_arena(g, order, st.first, st.last, stage_of, arenas, named, out);
  // The device's working arena: inference runs the forward in it; training's forward puts
  // there the values the backward does not read (it keeps the others: the activations), and
  // the backward runs in it (never at the same time as a forward).
  out.backward_arena_bytes = s.shape.training ? backward_arena : 0;
  int64_t temporary =
      s.shape.training ? std::max(backward_arena, out.arena_bytes) : out.arena_bytes;
  comm += output_buffer_bytes(out, s.shape.training);
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
  // Data parallelism: the stage's float32 weight gradients are summed over the replicas before
  // its optimizer step (ALLREDUCE): copied into one bucket, and one chunk (1/R of it) received
  // at a time by the ring.
  int64_t shared_elements = 0;  // of the stage's shared weights, which ZeRO-1 does not shard
  for (const SharedWeight& w : out.shared_weights) {
    int64_t elements = 1;
    for (int64_t d : w.shape) elements *= d;
    shared_elements += elements;
  }
  // Only trainable weights have gradients to sum (frozen ones and buffers have none).
  const int64_t sharded = std::max<int64_t>(0, held.trainable - shared_elements);
  if (s.shape.training && s.shape.data_parallel > 1) {
    const double per_param = cost::gradient_bytes_per_param(s.precision);
    const double bytes = per_param * static_cast<double>(held.trainable);
    const int replicas = s.shape.data_parallel;
    comm += static_cast<int64_t>(bytes) + static_cast<int64_t>(std::ceil(bytes / replicas));
    if (s.shard_optimizer) {
      // ZeRO-1: a reduce-scatter of the sharded gradients (half a ring all-reduce: R - 1 steps)
      // and an all-reduce of the shared weights' in ALLREDUCE; the all-gather of the updated
      // weights (R - 1 steps more, through the same bucket) after the optimizer step.
      const double sharded_bytes = per_param * static_cast<double>(sharded);
      const double shared_bytes = bytes - sharded_bytes;
      out.allreduce_ms =
          (replica_allreduce_s(s, out.device, sharded_bytes) / 2 +
           (shared_bytes > 0 ? replica_allreduce_s(s, out.device, shared_bytes) : 0)) *
          1e3;
      const double weight_bytes =
          cost::weight_bytes_per_param(s.precision, true) * static_cast<double>(sharded);
      out.allgather_ms = replica_allreduce_s(s, out.device, weight_bytes) / 2 * 1e3;
    } else {
      out.allreduce_ms = replica_allreduce_s(s, out.device, bytes) * 1e3;
    }
  }
  // Recomputation: the first forward runs in the arena (kept for the run), keeping only the
  // stage inputs; the backward's forward re-run rebuilds one microbatch's activations.
  out.recompute = recompute && s.shape.training;
  const int64_t input_bytes = stage_input_bytes(out);
  // Training keeps each microbatch's inputs (received or fed) with its activations until its
  // backward, which reads them: they are part of every microbatch in flight, and `comm` above
  // holds the one arriving next. (A recomputing stage counts them apart: recompute_input.)
  if (s.shape.training && !out.recompute) acts += input_bytes;
  if (out.recompute) {
    temporary = std::max(temporary, out.arena_bytes);
    // ZB-H1 and ZB-V run B and W apart and re-run the forward before each.
    out.bwd_ms += (splits_backward(s, static_cast<int>(k)) ? 2 : 1) * out.fwd_ms;
  }
  auto anatomy = cost::stage_memory(
      out.params, held.trainable, acts, temporary, comm, out.in_flight, s.optimizer, s.precision,
      s.shape.training, out.recompute, out.recompute ? input_bytes : 0, held.constant_bytes);
  if (s.shard_optimizer && s.shape.training) {
    // ZeRO-1: this replica's shard of the sharded state (the largest, rounded up) and the
    // shared weights' whole.
    const int64_t replicas = s.shape.data_parallel;
    anatomy.optimizer = static_cast<int64_t>(
        std::ceil(cost::optimizer_state_bytes_per_param(s.optimizer, s.precision) *
                  static_cast<double>((sharded + replicas - 1) / replicas + shared_elements)));
  }
  out.memory = anatomy;
  return out;
}

BackwardFacts backward_facts(const Setup& s, const partition::Solution& sol, std::size_t k,
                             const NodeFacts& f, const ir::Graph& g,
                             const std::vector<ir::NodeId>& order, const StageInterfaces& io,
                             const std::vector<int>& stage_of, const std::string& loss_output) {
  BackwardFacts out;
  if (!s.shape.training) return out;
  if (loss_output.empty()) {
    // No loss yet (a dry run): one gradient buffer of the largest tensor, at least.
    out.arena =
        stage_temporary_bytes(g, order, sol.stages[k].first, sol.stages[k].last, stage_of, true);
    return out;
  }
  // The backward program the writer will emit, and the arena the runtime runs it in.
  Stage shape = make_stage(s, sol, k, f, g, order, io, stage_of, false);
  onnx::ModelProto bwd = backward_stage_model(g, stage_of, shape, loss_output);
  out.arena = program_arena_bytes(bwd);
  out.deferred = static_cast<double>(deferred_bytes(bwd));
  return out;
}

/// The stage's entries of the simulator's per-stage extras; `trainable`: its trainable
/// parameters (span_weights), whose gradients the all-reduce buckets hold.
void note_stage(SimExtras& rc, const Stage& st, const BackwardFacts& b, int64_t trainable) {
  rc.on.push_back(st.recompute);
  rc.deferred_bytes.push_back(b.deferred);
  rc.shared_exchange_s.push_back(st.shared_exchange_ms / 1e3);
  rc.allreduce_s.push_back(st.allreduce_ms / 1e3);
  // The runtime sums float32 gradients in buckets of whole weights of at most this size.
  rc.allreduce_buckets.push_back(
      std::max(1.0, std::ceil(4.0 * static_cast<double>(trainable) /
                              static_cast<double>(schedule::kDefaultGradientBucketBytes))));
  rc.allgather_s.push_back(st.allgather_ms / 1e3);
  rc.input_bytes.push_back(static_cast<double>(stage_input_bytes(st)));
}

}  // namespace

partition::Solution SplitEvaluator::solution(const std::vector<int>& cuts) const {
  return partition::evaluate_cuts(gp_.problem, cuts);
}

Candidate SplitEvaluator::evaluate(const std::vector<int>& cuts, bool scoring_only) {
  return evaluate(solution(cuts), scoring_only);
}

Candidate SplitEvaluator::evaluate(partition::Solution sol, bool scoring_only) {
  Candidate c;
  c.sol = std::move(sol);
  c.stage_of = partition::stage_of_nodes(gp_, c.sol, g_.num_nodes());
  const auto stages = c.sol.stages.size();
  partition::validate_assignment(g_, c.stage_of, static_cast<int>(stages));
  if (!trainable_) trainable_ = sorted_trainable_weights(g_);  // the same for every split
  const StageInterfaces io = stage_interfaces(g_, c.stage_of, &*trainable_);
  // Stages holding a common weight exchange its gradients before their optimizer steps.
  c.setup = s_;
  c.setup.shape.shared_groups = shared_weight_groups(io.shared_weights);
  auto known = schedules_.find(c.setup.shape.shared_groups);
  if (known == schedules_.end()) {
    schedule::Schedule built = setup_schedule(c.setup);
    schedule::ActivationMoments moments = schedule::activation_moments(built, c.setup.shape);
    known = schedules_
                .emplace(c.setup.shape.shared_groups,
                         KnownSchedule{schedule::prepare_schedule(std::move(built), c.setup.shape),
                                       std::move(moments)})
                .first;
  }
  const schedule::PreparedSchedule& prepared = known->second.prepared;
  c.schedule = prepared.schedule;
  const schedule::ActivationMoments& moments = known->second.moments;
  const bool may_recompute = s_.recompute != Recompute::kNone;
  std::vector<Stage> plain, with;
  std::vector<BackwardFacts> bwd;
  std::vector<bool> on(stages, s_.recompute == Recompute::kAll);
  for (std::size_t k = 0; k < stages; ++k) {
    bwd.push_back(backward(c.sol, k, io, c.stage_of));
    plain.push_back(make_stage(c.setup, c.sol, k, f_, g_, order_, io, c.stage_of, false,
                               bwd.back().arena, &arena_cache_, !scoring_only));
    if (!may_recompute) continue;
    with.push_back(make_stage(c.setup, c.sol, k, f_, g_, order_, io, c.stage_of, true,
                              bwd.back().arena, &arena_cache_, !scoring_only));
    // Memory: every stage whose memory recomputation lowers (the extra forward is the price
    // of a smaller peak).
    if (s_.recompute == Recompute::kAuto && s_.objective == Objective::kMemory)
      on[k] = with[k].memory.total() < plain[k].memory.total();
  }
  std::vector<const Stage*> picked(stages);
  for (std::size_t k = 0; k < stages; ++k) picked[k] = on[k] ? &with[k] : &plain[k];
  if (s_.recompute == Recompute::kAuto && s_.objective != Objective::kMemory) {
    // Speed: recompute only on the devices that do not fit without it, the stage that saves
    // the most first, until the device fits.
    // Every device at once, then again only the device whose stages changed.
    const std::vector<DeviceMemory> devices = device_memory(picked, moments);
    for (int d = 0; d < c.setup.shape.devices; ++d) {
      for (DeviceMemory dm = devices[static_cast<std::size_t>(d)];
           static_cast<double>(dm.total()) > capacity(); dm = device_memory(d, picked, moments)) {
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
  // The split as the plan has it, simulated: the prediction and every device's peak.
  // Only speed's recompute-auto assembles again (below); otherwise the stages move.
  const bool again = s_.recompute == Recompute::kAuto && s_.objective != Objective::kMemory;
  auto assemble = [&] {
    c.stages.clear();
    c.stages.reserve(stages);
    c.rc = {};
    for (std::size_t k = 0; k < stages; ++k) {
      Stage& picked_stage = on[k] ? with[k] : plain[k];
      c.stages.push_back(again ? picked_stage : std::move(picked_stage));
      const auto& span = c.sol.stages[k];
      note_stage(c.rc, c.stages[k], bwd[k], span_weights(f_, span.first, span.last).trainable);
    }
    c.predicted = predict(c.setup, c.schedule, c.sol, f_, g_, order_, batch_, c.stages, c.rc,
                          scoring_only ? nullptr : &c.timeline, &c.peaks, &prepared);
  };
  assemble();
  if (s_.recompute == Recompute::kAuto && s_.objective != Objective::kMemory) {
    // The simulated peak is the device's figure; where it leaves a device over that the
    // estimate above let through (zb-h1 holds activations until W, and what B leaves for W),
    // recompute more of its stages, the one that saves the most first. A device's peak depends
    // on its own stages alone (their bytes, in its own list's order), so every device over its
    // memory takes its next stage in the same round: the stages that end up recomputing are
    // those of one stage at a time, with a simulation a round rather than one a stage (20 a
    // candidate for the 175B zb-h1 plan).
    const auto devices = static_cast<std::size_t>(c.setup.shape.devices);
    for (;;) {
      std::vector<int> pick(devices, -1);
      std::vector<int64_t> most(devices, 0);
      for (std::size_t k = 0; k < stages; ++k) {
        const auto device = static_cast<std::size_t>(c.stages[k].device);
        int64_t saves = plain[k].memory.total() - with[k].memory.total();
        if (!on[k] && saves > most[device] &&
            static_cast<double>(c.peaks[device].peak_bytes) > capacity()) {
          most[device] = saves;
          pick[device] = static_cast<int>(k);
        }
      }
      bool picked = false;
      for (int k : pick) {
        if (k < 0) continue;
        on[static_cast<std::size_t>(k)] = true;
        picked = true;
      }
      if (!picked) break;
      assemble();
    }
  }
  double least_room = std::numeric_limits<double>::infinity();
  for (const DevicePeak& d : c.peaks) {
    double room = capacity() - static_cast<double>(d.peak_bytes);
    if (room < 0) c.overflow_bytes -= room;
    if (room < least_room) {
      least_room = room;
      c.worst_device = d.device;
    }
  }
  c.predicted.fits = c.overflow_bytes == 0;
  return c;
}

SimExtras SplitEvaluator::must_recompute(const partition::Solution& sol) const {
  SimExtras out;
  if (!s_.shape.training || s_.recompute == Recompute::kNone) return out;
  if (s_.recompute == Recompute::kAll) {
    out.on.assign(sol.stages.size(), true);
    return out;
  }
  // --recompute auto: a stage whose weights, gradients and optimizer state with the values its
  // microbatches in flight keep (the simulation's own figures, which leave out arenas, buffers
  // and its device's other stages) are already past the device recomputes in any split that
  // fits (make_stage counts at least as much). One that does not fit is no contender.
  const schedule::StageCosts plain = stage_costs(s_, sol, f_, SimExtras{});
  out.on.assign(sol.stages.size(), false);
  for (std::size_t k = 0; k < sol.stages.size(); ++k)
    out.on[k] = plain.static_bytes[k] + in_flight(s_, static_cast<int>(k)) *
                                            plain.activation_bytes[k] >
                capacity();
  return out;
}

double SplitEvaluator::step_bound_ms(const partition::Solution& sol) const {
  const schedule::PipelineShape& shape = s_.shape;
  // The simulator's own per-stage times (calibrated where the plan is), with recomputation
  // only where the split cannot do without it (which only adds elsewhere).
  const schedule::StageCosts c =
      with_terms(s_, sol, f_, stage_costs(s_, sol, f_, must_recompute(sol)));
  const std::size_t stages = c.forward_s.size();
  const double m = shape.microbatches;
  // Per stage: f its forward, b what the stage before it waits for (the input gradient; the
  // whole backward where the schedule does not split it), w the weight gradient it runs apart,
  // x the transfer to the next stage (each way; none between stages of one device), opt its
  // optimizer step (the last thing it does in a training step).
  std::vector<double> f(stages), b(stages), w(stages), x(stages, 0.0), opt(stages, 0.0);
  std::vector<double> busy(static_cast<std::size_t>(shape.devices), 0.0);
  for (std::size_t k = 0; k < stages; ++k) {
    const int stage = static_cast<int>(k);
    const bool split = shape.training && splits_backward(s_, stage);
    f[k] = c.forward_s[k];
    b[k] = shape.training ? c.backward_input_s[k] + (split ? 0.0 : c.backward_weight_s[k]) : 0.0;
    w[k] = split ? c.backward_weight_s[k] : 0.0;
    if (k + 1 < stages && k < c.send_s.size() &&
        schedule::device_of_stage(stage, shape) != schedule::device_of_stage(stage + 1, shape))
      x[k] = c.send_s[k];
    if (shape.training)
      opt[k] = c.optimizer_stage_s[k];  // stage_costs gives one per stage in training
    busy[static_cast<std::size_t>(schedule::device_of_stage(stage, shape))] +=
        m * (f[k] + b[k] + w[k]) + opt[k];
  }
  double bound = *std::max_element(busy.begin(), busy.end());
  // A microbatch goes forward through the stages in order and back in reverse, so stage j
  // starts no earlier than microbatch 1's forward through the stages before it (up), runs its
  // own m forwards and m backwards one at a time, and cannot run microbatch 1's backward before
  // that microbatch has been forward and back through every stage after it (round): until then
  // only its other m - 1 forwards can fill the stage. After its last backward, that gradient
  // goes back through the stages before it (down), and stage 0 then steps its optimizer; after
  // its last forward, that microbatch still goes forward and back through the stages after it.
  // Inference: after stage j's last forward the microbatch goes through the stages after it.
  double up = 0;
  double down = 0;
  double round = 0;  // training: forward and backward of the stages after j, and the transfers
  double ahead = 0;  // inference: forward of the stages after j, and the transfers
  for (std::size_t k = 0; k < stages; ++k) {
    round += f[k] + b[k] + 2 * x[k];
    ahead += f[k] + x[k];
  }
  for (std::size_t j = 0; j < stages; ++j) {
    round -= f[j] + b[j];
    ahead -= f[j];
    if (!shape.training) {
      bound = std::max(bound, up + m * f[j] + ahead);
    } else {
      const double last_backward =
          up + std::max(m * f[j] + round + b[j], m * b[j] + std::max(f[j] + round, m * f[j]));
      bound = std::max(bound, last_backward + down + opt[0]);
      bound = std::max(bound, up + m * (f[j] + b[j] + w[j]) +
                                  std::max(0.0, round - (m - 1) * f[j]) + opt[j]);
    }
    up += f[j] + x[j];
    down += b[j] + x[j];
    round -= 2 * x[j];
    ahead -= x[j];
  }
  return bound * 1e3;
}

partition::SplitScore SplitEvaluator::score(const Candidate& c) const {
  const auto step = c.predicted.step_ms;
  const auto peak = static_cast<double>(c.predicted.peak_memory_bytes);
  const bool speed = s_.objective != Objective::kMemory;
  return {c.predicted.fits, c.overflow_bytes, speed ? step : peak, speed ? peak : step};
}

BackwardFacts SplitEvaluator::backward(const partition::Solution& sol, std::size_t k,
                                       const StageInterfaces& io,
                                       const std::vector<int>& stage_of) {
  // The backward program of a span does not depend on the rest of the split.
  const std::pair<int, int> span{sol.stages[k].first, sol.stages[k].last};
  auto it = backward_cache_.find(span);
  if (it != backward_cache_.end()) return it->second;
  BackwardFacts facts = backward_facts(s_, sol, k, f_, g_, order_, io, stage_of, loss_output_);
  backward_cache_.emplace(span, facts);
  return facts;
}

}  // namespace stagecraft::plan::planning
