#include "runtime/exec/transport.h"

#include "runtime/format/error.h"

namespace stagecraft::rt {

InProcessTransport::InProcessTransport(const std::vector<Link>& links, int capacity,
                                       OnDelivered on_delivered)
    : capacity_(static_cast<size_t>(std::max(capacity, 1))),
      on_delivered_(std::move(on_delivered)) {
  for (const Link& link : links) channels_[link];
}

InProcessTransport::Channel& InProcessTransport::channel(const Link& link) {
  auto it = channels_.find(link);
  if (it == channels_.end())
    fail(ErrorKind::kPlan, "no link from stage {} to stage {} ({}) in the plan", link.from_stage,
         link.to_stage, link.gradient ? "gradients" : "activations");
  return it->second;
}

void InProcessTransport::send(const Link& link, Message message) {
  std::unique_lock lock(mutex_);
  Channel& ch = channel(link);
  changed_.wait(lock, [&] { return aborted_ || ch.queue.size() < capacity_; });
  if (aborted_) throw Aborted{};
  if (on_delivered_) on_delivered_(link, message);
  ch.queue.push_back(std::move(message));
  changed_.notify_all();
}

Message InProcessTransport::recv(const Link& link, int microbatch) {
  std::unique_lock lock(mutex_);
  Channel& ch = channel(link);
  changed_.wait(lock, [&] { return aborted_ || !ch.queue.empty(); });
  if (aborted_) throw Aborted{};
  if (ch.queue.front().microbatch != microbatch)
    fail(ErrorKind::kPlan,
         "stage {} expected microbatch {} from stage {} but microbatch {} arrived first",
         link.to_stage, microbatch, link.from_stage, ch.queue.front().microbatch);
  Message message = std::move(ch.queue.front());
  ch.queue.pop_front();
  changed_.notify_all();
  return message;
}

void InProcessTransport::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  changed_.notify_all();
}

void StepBarrier::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  if (aborted_) throw Aborted{};
  long generation = generation_;
  if (++waiting_ == parties_) {
    waiting_ = 0;
    ++generation_;
    changed_.notify_all();
    return;
  }
  changed_.wait(lock, [&] { return aborted_ || generation_ != generation; });
  if (generation_ == generation) throw Aborted{};
}

void StepBarrier::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  changed_.notify_all();
}

}  // namespace stagecraft::rt
