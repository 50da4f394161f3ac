#pragma once
/// \file
/// How tensors cross between stages. A `Transport` carries messages along links (stage ->
/// stage, activations forward or gradients backward); the in-process one here joins the worker
/// threads of one process with bounded channels, and the MPI and NCCL transports of the
/// multi-process runtime implement the same interface.

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/tensor.h"

namespace stagecraft::rt {

/// One direction between two stages.
struct Link {
  int from_stage = 0;
  int to_stage = 0;
  bool gradient = false;  ///< Gradients travel from a later stage to an earlier one.
  friend auto operator<=>(const Link&, const Link&) = default;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

/// What one stage sends another for one microbatch.
struct Message {
  int microbatch = 0;
  std::vector<NamedTensor> tensors;
};

/// Thrown into workers blocked in a transport when the run stops because another failed.
struct Aborted {};

class Transport {
 public:
  virtual ~Transport() = default;
  /// Hands `message` to `link`. Returns once the transport holds it (the sender keeps
  /// computing while it travels); blocks only while the link is full. Throws `Aborted`.
  virtual void send(const Link& link, Message message) = 0;
  /// The message of `microbatch` on `link`, waiting for it. Messages on one link arrive in the
  /// order they were sent; a different microbatch at the head is a plan fault (Error kPlan).
  /// Throws `Aborted`.
  virtual Message recv(const Link& link, int microbatch) = 0;
  /// Starts the step's sum of the gradient of `weight`, a weight that the stages `holders`
  /// (ascending) each hold a copy of, with `stage`'s part (float32) on `device`. Returns at
  /// once: the transport keeps its own copy of the part, so the caller may go on using
  /// `gradient`. Throws `Aborted`.
  virtual void start_shared_sum(const std::string& weight, const std::vector<int>& holders,
                                int stage, const Tensor& gradient, DeviceContext& device) = 0;
  /// Waits until every holder of `weight` has started the sum, then overwrites `gradient`
  /// (`stage`'s part, as started) with the sum of all parts. The sum adds the parts in
  /// ascending stage order, so every holder gets the same bytes and the copies of the weight
  /// stay identical. Once every holder has finished, the next step may start again. Throws
  /// `Aborted`, or `Error(kPlan)` when the holders or the parts' shapes disagree. `device`
  /// (the caller's) copies and adds.
  virtual void finish_shared_sum(const std::string& weight, int stage, Tensor& gradient,
                                 DeviceContext& device) = 0;
  /// Stops the run: every blocked and later send, receive and sum throws `Aborted`.
  virtual void abort() = 0;
};

/// Bounded in-process channels (mutex and condition variables), one per link, made up front.
class InProcessTransport final : public Transport {
 public:
  /// Called when a message enters a link's buffer (under the transport's lock): the moment its
  /// bytes become the receiving device's.
  using OnDelivered = std::function<void(const Link&, const Message&)>;

  /// `capacity`: messages a link holds before a send waits (at least 1). `timeout_s` (> 0;
  /// 0: none): how long a send, receive or shared sum waits for another device's worker before
  /// it throws `Error(kTimeout)` naming the link or the weight (a worker that hangs).
  InProcessTransport(const std::vector<Link>& links, int capacity, OnDelivered on_delivered = {},
                     double timeout_s = 0);
  void send(const Link& link, Message message) override;
  Message recv(const Link& link, int microbatch) override;
  void start_shared_sum(const std::string& weight, const std::vector<int>& holders, int stage,
                        const Tensor& gradient, DeviceContext& device) override;
  void finish_shared_sum(const std::string& weight, int stage, Tensor& gradient,
                         DeviceContext& device) override;
  void abort() override;

 private:
  struct Channel {
    std::deque<Message> queue;
  };
  /// One shared weight's sum in progress: each holder's part, and the holders done with it.
  struct SharedSum {
    std::vector<int> holders;
    std::map<int, Tensor> parts;
    size_t finished = 0;
  };
  Channel& channel(const Link& link);
  /// Waits on `changed_` until `ready()`; past the timeout throws `Error(kTimeout)` with
  /// `what()` ("nothing arrived from stage 1 (activations)") and the seconds waited.
  template <typename Ready, typename What>
  void wait(std::unique_lock<std::mutex>& lock, Ready ready, What what);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<Link, Channel> channels_;
  std::map<std::string, SharedSum> sums_;
  size_t capacity_;
  OnDelivered on_delivered_;
  double timeout_s_ = 0;
  bool aborted_ = false;
};

/// A barrier that `abort()` opens for good (waiters throw `Aborted`), so a failed worker never
/// leaves the others waiting at the end of a step. `on_all_arrived` (optional) is run by the
/// last party to arrive before any leaves: a wait for other processes' workers (runtime/mpi).
class StepBarrier {
 public:
  explicit StepBarrier(int parties, std::function<void()> on_all_arrived = {})
      : on_all_arrived_(std::move(on_all_arrived)), parties_(parties) {}
  void arrive_and_wait();
  void abort();

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> on_all_arrived_;
  int parties_, waiting_ = 0;
  long generation_ = 0;
  bool aborted_ = false;
};

}  // namespace stagecraft::rt
