#pragma once
/// \file
/// The dependency rules of a schedule, in one place: which instructions must have run before an
/// instruction may run. The validator plays a schedule in order with them to prove it has no
/// deadlock, and the compiler's simulator times a schedule with them (compiler/schedule/
/// simulator.h), so the two cannot disagree.
///
/// The rules: a RECV_ACT waits for the SEND_ACT of the stage before, a RECV_GRAD for the
/// SEND_GRAD of the stage after; a forward of stage s > 0 for its RECV_ACT; a backward (or B) for
/// its forward and, below the last stage, its RECV_GRAD; a W for its B; a SEND_ACT for its
/// forward and a SEND_GRAD for its backward (or B); an ALLREDUCE or ALLREDUCE_SHARED for every
/// weight gradient of its stage (a full backward or a W per microbatch); an OPT_STEP for those
/// and for the ALLREDUCE_SHARED of every stage it shares a weight with. A send also waits while
/// its link holds `link_capacity(shape)` messages its receiver has not taken (a bounded link, as
/// the runtime's transports are). A device's list runs in order, each instruction once its
/// inputs have run.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/format/schedule.h"

namespace stagecraft::schedule {

/// What has run of one step, and whether an instruction may run now. Instructions must be
/// within the shape (the validator and the simulator check that first).
class Readiness {
 public:
  /// Nothing has run yet.
  explicit Readiness(const PipelineShape& shape);

  /// True when every instruction `in` waits for has run.
  bool ready(const Instruction& in) const { return blocker(in).what == Wait::kNothing; }

  /// Records that `in` has run.
  void mark_done(const Instruction& in) {
    // Step-level ops are kept at microbatch 0.
    done_[index(in.op, in.stage, is_step_level(in.op) ? 0 : in.microbatch)] = 1;
    switch (in.op) {
      case Op::kBackward:
      case Op::kBackwardWeight:
        ++weight_gradients_[in.stage];
        break;
      case Op::kSendAct:
        ++acts_sent_[in.stage];
        break;
      case Op::kRecvAct:
        ++acts_taken_[in.stage - 1];
        break;
      case Op::kSendGrad:
        ++grads_sent_[in.stage];
        break;
      case Op::kRecvGrad:
        ++grads_taken_[in.stage + 1];
        break;
      default:
        break;
    }
  }

  /// What `in` still waits for, for a deadlock message: "its RECV_ACT has not run", "3 of 4
  /// weight gradients are done", ...; "" when it is ready.
  std::string waiting_for(const Instruction& in) const;

 private:
  /// What an instruction waits for first.
  enum class Wait {
    kNothing,
    kSendAct,          ///< The SEND_ACT of `stage` (the one before).
    kSendGrad,         ///< The SEND_GRAD of `stage` (the one after).
    kRecvAct,          ///< Its own RECV_ACT.
    kRecvGrad,         ///< Its own RECV_GRAD.
    kForward,          ///< Its own forward.
    kBackward,         ///< Its own backward (full or B).
    kBackwardInput,    ///< Its own B.
    kWeightGradients,  ///< Every weight gradient of its stage.
    kSharedExchange,   ///< The ALLREDUCE_SHARED of `stage`.
    kLinkFull,         ///< The link to `stage` holds as many messages as it can.
    kUnknownOp,
  };
  /// The first thing an instruction waits for, with the stage it names where it names one.
  struct Blocker {
    Wait what = Wait::kNothing;
    int stage = -1;
  };

  Blocker blocker(const Instruction& in) const;
  /// The place of (op, stage, microbatch) in `done_`. Inline, with `done`, `ready`, `mark_done`
  /// and `blocker`: the simulator asks them for every instruction of every candidate split.
  size_t index(Op op, int stage, int microbatch) const {
    return (static_cast<size_t>(op) * static_cast<size_t>(stages_) + static_cast<size_t>(stage)) *
               static_cast<size_t>(shape_.microbatches) +
           static_cast<size_t>(microbatch);
  }
  bool done(Op op, int stage, int microbatch) const {
    return done_[index(op, stage, microbatch)] != 0;
  }

  PipelineShape shape_;
  int stages_;
  /// Per (op, stage, microbatch), whether it has run (1); step-level ops use microbatch 0.
  std::vector<uint8_t> done_;
  std::vector<int> weight_gradients_;  ///< Per stage, weight gradients done (of M).
  int capacity_;
  /// Per sending stage: messages sent on its link to the next stage (activations) and to the
  /// one before (gradients), and how many of them the receiver has taken.
  std::vector<int> acts_sent_, acts_taken_, grads_sent_, grads_taken_;
};

inline Readiness::Blocker Readiness::blocker(const Instruction& in) const {
  const int s = in.stage;
  const int mb = in.microbatch;
  const bool gradients_done = weight_gradients_[s] >= shape_.microbatches;
  switch (in.op) {
    case Op::kRecvAct:
      return done(Op::kSendAct, s - 1, mb) ? Blocker{} : Blocker{Wait::kSendAct, s - 1};
    case Op::kRecvGrad:
      return done(Op::kSendGrad, s + 1, mb) ? Blocker{} : Blocker{Wait::kSendGrad, s + 1};
    case Op::kForward:
      return s == 0 || done(Op::kRecvAct, s, mb) ? Blocker{} : Blocker{Wait::kRecvAct};
    case Op::kSendAct:
      if (!done(Op::kForward, s, mb)) return {Wait::kForward};
      return acts_sent_[s] - acts_taken_[s] < capacity_ ? Blocker{}
                                                        : Blocker{Wait::kLinkFull, s + 1};
    case Op::kSendGrad:
      if (!done(Op::kBackward, s, mb) && !done(Op::kBackwardInput, s, mb)) return {Wait::kBackward};
      return grads_sent_[s] - grads_taken_[s] < capacity_ ? Blocker{}
                                                          : Blocker{Wait::kLinkFull, s - 1};
    case Op::kBackward:
    case Op::kBackwardInput:
      if (!done(Op::kForward, s, mb)) return {Wait::kForward};
      return s == stages_ - 1 || done(Op::kRecvGrad, s, mb) ? Blocker{} : Blocker{Wait::kRecvGrad};
    case Op::kBackwardWeight:
      return done(Op::kBackwardInput, s, mb) || done(Op::kBackward, s, mb)
                 ? Blocker{}
                 : Blocker{Wait::kBackwardInput};
    case Op::kAllReduce:
    case Op::kAllReduceShared:
      return gradients_done ? Blocker{} : Blocker{Wait::kWeightGradients};
    case Op::kOptimizerStep:
      if (!gradients_done) return {Wait::kWeightGradients};
      for (int partner : shared_partners(shape_, s))
        if (!done(Op::kAllReduceShared, partner, 0)) return {Wait::kSharedExchange, partner};
      return {};
  }
  return {Wait::kUnknownOp};
}

/// Per device, the position of the first instruction that has not run, after playing every
/// device's list in order as far as `readiness` lets it (times are ignored), from the start of
/// every list; updates `readiness`. `on_run(device, in)` is called for each instruction as it
/// runs, before it is marked done, in an order that keeps every rule.
template <typename OnRun>
std::vector<size_t> play(const Schedule& schedule, Readiness& readiness, OnRun on_run) {
  std::vector<size_t> next(schedule.size(), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t device = 0; device < schedule.size(); ++device) {
      while (next[device] < schedule[device].size() &&
             readiness.ready(schedule[device][next[device]])) {
        const Instruction& in = schedule[device][next[device]];
        on_run(static_cast<int>(device), in);
        readiness.mark_done(in);
        ++next[device];
        moved = true;
      }
    }
  }
  return next;
}

/// Throws `Error(kPlan)` "schedule deadlocks: device D at instruction I (FWD stage 2 mb 5): its
/// RECV_ACT has not run; ..." naming every device whose list `next` (from `play`) did not finish.
void check_finished(const Schedule& schedule, const std::vector<size_t>& next,
                    const Readiness& readiness);

}  // namespace stagecraft::schedule
