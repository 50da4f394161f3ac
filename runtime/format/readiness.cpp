#include "runtime/format/readiness.h"

#include <fmt/format.h>

#include "runtime/format/error.h"

namespace stagecraft::schedule {
namespace {

constexpr int kOpCount = static_cast<int>(Op::kOptimizerStep) + 1;

}  // namespace

Readiness::Readiness(const PipelineShape& shape)
    : shape_(shape),
      stages_(stage_count(shape)),
      done_(static_cast<size_t>(kOpCount) * stages_ * shape.microbatches, false),
      weight_gradients_(stages_, 0),
      capacity_(link_capacity(shape)),
      acts_sent_(stages_, 0),
      acts_taken_(stages_, 0),
      grads_sent_(stages_, 0),
      grads_taken_(stages_, 0) {}

size_t Readiness::key(int stage, int microbatch) const {
  return static_cast<size_t>(stage) * shape_.microbatches + microbatch;
}

bool Readiness::done(Op op, int stage, int microbatch) const {
  return done_[static_cast<size_t>(op) * stages_ * shape_.microbatches + key(stage, microbatch)];
}

void Readiness::mark_done(const Instruction& in) {
  int microbatch = is_step_level(in.op) ? 0 : in.microbatch;
  done_[static_cast<size_t>(in.op) * stages_ * shape_.microbatches + key(in.stage, microbatch)] =
      true;
  if (in.op == Op::kBackward || in.op == Op::kBackwardWeight) ++weight_gradients_[in.stage];
  if (in.op == Op::kSendAct) ++acts_sent_[in.stage];
  if (in.op == Op::kRecvAct) ++acts_taken_[in.stage - 1];
  if (in.op == Op::kSendGrad) ++grads_sent_[in.stage];
  if (in.op == Op::kRecvGrad) ++grads_taken_[in.stage + 1];
}

bool Readiness::ready(const Instruction& in) const { return blocker(in).what == Wait::kNothing; }

Readiness::Blocker Readiness::blocker(const Instruction& in) const {
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
      return acts_sent_[s] - acts_taken_[s] < capacity_ ? Blocker{} : Blocker{Wait::kLinkFull, s + 1};
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

std::string Readiness::waiting_for(const Instruction& in) const {
  const Blocker b = blocker(in);
  switch (b.what) {
    case Wait::kNothing:
      return "";
    case Wait::kSendAct:
      return fmt::format("no SEND_ACT from stage {} has run", b.stage);
    case Wait::kSendGrad:
      return fmt::format("no SEND_GRAD from stage {} has run", b.stage);
    case Wait::kRecvAct:
      return "its RECV_ACT has not run";
    case Wait::kRecvGrad:
      return "its RECV_GRAD has not run";
    case Wait::kForward:
      return "its forward has not run";
    case Wait::kBackward:
      return "its backward has not run";
    case Wait::kBackwardInput:
      return "its BWD_INPUT has not run";
    case Wait::kWeightGradients:
      return fmt::format("{} of {} weight gradients are done", weight_gradients_[in.stage],
                         shape_.microbatches);
    case Wait::kSharedExchange:
      return fmt::format("the ALLREDUCE_SHARED of stage {} has not run", b.stage);
    case Wait::kLinkFull:
      return fmt::format("its link to stage {} holds {} message{} stage {} has not received",
                         b.stage, capacity_, capacity_ == 1 ? "" : "s", b.stage);
    case Wait::kUnknownOp:
      return "unknown op";
  }
  return "unknown op";
}

void check_finished(const Schedule& schedule, const std::vector<size_t>& next,
                    const Readiness& readiness) {
  std::string stuck;
  for (size_t device = 0; device < schedule.size(); ++device) {
    size_t position = next[device];
    if (position == schedule[device].size()) continue;
    const Instruction& in = schedule[device][position];
    stuck += fmt::format("{}device {} at instruction {} ({}): {}", stuck.empty() ? "" : "; ",
                         device, position, to_string(in), readiness.waiting_for(in));
  }
  if (!stuck.empty()) fail(ErrorKind::kPlan, "schedule deadlocks: {}", stuck);
}

}  // namespace stagecraft::schedule
