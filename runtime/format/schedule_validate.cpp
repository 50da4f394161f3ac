// validate_schedule: the structural rules every schedule obeys, whoever built it (a compiler
// builder, a person editing schedule.json, a future search), then a play in order for deadlocks.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "runtime/format/error.h"
#include "runtime/format/readiness.h"
#include "runtime/format/schedule.h"

namespace stagecraft::schedule {
namespace {

constexpr int kAbsent = -1;
constexpr int kOpCount = static_cast<int>(Op::kOptimizerStep) + 1;

/// The peer stage a send or receive must name.
int expected_peer(const Instruction& in) {
  return in.op == Op::kRecvAct || in.op == Op::kSendGrad ? in.stage - 1 : in.stage + 1;
}

/// Where every instruction of the schedule stands in its device's list, per op and per
/// (stage, microbatch) or per stage for step-level ops.
class Positions {
 public:
  Positions(const Schedule& schedule, const PipelineShape& shape)
      : schedule_(schedule),
        shape_(shape),
        stages_(stage_count(shape)),
        slots_(static_cast<size_t>(kOpCount) * stages_ * shape.microbatches, kAbsent) {}

  /// Records every instruction, refusing those that do not belong and duplicates.
  void collect() {
    for (int device = 0; device < shape_.devices; ++device) {
      for (size_t index = 0; index < schedule_[device].size(); ++index) {
        const Instruction& in = schedule_[device][index];
        int position = static_cast<int>(index);
        check_fields(device, position, in);
        int& slot = at(in.op, in.stage, is_step_level(in.op) ? 0 : in.microbatch);
        if (slot != kAbsent) {
          fault(device, position, fmt::format("appears twice (first at instruction {})", slot));
        }
        slot = position;
      }
    }
  }

  /// The position of `op` for (stage, microbatch), or kAbsent.
  int& at(Op op, int stage, int microbatch) {
    size_t index = (static_cast<size_t>(op) * stages_ + stage) * shape_.microbatches + microbatch;
    return slots_[index];
  }

  /// Throws for the instruction at `position` on `device`.
  [[noreturn]] void fault(int device, int position, const std::string& problem) const {
    fail(ErrorKind::kPlan, "device {} instruction {} ({}): {}", device, position,
         to_string(schedule_[device][position]), problem);
  }

 private:
  void check_fields(int device, int position, const Instruction& in) const {
    if (static_cast<int>(in.op) < 0 || static_cast<int>(in.op) >= kOpCount) {
      fault(device, position, "unknown op");
    }
    if (in.stage < 0 || in.stage >= stages_) {
      fault(device, position, fmt::format("stage outside 0..{}", stages_ - 1));
    }
    if (device_of_stage(in.stage, shape_) != device) {
      fault(
          device, position,
          fmt::format("stage {} lives on device {}", in.stage, device_of_stage(in.stage, shape_)));
    }
    if (is_step_level(in.op) ? in.microbatch != -1
                             : in.microbatch < 0 || in.microbatch >= shape_.microbatches) {
      fault(device, position,
            is_step_level(in.op)
                ? std::string("a step-level op takes microbatch -1")
                : fmt::format("microbatch outside 0..{}", shape_.microbatches - 1));
    }
    if (is_transfer(in.op)) {
      int peer = expected_peer(in);
      if (peer < 0 || peer >= stages_) {
        fault(device, position, fmt::format("stage {} has no neighbour there", in.stage));
      }
      if (in.peer_stage != peer) {
        fault(device, position, fmt::format("peer must be stage {}, not {}", peer, in.peer_stage));
      }
    } else if (in.peer_stage != -1) {
      fault(device, position,
            fmt::format("only sends and receives name a peer, not {}", in.peer_stage));
    }
    bool training_only = in.op != Op::kRecvAct && in.op != Op::kForward && in.op != Op::kSendAct;
    if (training_only && !shape_.training) fault(device, position, "a training op in inference");
  }

  const Schedule& schedule_;
  const PipelineShape& shape_;
  int stages_;
  std::vector<int> slots_;
};

/// Checks the ops of one (stage, microbatch): counts, order on the device, transfers.
void check_pair(Positions& positions, const PipelineShape& shape, int stage, int mb) {
  int device = device_of_stage(stage, shape);
  int last = stage_count(shape) - 1;
  auto missing = [&](const std::string& what) {
    fail(ErrorKind::kPlan, "device {}: stage {} mb {} has no {}", device, stage, mb, what);
  };
  auto after = [&](int position, int earlier, const std::string& what) {
    if (position < earlier) positions.fault(device, position, "comes before its " + what);
  };
  int forward = positions.at(Op::kForward, stage, mb);
  if (forward == kAbsent) missing("FWD");
  if (stage > 0) {
    int recv = positions.at(Op::kRecvAct, stage, mb);
    if (recv == kAbsent) missing("RECV_ACT");
    after(forward, recv, "RECV_ACT");
    if (positions.at(Op::kSendAct, stage - 1, mb) == kAbsent) {
      positions.fault(device, recv, fmt::format("no SEND_ACT from stage {} matches it", stage - 1));
    }
  }
  if (stage < last) {
    int send = positions.at(Op::kSendAct, stage, mb);
    if (send == kAbsent) missing("SEND_ACT");
    after(send, forward, "FWD");
  }
  if (!shape.training) return;

  int full = positions.at(Op::kBackward, stage, mb);
  int input = positions.at(Op::kBackwardInput, stage, mb);
  int weight = positions.at(Op::kBackwardWeight, stage, mb);
  if (full != kAbsent && (input != kAbsent || weight != kAbsent)) {
    positions.fault(device, full, "the same microbatch also has BWD_INPUT or BWD_WEIGHT");
  }
  if (full == kAbsent && input == kAbsent) missing(weight == kAbsent ? "BWD" : "BWD_INPUT");
  if (input != kAbsent && weight == kAbsent) missing("BWD_WEIGHT");
  int backward = full != kAbsent ? full : input;
  after(backward, forward, "FWD");
  if (weight != kAbsent) after(weight, input, "BWD_INPUT");
  if (stage < last) {
    int recv = positions.at(Op::kRecvGrad, stage, mb);
    if (recv == kAbsent) missing("RECV_GRAD");
    after(backward, recv, "RECV_GRAD");
    if (positions.at(Op::kSendGrad, stage + 1, mb) == kAbsent) {
      positions.fault(device, recv,
                      fmt::format("no SEND_GRAD from stage {} matches it", stage + 1));
    }
  }
  if (stage > 0) {
    int send = positions.at(Op::kSendGrad, stage, mb);
    if (send == kAbsent) missing("SEND_GRAD");
    after(send, backward, "backward");
  }
}

/// Checks the step-level ops of one stage: one optimizer step after every weight gradient,
/// an all-reduce (required with data parallelism) between them.
void check_step(Positions& positions, const PipelineShape& shape, int stage) {
  int device = device_of_stage(stage, shape);
  int last_gradient = kAbsent;
  for (int mb = 0; mb < shape.microbatches; ++mb) {
    last_gradient = std::max({last_gradient, positions.at(Op::kBackward, stage, mb),
                              positions.at(Op::kBackwardWeight, stage, mb)});
  }
  int optimizer = positions.at(Op::kOptimizerStep, stage, 0);
  int all_reduce = positions.at(Op::kAllReduce, stage, 0);
  if (optimizer == kAbsent) {
    fail(ErrorKind::kPlan, "device {}: stage {} has no OPT_STEP", device, stage);
  }
  if (optimizer < last_gradient) {
    positions.fault(device, optimizer, "comes before the stage's last weight gradient");
  }
  // The shared weights' exchange: exactly for their holders, after the last weight gradient
  // and before the optimizer step (which waits for every partner's; the play in order checks that).
  int shared = positions.at(Op::kAllReduceShared, stage, 0);
  if (shared == kAbsent && holds_shared(shape, stage)) {
    fail(ErrorKind::kPlan, "device {}: stage {} holds shared weights but has no ALLREDUCE_SHARED",
         device, stage);
  }
  if (shared != kAbsent) {
    if (!holds_shared(shape, stage)) {
      positions.fault(device, shared, "the stage holds no shared weight");
    }
    if (shared < last_gradient) {
      positions.fault(device, shared, "comes before the stage's last weight gradient");
    }
    if (optimizer < shared) positions.fault(device, optimizer, "comes before its ALLREDUCE_SHARED");
  }
  if (all_reduce == kAbsent) {
    if (shape.data_parallel > 1) {
      fail(ErrorKind::kPlan, "device {}: stage {} has no ALLREDUCE with {} data-parallel replicas",
           device, stage, shape.data_parallel);
    }
    return;
  }
  if (all_reduce < last_gradient) {
    positions.fault(device, all_reduce, "comes before the stage's last weight gradient");
  }
  if (optimizer < all_reduce) positions.fault(device, optimizer, "comes before its ALLREDUCE");
}

}  // namespace

void validate_schedule(const Schedule& schedule, const PipelineShape& shape) {
  if (shape.devices < 1 || shape.chunks < 1 || shape.microbatches < 1 || shape.data_parallel < 1) {
    fail(ErrorKind::kPlan, "pipeline shape needs P, V, M, DP >= 1, not P={} V={} M={} DP={}",
         shape.devices, shape.chunks, shape.microbatches, shape.data_parallel);
  }
  if (schedule.size() != static_cast<size_t>(shape.devices)) {
    fail(ErrorKind::kPlan, "schedule has {} device lists; the pipeline has {} devices",
         schedule.size(), shape.devices);
  }
  check_shared_groups(shape, ErrorKind::kPlan);
  Positions positions(schedule, shape);
  positions.collect();
  int stages = stage_count(shape);
  for (int stage = 0; stage < stages; ++stage) {
    for (int mb = 0; mb < shape.microbatches; ++mb) check_pair(positions, shape, stage, mb);
    if (shape.training) check_step(positions, shape, stage);
  }
  // The rules above hold for a list that waits on itself across devices; playing the lists in
  // order by the dependency rules finds that.
  Readiness readiness(shape);
  check_finished(schedule, play(schedule, readiness, [](int, const Instruction&) {}), readiness);
}

}  // namespace stagecraft::schedule
