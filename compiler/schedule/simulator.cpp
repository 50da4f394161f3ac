#include "compiler/schedule/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "runtime/format/error.h"
#include "runtime/format/readiness.h"

namespace stagecraft::schedule {
namespace {

/// Marks a time that is not known yet (every real time is >= 0).
constexpr double kNotYet = -1;

/// Refuses costs that do not fit `stages` stages. `allowed` lists the sizes a vector may have.
void check_costs(const std::vector<double>& values, const char* name,
                 const std::vector<size_t>& allowed, int stages) {
  if (std::find(allowed.begin(), allowed.end(), values.size()) == allowed.end()) {
    fail(ErrorKind::kUsage, "stage costs: {} has {} entries; the pipeline has {} stages", name,
         values.size(), stages);
  }
  for (size_t stage = 0; stage < values.size(); ++stage) {
    if (!std::isfinite(values[stage]) || values[stage] < 0) {
      fail(ErrorKind::kUsage, "stage costs: {}[{}] is {}; it must be finite and >= 0", name, stage,
           values[stage]);
    }
  }
}

/// Whether `op` is compute (busy time on the device's processor).
bool is_compute(Op op) {
  return op == Op::kForward || op == Op::kBackward || op == Op::kBackwardInput ||
         op == Op::kBackwardWeight || op == Op::kOptimizerStep;
}

/// One run of the simulation. The devices' lists are played in order by the dependency rules of
/// runtime/format/readiness.h (an instruction runs once what it waits for has run); this class
/// gives each instruction its times. Times of finished work are kept per (stage, microbatch).
/// Every instruction's times depend only on its inputs, so the order in which devices are
/// visited does not change the result; with shared processors, compute instructions are played
/// in the order of the times they could start, which decides who takes the processor first.
class Simulation {
 public:
  Simulation(const Schedule& schedule, const PipelineShape& shape, const StageCosts& costs,
             const Processors& processors, SimDetail detail)
      : full_(detail == SimDetail::kFull),
        schedule_(schedule),
        shape_(shape),
        costs_(costs),
        stages_(stage_count(shape)),
        microbatches_(shape.microbatches),
        forward_end_(pair_times()),
        input_grad_end_(pair_times()),
        act_arrival_(pair_times()),
        act_received_(pair_times()),
        grad_arrival_(pair_times()),
        grad_received_(pair_times()),
        act_taken_(pair_times()),
        grad_taken_(pair_times()),
        act_taken_count_(stages_, 0),
        grad_taken_count_(stages_, 0),
        act_sends_(stages_, 0),
        grad_sends_(stages_, 0),
        shared_issued_(stages_, kNotYet),
        weight_gradients_(stages_, 0),
        allreduce_end_(stages_, 0),
        replica_link_free_(shape.devices, 0),
        free_at_(shape.devices, 0),
        memory_(shape.devices, 0),
        now_(shape.devices),
        link_free_(static_cast<size_t>(shape.devices) * static_cast<size_t>(shape.devices), 0),
        events_(shape.devices),
        overlap_(processors.overlap) {
    // Processors numbered densely; a simulation with one device per processor claims none.
    std::map<int, int> index;
    for (int p : processors.of_device) {
      auto [it, added] = index.emplace(p, static_cast<int>(index.size()));
      processor_of_.push_back(it->second);
      shared_ |= !added;
    }
    processor_free_.assign(index.size(), 0);
    for (size_t device = 0; device < costs.device_start_s.size(); ++device)
      free_at_[device] = costs.device_start_s[device];
    result_.device_busy_s.assign(shape.devices, 0);
    result_.device_peak_bytes.assign(shape.devices, 0);
    result_.device_peak_parts.resize(shape.devices);
    result_.memory_timeline.resize(shape.devices);
    // Every instruction leaves an event, and a few memory samples: room for them up front (a
    // split search simulates hundreds of schedules of thousands of instructions).
    for (size_t device = 0; full_ && device < schedule.size() && device < events_.size();
         ++device) {
      events_[device].reserve(schedule[device].size());
      result_.memory_timeline[device].reserve(2 * schedule[device].size() + 1);
    }
    if (!costs.static_bytes.empty()) {
      for (int stage = 0; stage < stages_; ++stage) {
        memory_[device_of_stage(stage, shape)] += costs.static_bytes[stage];
        now_[device_of_stage(stage, shape)].static_bytes += costs.static_bytes[stage];
      }
    }
    for (int device = 0; device < shape.devices; ++device) {
      result_.device_peak_bytes[device] = memory_[device];
      result_.device_peak_parts[device] = now_[device];
      record_memory(device, 0);
    }
  }

  SimResult run() {
    Readiness readiness(shape_);
    auto on_run = [this](int device, const Instruction& in) { time(device, in); };
    std::vector<size_t> next =
        shared_ ? play_in_time_order(readiness, on_run) : play(schedule_, readiness, on_run);
    check_finished(schedule_, next, readiness);
    return finish();
  }

  /// Whether some processor runs several devices (the order of play then follows the times).
  bool shared() const { return shared_; }

  /// Plays `order`, recorded by `play` on this schedule: every instruction after what it waits
  /// for, each device's in its list's order. The times depend only on that, so they are run()'s.
  SimResult run_in(const std::vector<PlayStep>& order) {
    for (const PlayStep& step : order)
      time(step.device, schedule_[static_cast<size_t>(step.device)][step.position]);
    return finish();
  }

 private:
  /// As `play`, with the compute instructions in the order of the times they could start: every
  /// other instruction that may run runs first (it claims no processor), then the compute
  /// instruction that could start first (ties: the lower device). Whatever has not yet become
  /// ready cannot start before that one, since it waits for work that starts no earlier.
  template <typename OnRun>
  std::vector<size_t> play_in_time_order(Readiness& readiness, OnRun on_run) {
    std::vector<size_t> next(schedule_.size(), 0);
    auto ready = [&](size_t device) {
      return next[device] < schedule_[device].size() &&
             readiness.ready(schedule_[device][next[device]]);
    };
    auto run = [&](size_t device) {
      const Instruction& in = schedule_[device][next[device]];
      on_run(static_cast<int>(device), in);
      readiness.mark_done(in);
      ++next[device];
    };
    for (;;) {
      bool moved = false;
      for (size_t device = 0; device < schedule_.size(); ++device)
        while (ready(device) && !is_compute(schedule_[device][next[device]].op)) {
          run(device);
          moved = true;
        }
      if (moved) continue;
      int first = -1;
      double first_start = 0;
      for (size_t device = 0; device < schedule_.size(); ++device) {
        if (!ready(device)) continue;
        const double start =
            earliest_start(static_cast<int>(device), schedule_[device][next[device]]);
        if (first < 0 || start < first_start) {
          first = static_cast<int>(device);
          first_start = start;
        }
      }
      if (first < 0) return next;
      run(static_cast<size_t>(first));
    }
  }

  /// When compute instruction `in` could start on `device` if its processor were free.
  double earliest_start(int device, const Instruction& in) const {
    return in.op == Op::kOptimizerStep ? shared_sum_ready(in.stage, free_at_[device])
                                       : free_at_[device];
  }

  /// When `stage`'s optimizer step, free to start at `start`, has the sum of every holder's
  /// gradients of its shared weights.
  double shared_sum_ready(int stage, double start) const {
    double summed = start;
    for (int partner : shared_partners(shape_, stage)) {
      summed = std::max(
          summed, shared_issued_[partner] +
                      (costs_.shared_allreduce_s.empty() ? 0 : costs_.shared_allreduce_s[stage]));
    }
    return summed;
  }

  /// A compute instruction of `duration` that could start at `start` on `device`: when its
  /// processor lets it start. Holds the processor for (1 - overlap) of the duration.
  double claim(int device, double start, double duration) {
    if (!shared_) return start;
    double& free = processor_free_[processor_of_[device]];
    start = std::max(start, free);
    free = start + (1 - overlap_) * duration;
    return start;
  }

  /// One kNotYet per (stage, microbatch).
  std::vector<double> pair_times() const {
    return std::vector<double>(static_cast<size_t>(stages_) * microbatches_, kNotYet);
  }

  size_t key(int stage, int microbatch) const {
    return static_cast<size_t>(stage) * microbatches_ + microbatch;
  }

  /// The fixed cost of an instruction of kind `op` (StageCosts::instruction_s).
  double fixed(Op op) const {
    const auto i = static_cast<size_t>(op);
    return i < costs_.instruction_s.size() ? costs_.instruction_s[i] : 0.0;
  }

  double optimizer_time(int stage) const {
    return costs_.optimizer_stage_s.empty() ? costs_.optimizer_s : costs_.optimizer_stage_s[stage];
  }

  double send_time(int from_stage) const {
    return costs_.send_s.empty() ? 0 : costs_.send_s[from_stage];
  }

  /// backward_bytes of `stage`, held from `start` to `end`.
  void transient(int device, int stage, double start, double end) {
    double bytes = costs_.backward_bytes.empty() ? 0 : costs_.backward_bytes[stage];
    add_memory(device, start, bytes, &PeakParts::backward_bytes);
    add_memory(device, end, -bytes, &PeakParts::backward_bytes);
  }

  double deferred(int stage) const {
    return costs_.deferred_bytes.empty() ? 0 : costs_.deferred_bytes[stage];
  }

  double activation(int stage) const {
    return costs_.activation_bytes.empty() ? 0 : costs_.activation_bytes[stage];
  }

  /// Gives `in`, which may run now (everything it waits for has run), its times on `device`.
  void time(int device, const Instruction& in) {
    double start = free_at_[device];
    switch (in.op) {
      case Op::kRecvAct:
      case Op::kRecvGrad: {
        bool act = in.op == Op::kRecvAct;
        double arrival = (act ? act_arrival_ : grad_arrival_)[key(in.stage, in.microbatch)];
        double end = std::max(start, arrival) + fixed(in.op);
        (act ? act_received_ : grad_received_)[key(in.stage, in.microbatch)] = end;
        const int link = act ? in.stage - 1 : in.stage + 1;
        int& taken = (act ? act_taken_count_ : grad_taken_count_)[link];
        if (taken >= microbatches_)
          fail(ErrorKind::kInternal, "stage {} received more than {} messages from stage {}",
               in.stage, microbatches_, link);
        (act ? act_taken_ : grad_taken_)[key(link, taken++)] = end;
        wait(device, in, start, end);
        return;
      }
      case Op::kSendAct:
      case Op::kSendGrad: {
        bool act = in.op == Op::kSendAct;
        double produced = (act ? forward_end_ : input_grad_end_)[key(in.stage, in.microbatch)];
        int peer = act ? in.stage + 1 : in.stage - 1;
        // A full link: the device waits until the receiver takes the message that frees a slot.
        int& sends = (act ? act_sends_ : grad_sends_)[in.stage];
        const std::vector<double>& taken = act ? act_taken_ : grad_taken_;
        const int capacity = link_capacity(shape_);
        if (sends >= capacity) {
          const double slot = taken[key(in.stage, sends - capacity)];
          if (slot > free_at_[device]) free_at_[device] = slot;
          start = std::max(start, slot);
        }
        ++sends;
        if (fixed(in.op) > 0) {  // handing the tensors to the link holds the device
          start = std::max(start, produced) + fixed(in.op);
          free_at_[device] = std::max(free_at_[device], start);
        }
        transfer(device, in, peer, std::max(start, produced), send_time(act ? in.stage : peer),
                 (act ? act_arrival_ : grad_arrival_)[key(peer, in.microbatch)]);
        return;
      }
      case Op::kForward: {
        const double duration = costs_.forward_s[in.stage] + fixed(in.op);
        start = claim(device, start, duration);
        if (activation(in.stage) > 0) ++now_[device].activations_held;
        add_memory(device, start, activation(in.stage), &PeakParts::activation_bytes);
        forward_end_[key(in.stage, in.microbatch)] = compute(device, in, start, duration);
        return;
      }
      case Op::kBackward:
      case Op::kBackwardInput: {
        size_t k = key(in.stage, in.microbatch);
        bool full = in.op == Op::kBackward;
        double duration = costs_.backward_input_s[in.stage] +
                          (full ? costs_.backward_weight_s[in.stage] : 0) + fixed(in.op);
        start = claim(device, start, duration);
        input_grad_end_[k] = compute(device, in, start, duration);
        transient(device, in.stage, start, input_grad_end_[k]);
        if (full)
          weight_gradient_done(device, in.stage, start, input_grad_end_[k]);
        else
          add_memory(device, input_grad_end_[k], deferred(in.stage), &PeakParts::deferred_bytes);
        return;
      }
      case Op::kBackwardWeight: {
        const double duration = costs_.backward_weight_s[in.stage] + fixed(in.op);
        start = claim(device, start, duration);
        double end = compute(device, in, start, duration);
        transient(device, in.stage, start, end);
        add_memory(device, end, -deferred(in.stage), &PeakParts::deferred_bytes);
        weight_gradient_done(device, in.stage, start, end);
        return;
      }
      case Op::kAllReduce:
        // The buckets went on the link during and after the last backward: wait for the last.
        wait(device, in, start, std::max(start, allreduce_end_[in.stage]) + fixed(in.op));
        return;
      case Op::kAllReduceShared:
        shared_issued_[in.stage] = start;
        wait(device, in, start, start + fixed(in.op));
        return;
      case Op::kOptimizerStep: {
        // A stage holding shared weights updates them with the sum of every holder's gradient.
        const double duration = optimizer_time(in.stage) + fixed(in.op);
        const double summed = claim(device, shared_sum_ready(in.stage, start), duration);
        const double end = compute(device, in, summed, duration);
        // ZeRO-1: the updated shards come round the replicas' ring before the weights are read.
        // The instruction's event spans both; only the update is busy time.
        if (!costs_.allgather_s.empty() && costs_.allgather_s[in.stage] > 0) {
          free_at_[device] = end + costs_.allgather_s[in.stage];
          if (full_) events_[device].back().end_s = free_at_[device];
        }
        return;
      }
    }
  }

  /// Busy time on the device; returns the end.
  double compute(int device, const Instruction& in, double start, double duration) {
    double end = start + duration;
    free_at_[device] = end;
    result_.device_busy_s[device] += duration;
    event(device, in, start, end);
    return end;
  }

  /// Time the device spends not computing (a receive, an all-reduce).
  void wait(int device, const Instruction& in, double start, double end) {
    free_at_[device] = end;
    event(device, in, start, end);
  }

  /// The event of `in` on `device`, kept with SimDetail::kFull.
  void event(int device, const Instruction& in, double start, double end) {
    if (full_) events_[device].push_back({device, in.op, in.stage, in.microbatch, start, end});
  }

  /// Queues a transfer issued at `issue` on the link to the peer's device; sets `arrival`.
  void transfer(int device, const Instruction& in, int peer, double issue, double duration,
                double& arrival) {
    int peer_device = device_of_stage(peer, shape_);
    double start = issue;
    double end = issue;
    if (peer_device != device) {
      double& link_free =
          link_free_[static_cast<size_t>(device) * static_cast<size_t>(shape_.devices) +
                     static_cast<size_t>(peer_device)];
      start = std::max(issue, link_free);
      end = start + duration;
      link_free = end;
    }
    arrival = end;
    last_transfer_end_ = std::max(last_transfer_end_, end);
    event(device, in, start, end);
  }

  /// The weight gradients of one microbatch of `stage`, computed from `start` to `end`: after
  /// the step's last, its all-reduce's buckets go on the replica link as they become final.
  void weight_gradient_done(int device, int stage, double start, double end) {
    if (activation(stage) > 0) --now_[device].activations_held;
    add_memory(device, end, -activation(stage), &PeakParts::activation_bytes);
    if (++weight_gradients_[stage] != microbatches_) return;
    const double total = costs_.allreduce_s.empty() ? 0 : costs_.allreduce_s[stage];
    const int buckets = costs_.allreduce_buckets.empty()
                            ? 1
                            : std::max(1, static_cast<int>(costs_.allreduce_buckets[stage]));
    double& link = replica_link_free_[device];
    if (total == 0) {  // no all-reduce: the loop below would leave the last bucket's ready time
      link = std::max(link, start + (end - start) * buckets / buckets);
      allreduce_end_[stage] = end;
      return;
    }
    for (int k = 1; k <= buckets; ++k) {
      const double ready = start + (end - start) * k / buckets;
      link = std::max(link, ready) + total / buckets;
    }
    allreduce_end_[stage] = total > 0 ? link : end;
  }

  /// Adds `bytes` to the device's memory, and to its `part`, at `time`.
  void add_memory(int device, double time, double bytes, double PeakParts::*part) {
    if (bytes == 0) return;
    memory_[device] += bytes;
    now_[device].*part += bytes;
    record_memory(device, time);
  }

  /// A device's calls come in time order (each instruction's changes at its start, then at its
  /// end, and the next instruction starts after it), so the first maximum is the first instant
  /// of the peak.
  void record_memory(int device, double time) {
    if (full_) result_.memory_timeline[device].emplace_back(time, memory_[device]);
    if (memory_[device] > result_.device_peak_bytes[device]) {
      result_.device_peak_bytes[device] = memory_[device];
      result_.device_peak_parts[device] = now_[device];
      result_.device_peak_parts[device].time_s = time;
    }
  }

  SimResult finish() {
    double step = last_transfer_end_;
    for (double end : free_at_) step = std::max(step, end);
    step += costs_.step_overhead_s;
    result_.step_s = step;
    double idle_total = 0;
    size_t events = 0;
    for (const auto& list : events_) events += list.size();
    result_.events.reserve(events);
    for (int device = 0; device < shape_.devices; ++device) {
      double idle = step - result_.device_busy_s[device];
      result_.device_idle_s.push_back(idle);
      idle_total += idle;
      result_.events.insert(result_.events.end(), events_[device].begin(), events_[device].end());
    }
    result_.bubble_fraction = step > 0 ? idle_total / (shape_.devices * step) : 0;
    return std::move(result_);
  }

  bool full_;  ///< SimDetail::kFull: events and memory timelines kept.
  const Schedule& schedule_;
  const PipelineShape& shape_;
  const StageCosts& costs_;
  int stages_;
  int microbatches_;
  // Per (stage, microbatch), when each piece of work ended or each transfer arrived.
  std::vector<double> forward_end_, input_grad_end_;
  std::vector<double> act_arrival_, act_received_, grad_arrival_, grad_received_;
  /// Per sending stage, when the receiver took each message of its activation link and of its
  /// gradient link (in order: at key(stage, k) the k-th; one a microbatch, so one array of the
  /// (stage, microbatch) pairs' size rather than a growing list per stage), how many were taken,
  /// and how many it has sent on each: a send waits for a slot (readiness.h's bounded links).
  std::vector<double> act_taken_, grad_taken_;
  std::vector<int> act_taken_count_, grad_taken_count_;
  std::vector<int> act_sends_, grad_sends_;
  std::vector<double> shared_issued_;                ///< Per stage, its ALLREDUCE_SHARED.
  std::vector<int> weight_gradients_;  ///< Per stage, microbatches whose weight gradients ran.
  std::vector<double> allreduce_end_;  ///< Per stage, when its all-reduce has arrived.
  std::vector<double> replica_link_free_;            ///< Per device, its link to the replicas.
  std::vector<double> free_at_;                      ///< Per device.
  std::vector<double> memory_;                       ///< Per device, bytes now.
  std::vector<PeakParts> now_;                       ///< Per device, its parts now.
  std::vector<double> link_free_;  ///< Per (source, destination) device: source x P + destination.
  double last_transfer_end_ = 0;
  std::vector<std::vector<TimelineEvent>> events_;  ///< Per device.
  double overlap_;                                  ///< Processors::overlap.
  bool shared_ = false;                             ///< Some processor runs several devices.
  std::vector<int> processor_of_;                   ///< Per device, its processor (dense).
  std::vector<double> processor_free_;              ///< Per processor, when it may be claimed.
  SimResult result_;
};

/// Refuses instructions the simulation cannot index: a stage outside the pipeline or of
/// another device, a microbatch out of range, a send past either end.
void check_instructions(const Schedule& schedule, const PipelineShape& shape) {
  int stages = stage_count(shape);
  // Each stage's device once (a split search checks every candidate's list of thousands).
  std::vector<int> device_of(static_cast<size_t>(stages));
  for (int stage = 0; stage < stages; ++stage) device_of[stage] = device_of_stage(stage, shape);
  for (int device = 0; device < shape.devices; ++device) {
    for (size_t position = 0; position < schedule[device].size(); ++position) {
      const Instruction& in = schedule[device][position];
      bool step_level = is_step_level(in.op);
      bool fits = in.stage >= 0 && in.stage < stages && device_of[in.stage] == device &&
                  (step_level ? in.microbatch == -1
                              : in.microbatch >= 0 && in.microbatch < shape.microbatches) &&
                  !((in.op == Op::kSendAct || in.op == Op::kRecvGrad) && in.stage == stages - 1) &&
                  !((in.op == Op::kSendGrad || in.op == Op::kRecvAct) && in.stage == 0);
      if (!fits) {
        fail(ErrorKind::kPlan,
             "device {} instruction {} ({}) is outside a pipeline of {} stages and {} microbatches",
             device, position, to_string(in), stages, shape.microbatches);
      }
      bool training_only = in.op == Op::kRecvGrad || in.op == Op::kSendGrad ||
                           in.op == Op::kBackward || in.op == Op::kBackwardInput ||
                           in.op == Op::kBackwardWeight || step_level;
      if (training_only && !shape.training) {
        fail(ErrorKind::kPlan,
             "device {} instruction {} ({}) is a training op in an inference schedule", device,
             position, to_string(in));
      }
    }
  }
}

}  // namespace

double SimResult::samples_per_s(int batch) const { return step_s > 0 ? batch / step_s : 0; }

namespace {

/// The checks of `schedule` itself on `shape` that simulate makes: the shape, one list per
/// device, every instruction within the pipeline, the shared-weight groups.
void check_schedule_for(const Schedule& schedule, const PipelineShape& shape) {
  if (shape.devices < 1 || shape.chunks < 1 || shape.microbatches < 1) {
    fail(ErrorKind::kUsage, "pipeline shape needs P, V, M >= 1, not P={} V={} M={}", shape.devices,
         shape.chunks, shape.microbatches);
  }
  if (schedule.size() != static_cast<size_t>(shape.devices)) {
    fail(ErrorKind::kPlan, "schedule has {} device lists; the pipeline has {} devices",
         schedule.size(), shape.devices);
  }
  check_instructions(schedule, shape);
  check_shared_groups(shape, ErrorKind::kPlan);
}

/// The checks of `costs` and `processors` against `shape` that simulate makes.
void check_costs_for(const PipelineShape& shape, const StageCosts& costs,
                     const Processors& processors) {
  size_t stages = stage_count(shape);
  int count = static_cast<int>(stages);
  check_costs(costs.forward_s, "forward_s", {stages}, count);
  // Inference needs no backward times.
  std::vector<size_t> backward_sizes =
      shape.training ? std::vector<size_t>{stages} : std::vector<size_t>{0, stages};
  check_costs(costs.backward_input_s, "backward_input_s", backward_sizes, count);
  check_costs(costs.backward_weight_s, "backward_weight_s", backward_sizes, count);
  check_costs(costs.send_s, "send_s", {0, stages - 1, stages}, count);
  check_costs(costs.allreduce_s, "allreduce_s", {0, stages}, count);
  check_costs(costs.allreduce_buckets, "allreduce_buckets", {0, stages}, count);
  check_costs(costs.allgather_s, "allgather_s", {0, stages}, count);
  check_costs(costs.shared_allreduce_s, "shared_allreduce_s", {0, stages}, count);
  check_costs(costs.activation_bytes, "activation_bytes", {0, stages}, count);
  check_costs(costs.static_bytes, "static_bytes", {0, stages}, count);
  check_costs(costs.deferred_bytes, "deferred_bytes", {0, stages}, count);
  check_costs(costs.backward_bytes, "backward_bytes", {0, stages}, count);
  check_costs(costs.optimizer_stage_s, "optimizer_stage_s", {0, stages}, count);
  if (!costs.instruction_s.empty() && costs.instruction_s.size() != kInstructionKinds)
    fail(ErrorKind::kUsage,
         "stage costs: instruction_s has {} entries; there are {} instruction kinds",
         costs.instruction_s.size(), kInstructionKinds);
  check_costs(costs.instruction_s, "instruction_s", {0, kInstructionKinds}, count);
  if (!costs.device_start_s.empty() &&
      costs.device_start_s.size() != static_cast<size_t>(shape.devices))
    fail(ErrorKind::kUsage,
         "stage costs: device_start_s has {} entries; the pipeline has {} devices",
         costs.device_start_s.size(), shape.devices);
  check_costs(costs.device_start_s, "device_start_s", {0, static_cast<size_t>(shape.devices)},
              count);
  if (!std::isfinite(costs.optimizer_s) || costs.optimizer_s < 0) {
    fail(ErrorKind::kUsage, "stage costs: optimizer_s is {}; it must be finite and >= 0",
         costs.optimizer_s);
  }
  if (!std::isfinite(costs.step_overhead_s) || costs.step_overhead_s < 0)
    fail(ErrorKind::kUsage, "stage costs: step_overhead_s is {}; it must be finite and >= 0",
         costs.step_overhead_s);
  if (!processors.of_device.empty() &&
      processors.of_device.size() != static_cast<size_t>(shape.devices))
    fail(ErrorKind::kUsage, "processors: {} entries for a pipeline of {} devices",
         processors.of_device.size(), shape.devices);
  if (!(processors.overlap >= 0 && processors.overlap < 1))
    fail(ErrorKind::kUsage, "processors: overlap is {}; it must be in [0, 1)", processors.overlap);
}

}  // namespace

SimResult simulate(const Schedule& schedule, const PipelineShape& shape, const StageCosts& costs,
                   const Processors& processors, SimDetail detail) {
  check_schedule_for(schedule, shape);
  check_costs_for(shape, costs, processors);
  return Simulation(schedule, shape, costs, processors, detail).run();
}

PreparedSchedule prepare_schedule(Schedule schedule, const PipelineShape& shape) {
  check_schedule_for(schedule, shape);
  PreparedSchedule out;
  out.shape = shape;
  Readiness readiness(shape);
  std::vector<size_t> at(schedule.size(), 0);  // per device, the position of its next instruction
  const std::vector<size_t> next = play(schedule, readiness, [&](int device, const Instruction&) {
    out.order.push_back({device, at[static_cast<size_t>(device)]++});
  });
  check_finished(schedule, next, readiness);
  out.schedule = std::move(schedule);
  return out;
}

SimResult simulate(const PreparedSchedule& prepared, const StageCosts& costs,
                   const Processors& processors, SimDetail detail) {
  check_costs_for(prepared.shape, costs, processors);
  Simulation simulation(prepared.schedule, prepared.shape, costs, processors, detail);
  // Devices that share a processor take turns by the times: the order of play follows them.
  return simulation.shared() ? simulation.run() : simulation.run_in(prepared.order);
}

namespace {

/// Walks the lists of devices [first, last) in order: `held(device, stage, delta)` at each
/// forward (+1) and at the end of each backward or B (-1), `running(device, stage)` while a
/// backward, B or W runs.
template <typename Held, typename Running>
void walk_activations(const Schedule& schedule, const PipelineShape& shape, int first, int last,
                      Held held, Running running) {
  const int stages = stage_count(shape);
  for (int device = first; device < last && device < static_cast<int>(schedule.size()); ++device) {
    for (const Instruction& in : schedule[device]) {
      if (in.stage < 0 || in.stage >= stages) continue;
      switch (in.op) {
        case Op::kForward:
          held(device, in.stage, +1);
          break;
        case Op::kBackward:
        case Op::kBackwardInput:
          running(device, in.stage);
          held(device, in.stage, -1);
          break;
        case Op::kBackwardWeight:
          running(device, in.stage);
          break;
        default:
          break;
      }
    }
  }
}

}  // namespace

std::vector<int64_t> stage_in_flight_peaks(const Schedule& schedule, const PipelineShape& shape) {
  const int stages = stage_count(shape);
  std::vector<int64_t> now(stages, 0), peak(stages, 0);
  walk_activations(
      schedule, shape, 0, shape.devices,
      [&](int, int stage, int delta) {
        now[stage] += delta;
        peak[stage] = std::max(peak[stage], now[stage]);
      },
      [](int, int) {});
  return peak;
}

namespace {

/// Checks activation_peaks' arguments.
void check_peak_costs(const std::vector<double>& kept_bytes,
                      const std::vector<double>& backward_bytes, const PipelineShape& shape,
                      int only_device) {
  const auto stages = static_cast<size_t>(stage_count(shape));
  check_costs(kept_bytes, "kept_bytes", {0, stages}, static_cast<int>(stages));
  check_costs(backward_bytes, "backward_bytes", {0, stages}, static_cast<int>(stages));
  if (only_device >= shape.devices) {
    fail(ErrorKind::kUsage, "activation peaks: device {} of a pipeline of {}", only_device,
         shape.devices);
  }
}

/// The activations a device holds at a point of its list: `held[i]` microbatches of its stage
/// `stages[i]`, plus the backward_bytes of `stages[running]` when running >= 0. One formula,
/// summed in one order, for the walk and the moments, so the two agree to the bit.
double held_bytes(const std::vector<int>& stages, const std::vector<int64_t>& held, int running,
                  const std::vector<double>& kept_bytes,
                  const std::vector<double>& backward_bytes) {
  double bytes = 0;
  if (!kept_bytes.empty())
    for (size_t i = 0; i < stages.size(); ++i)
      bytes += static_cast<double>(held[i]) * kept_bytes[stages[i]];
  if (running >= 0 && !backward_bytes.empty()) bytes += backward_bytes[stages[running]];
  return bytes;
}

/// Per device, its stages ascending; per stage, its index there.
void device_stages(const PipelineShape& shape, std::vector<std::vector<int>>& stages,
                   std::vector<int>& local) {
  const int count = stage_count(shape);
  stages.assign(shape.devices, {});
  local.assign(count, 0);
  for (int stage = 0; stage < count; ++stage) {
    std::vector<int>& mine = stages[device_of_stage(stage, shape)];
    local[stage] = static_cast<int>(mine.size());
    mine.push_back(stage);
  }
}

/// Calls `at(device, held, running)` at every point of the devices' lists [first, last) where
/// activations may peak: after each forward, and while each backward, B or W runs.
template <typename At>
void activation_points(const Schedule& schedule, const PipelineShape& shape,
                       const std::vector<std::vector<int>>& stages, const std::vector<int>& local,
                       int first, int last, At at) {
  std::vector<std::vector<int64_t>> held(shape.devices);
  for (int device = 0; device < shape.devices; ++device)
    held[device].assign(stages[device].size(), 0);
  walk_activations(
      schedule, shape, first, last,
      [&](int device, int stage, int delta) {
        held[device][local[stage]] += delta;
        if (delta > 0) at(device, held[device], -1);
      },
      [&](int device, int stage) { at(device, held[device], local[stage]); });
}

}  // namespace

std::vector<double> activation_peaks(const Schedule& schedule, const PipelineShape& shape,
                                     const std::vector<double>& kept_bytes,
                                     const std::vector<double>& backward_bytes, int only_device) {
  check_peak_costs(kept_bytes, backward_bytes, shape, only_device);
  std::vector<std::vector<int>> stages;
  std::vector<int> local;
  device_stages(shape, stages, local);
  std::vector<double> peak(shape.devices, 0);
  activation_points(schedule, shape, stages, local, only_device < 0 ? 0 : only_device,
                    only_device < 0 ? shape.devices : only_device + 1,
                    [&](int device, const std::vector<int64_t>& held, int running) {
                      peak[device] = std::max(
                          peak[device],
                          held_bytes(stages[device], held, running, kept_bytes, backward_bytes));
                    });
  return peak;
}

ActivationMoments activation_moments(const Schedule& schedule, const PipelineShape& shape) {
  ActivationMoments out;
  out.shape = shape;
  std::vector<int> local;
  device_stages(shape, out.stages, local);
  std::vector<std::vector<ActivationMoment>> seen(shape.devices);
  activation_points(schedule, shape, out.stages, local, 0, shape.devices,
                    [&](int device, const std::vector<int64_t>& held, int running) {
                      seen[device].push_back({held, running});
                    });
  // Moment a is covered by b when b holds at least as much of every stage and runs the same
  // backward, or a runs none (bytes are never negative).
  auto covers = [](const ActivationMoment& b, const ActivationMoment& a) {
    if (a.running >= 0 && a.running != b.running) return false;
    for (size_t i = 0; i < a.held.size(); ++i)
      if (b.held[i] < a.held[i]) return false;
    return true;
  };
  out.moments.assign(shape.devices, {});
  for (int device = 0; device < shape.devices; ++device) {
    auto& points = seen[device];
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    for (size_t i = 0; i < points.size(); ++i) {
      bool dominated = false;
      for (size_t j = 0; j < points.size() && !dominated; ++j)
        dominated = j != i && covers(points[j], points[i]);  // distinct: a strict cover
      if (!dominated) out.moments[device].push_back(points[i]);
    }
  }
  return out;
}

std::vector<double> activation_peaks(const ActivationMoments& moments,
                                     const std::vector<double>& kept_bytes,
                                     const std::vector<double>& backward_bytes, int only_device) {
  const PipelineShape& shape = moments.shape;
  check_peak_costs(kept_bytes, backward_bytes, shape, only_device);
  std::vector<double> peak(shape.devices, 0);
  const int first = only_device < 0 ? 0 : only_device;
  const int last = only_device < 0 ? shape.devices : only_device + 1;
  for (int device = first; device < last; ++device)
    for (const ActivationMoment& m : moments.moments[device])
      peak[device] = std::max(peak[device], held_bytes(moments.stages[device], m.held, m.running,
                                                       kept_bytes, backward_bytes));
  return peak;
}

}  // namespace stagecraft::schedule
