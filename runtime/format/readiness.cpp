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
      done_(static_cast<size_t>(kOpCount) * stages_ * shape.microbatches, 0),
      weight_gradients_(stages_, 0),
      capacity_(link_capacity(shape)),
      acts_sent_(stages_, 0),
      acts_taken_(stages_, 0),
      grads_sent_(stages_, 0),
      grads_taken_(stages_, 0) {}

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
