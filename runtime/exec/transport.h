#pragma once
/// \file
/// How tensors cross between stages. A `Transport` carries messages along links (stage ->
/// stage, activations forward or gradients backward); the in-process one here joins the worker
/// threads of one process with bounded channels, and the MPI and NCCL transports of the
/// multi-process runtime implement the same interface.

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/tensor.h"
#include "runtime/exec/spin_condition.h"

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

/// One gradient bucket of a stage (data parallelism): `bucket` counts the stage's buckets in the
/// order the backward fills them (runtime/exec/device_worker.h).
struct BucketKey {
  int stage = 0;
  int bucket = 0;
  friend auto operator<=>(const BucketKey&, const BucketKey&) = default;
};

/// What a replica sum does (`Transport::start_replica_sum`).
enum class ReplicaOp { kAllReduce, kReduceScatter };

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
  /// Starts the sum over the data-parallel replicas of bucket `key` (float32, 1-D: a range of
  /// stage `key.stage`'s weight gradients, laid out alike in every replica) and returns at once:
  /// the sum goes on while the caller computes (driven by `progress_replicas`, which the caller
  /// calls between its kernels, and by `finish_replica_sum`). The caller leaves `bucket`'s
  /// bytes alone until `finish_replica_sum(key)` has returned. Buckets of several keys may be in
  /// flight together; every replica starts the same keys with buckets of the same size.
  ///
  /// `ReplicaOp::kAllReduce` (`bounds` empty): on finishing every replica's bucket holds the same
  /// bytes, the sum. The order is fixed, so results are deterministic: chunk c of R (elements
  /// [c n / R, (c + 1) n / R) of the bucket: `replica_chunk`) adds the replicas' values in the
  /// order c, c + 1, ..., c + R - 1 (mod R), the order of a ring all-reduce's reduce-scatter
  /// (which the MPI transport runs; the in-process one adds the same way). The chunks are the
  /// bucket's, so an element's order depends on where the bucket boundaries fall: with R = 2 it
  /// never matters (a + b = b + a exactly); with more replicas a different --bucket-mb may
  /// change the last bits.
  ///
  /// `ReplicaOp::kReduceScatter` (ZeRO-1, `--shard-optimizer`): the bucket is split into shards
  /// at `bounds` (R + 1 offsets from 0 to its size); on finishing, shard r of replica r's bucket
  /// holds shard r summed over the replicas (its other shards are the transport's to use).
  /// Fixed order: shard r adds the replicas' values in the order r + 1, r + 2, ..., r + R
  /// (mod R), a ring's reduce-scatter that ends each shard at its owner, in process and under
  /// MPI alike; it does not depend on the bucket boundaries.
  ///
  /// Throws `Aborted`, or `Error(kPlan)` when the transport joins no replicas or the key was
  /// started twice.
  virtual void start_replica_sum(const BucketKey& key, ReplicaOp op, const Tensor& bucket,
                                 const std::vector<int64_t>& bounds, DeviceContext& device) = 0;
  /// Does what can be done now, without waiting, of the started sums (at least of `stage`'s, a
  /// stage of the calling device). Cheap when nothing is pending. Throws `Aborted`.
  virtual void progress_replicas(int stage, DeviceContext& device) = 0;
  /// Waits until the sum of `key` is complete (see `start_replica_sum`). Throws `Aborted`,
  /// `Error(kTimeout)` naming the replica that gave nothing, or `Error(kPlan)` when the buckets
  /// differ or `key` was not started.
  virtual void finish_replica_sum(const BucketKey& key, DeviceContext& device) = 0;
  /// ZeRO-1's all-gather: shard r of replica r's `bucket` (split at `bounds` as above) is copied
  /// into every other replica's; on return every replica's bucket holds the same bytes.
  virtual void replica_all_gather(int stage, Tensor& bucket, const std::vector<int64_t>& bounds,
                                  DeviceContext& device) = 0;
  /// Stops the run: every blocked and later send, receive and sum throws `Aborted`.
  virtual void abort() = 0;
};

/// Elements [lo, hi) of chunk `chunk` of `count` of a bucket of `elements` (the split
/// `Transport::start_replica_sum` sums chunk by chunk).
std::pair<int64_t, int64_t> replica_chunk(int64_t elements, int count, int chunk);

/// What the in-process transports of the replicas of one run share: the buckets being summed.
/// Each replica sums its own chunk (reading the others' buckets), then copies the others'
/// chunks, as a ring all-reduce would but through memory. A sum is started, then each
/// replica's worker does its part when it can: between its kernels (`progress`) or, at the
/// latest, when it needs the result (`finish`).
class ReplicaSums {
 public:
  /// `replicas` (R >= 2) replicas; waits longer than `timeout_s` (> 0; 0: none) throw
  /// `Error(kTimeout)`.
  ReplicaSums(int replicas, double timeout_s) : replicas_(replicas), timeout_s_(timeout_s) {}
  /// How long a waiting worker watches before it sleeps (SpinCondition; set before the run).
  void set_spin(std::chrono::microseconds spin) { changed_.set_spin(spin); }
  /// `Transport::start_replica_sum`, `progress_replicas` and `finish_replica_sum` of replica
  /// `replica`.
  void start(int replica, const BucketKey& key, ReplicaOp op, const Tensor& bucket,
             const std::vector<int64_t>& bounds, DeviceContext& device);
  void progress(int replica, int stage, DeviceContext& device);
  void finish(int replica, const BucketKey& key, DeviceContext& device);
  /// `Transport::replica_all_gather` of replica `replica`.
  void all_gather(int replica, int stage, Tensor& bucket, const std::vector<int64_t>& bounds,
                  DeviceContext& device);
  void abort();

 private:
  /// One bucket's sum over the replicas.
  struct Sum {
    ReplicaOp op = ReplicaOp::kAllReduce;
    std::vector<int64_t> bounds;  ///< R + 1 offsets: the chunks (all-reduce) or shards.
    std::vector<Tensor> buckets;  ///< Per replica, once it has started (a view of its bytes).
    /// Per replica: -1 not started, 0 started, 1 its chunk summed, 2 done with the sum.
    std::vector<int> phase;
    int arrived = 0, reduced = 0, done = 0;
  };
  /// ZeRO-1's all-gather: each replica's bucket (a view of its bytes) while it lasts.
  struct Shards {
    std::vector<Tensor> buckets;
    std::vector<bool> present;
    int arrived = 0, done = 0;
  };
  /// Whether `replica` can do its next part of `sum` now.
  bool can_advance(const Sum& sum, int replica) const;
  /// Does `replica`'s next part of `sum` (the lock is released while it adds or copies).
  void advance(std::unique_lock<std::mutex>& lock, const BucketKey& key, Sum& sum, int replica,
               DeviceContext& device);
  /// Waits until `ready()`; past the timeout throws naming the replicas `missing()` lists.
  template <typename Ready, typename Missing>
  void wait(std::unique_lock<std::mutex>& lock, Ready ready, Missing missing, int stage,
            const char* what);

  std::mutex mutex_;
  SpinCondition changed_;
  std::map<BucketKey, Sum> sums_;          ///< Per bucket being summed.
  std::map<int, Shards> gathers_;          ///< Per stage being all-gathered.
  int replicas_;
  double timeout_s_;
  bool aborted_ = false;
};

/// Bounded in-process channels (mutex and condition variables), one per link, made up front.
class InProcessTransport final : public Transport {
 public:
  /// Called when a message enters a link's buffer (under the transport's lock): the moment its
  /// bytes become the receiving device's.
  using OnDelivered = std::function<void(const Link&, const Message&)>;

  /// `capacity`: messages a link holds before a send waits (at least 1). `timeout_s` (> 0;
  /// 0: none): how long a send, receive or shared sum waits for another device's worker before
  /// it throws `Error(kTimeout)` naming the link or the weight (a worker that hangs). With data
  /// parallelism each replica has a transport of its own (its links and shared sums), and
  /// `replicas` (shared by them) sums their gradients (`start_replica_sum`), this being `replica`.
  InProcessTransport(const std::vector<Link>& links, int capacity, OnDelivered on_delivered = {},
                     double timeout_s = 0, std::shared_ptr<ReplicaSums> replicas = nullptr,
                     int replica = 0);
  /// How long a waiting worker watches before it sleeps (SpinCondition; set before the run),
  /// for this transport's links and sums and the replicas' shared sums.
  void set_spin(std::chrono::microseconds spin);
  void send(const Link& link, Message message) override;
  Message recv(const Link& link, int microbatch) override;
  void start_shared_sum(const std::string& weight, const std::vector<int>& holders, int stage,
                        const Tensor& gradient, DeviceContext& device) override;
  void finish_shared_sum(const std::string& weight, int stage, Tensor& gradient,
                         DeviceContext& device) override;
  void start_replica_sum(const BucketKey& key, ReplicaOp op, const Tensor& bucket,
                         const std::vector<int64_t>& bounds, DeviceContext& device) override;
  void progress_replicas(int stage, DeviceContext& device) override;
  void finish_replica_sum(const BucketKey& key, DeviceContext& device) override;
  void replica_all_gather(int stage, Tensor& bucket, const std::vector<int64_t>& bounds,
                          DeviceContext& device) override;
  void abort() override;

 private:
  /// The replicas' shared sums, after checking the run has them and is not aborted.
  ReplicaSums& replicas(int stage, const char* what);
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
  SpinCondition changed_;
  std::map<Link, Channel> channels_;
  std::map<std::string, SharedSum> sums_;
  size_t capacity_;
  OnDelivered on_delivered_;
  double timeout_s_ = 0;
  std::shared_ptr<ReplicaSums> replicas_;
  int replica_ = 0;
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
  /// How long a waiting worker watches before it sleeps (SpinCondition; set before the run).
  void set_spin(std::chrono::microseconds spin) { changed_.set_spin(spin); }

 private:
  std::mutex mutex_;
  SpinCondition changed_;
  std::function<void()> on_all_arrived_;
  int parties_, waiting_ = 0;
  long generation_ = 0;
  bool aborted_ = false;
};

}  // namespace stagecraft::rt
