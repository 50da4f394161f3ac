#include "runtime/exec/transport.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include "runtime/format/error.h"

namespace stagecraft::rt {

InProcessTransport::InProcessTransport(const std::vector<Link>& links, int capacity,
                                       OnDelivered on_delivered, double timeout_s,
                                       std::shared_ptr<ReplicaSums> replicas, int replica)
    : capacity_(static_cast<size_t>(std::max(capacity, 1))),
      on_delivered_(std::move(on_delivered)),
      timeout_s_(timeout_s),
      replicas_(std::move(replicas)),
      replica_(replica) {
  for (const Link& link : links) channels_[link];
}

void InProcessTransport::set_spin(std::chrono::microseconds spin) {
  changed_.set_spin(spin);
  if (replicas_) replicas_->set_spin(spin);
}

template <typename Ready, typename What>
void InProcessTransport::wait(std::unique_lock<std::mutex>& lock, Ready ready, What what) {
  if (timeout_s_ <= 0) {
    changed_.wait(lock, ready);
    return;
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  if (!changed_.wait_until(lock, deadline, ready))
    fail(ErrorKind::kTimeout, "{} for {:g} s: its device's worker stopped answering (--timeout)",
         what(), timeout_s_);
}

namespace {

std::string link_name(const Link& link) {
  return fmt::format("stage {} -> stage {} ({})", link.from_stage, link.to_stage,
                     link.gradient ? "gradients" : "activations");
}

}  // namespace

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
  wait(
      lock, [&] { return aborted_ || ch.queue.size() < capacity_; },
      [&] {
        return fmt::format("stage {} took nothing from the full link {}", link.to_stage,
                           link_name(link));
      });
  if (aborted_) throw Aborted{};
  if (on_delivered_) on_delivered_(link, message);
  ch.queue.push_back(std::move(message));
  changed_.notify_all();
}

Message InProcessTransport::recv(const Link& link, int microbatch) {
  std::unique_lock lock(mutex_);
  Channel& ch = channel(link);
  wait(
      lock, [&] { return aborted_ || !ch.queue.empty(); },
      [&] { return fmt::format("nothing arrived on the link {}", link_name(link)); });
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

void InProcessTransport::start_shared_sum(const std::string& weight,
                                          const std::vector<int>& holders, int stage,
                                          const Tensor& gradient, DeviceContext& device) {
  if (gradient.dtype != DType::kFloat32)
    fail(ErrorKind::kUnsupported, "shared weight '{}': stage {} sums a {} gradient (float32 only)",
         weight, stage, dtype_name(gradient.dtype));
  Tensor part = clone_on(device, gradient);  // outside the lock: the copy is the stage's own work
  device.synchronize();                      // other devices read it
  std::lock_guard lock(mutex_);
  if (aborted_) throw Aborted{};
  SharedSum& sum = sums_[weight];
  if (sum.parts.empty()) sum.holders = holders;
  if (sum.holders != holders)
    fail(ErrorKind::kPlan, "shared weight '{}': stage {} names holders [{}], another [{}]", weight,
         stage, fmt::join(holders, ","), fmt::join(sum.holders, ","));
  if (std::find(holders.begin(), holders.end(), stage) == holders.end() || sum.parts.count(stage))
    fail(ErrorKind::kPlan, "shared weight '{}': stage {} is not a holder ([{}]) or started twice",
         weight, stage, fmt::join(holders, ","));
  if (!sum.parts.empty() && sum.parts.begin()->second.shape != part.shape)
    fail(ErrorKind::kPlan, "shared weight '{}': stage {}'s gradient is {} but stage {}'s is {}",
         weight, stage, part.describe(), sum.parts.begin()->first,
         sum.parts.begin()->second.describe());
  sum.parts.emplace(stage, std::move(part));
  changed_.notify_all();
}

void InProcessTransport::finish_shared_sum(const std::string& weight, int stage, Tensor& gradient,
                                           DeviceContext& device) {
  std::unique_lock lock(mutex_);
  auto it = sums_.find(weight);
  if (it == sums_.end() || !it->second.parts.count(stage))
    fail(ErrorKind::kPlan, "shared weight '{}': stage {} finishes a sum it did not start", weight,
         stage);
  SharedSum& sum = it->second;
  wait(
      lock, [&] { return aborted_ || sum.parts.size() == sum.holders.size(); },
      [&] {
        std::vector<int> missing;
        for (int h : sum.holders)
          if (!sum.parts.count(h)) missing.push_back(h);
        return fmt::format("shared weight '{}': stage {} gave no part of the sum", weight,
                           fmt::join(missing, ", "));
      });
  if (aborted_) throw Aborted{};
  // The parts stay unchanged until every holder has read them: each adds them itself, in the
  // same order, so every copy gets the same bytes.
  lock.unlock();
  const Tensor& first = sum.parts.at(sum.holders.front());
  if (gradient.shape != first.shape || gradient.dtype != DType::kFloat32)
    fail(ErrorKind::kPlan, "shared weight '{}': stage {}'s gradient buffer is {}, the sum {}",
         weight, stage, gradient.describe(), first.describe());
  device.copy(first, gradient);
  for (size_t h = 1; h < sum.holders.size(); ++h)
    device.accumulate(gradient, sum.parts.at(sum.holders[h]));
  device.synchronize();  // the parts go once every holder is done with them
  lock.lock();
  if (++sum.finished == sum.holders.size()) sums_.erase(it);
  changed_.notify_all();
}

ReplicaSums& InProcessTransport::replicas(int stage, const char* what) {
  if (!replicas_)
    fail(ErrorKind::kPlan, "stage {}: {}, but the run has one replica", stage, what);
  std::lock_guard lock(mutex_);
  if (aborted_) throw Aborted{};
  return *replicas_;
}

void InProcessTransport::start_replica_sum(const BucketKey& key, ReplicaOp op,
                                           const Tensor& bucket,
                                           const std::vector<int64_t>& bounds,
                                           DeviceContext& device) {
  replicas(key.stage, op == ReplicaOp::kAllReduce ? "an ALLREDUCE" : "a sharded ALLREDUCE")
      .start(replica_, key, op, bucket, bounds, device);
}

void InProcessTransport::progress_replicas(int stage, DeviceContext& device) {
  if (replicas_) replicas(stage, "an ALLREDUCE").progress(replica_, stage, device);
}

void InProcessTransport::finish_replica_sum(const BucketKey& key, DeviceContext& device) {
  replicas(key.stage, "an ALLREDUCE").finish(replica_, key, device);
}

void InProcessTransport::replica_all_gather(int stage, Tensor& bucket,
                                            const std::vector<int64_t>& bounds,
                                            DeviceContext& device) {
  replicas(stage, "a sharded OPT_STEP").all_gather(replica_, stage, bucket, bounds, device);
}

void InProcessTransport::abort() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    changed_.notify_all();
  }
  if (replicas_) replicas_->abort();
}

std::pair<int64_t, int64_t> replica_chunk(int64_t elements, int count, int chunk) {
  return {elements * chunk / count, elements * (chunk + 1) / count};
}

template <typename Ready, typename Missing>
void ReplicaSums::wait(std::unique_lock<std::mutex>& lock, Ready ready, Missing missing, int stage,
                       const char* what) {
  auto ok = [&] { return aborted_ || ready(); };
  if (timeout_s_ <= 0) {
    changed_.wait(lock, ok);
  } else {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    if (!changed_.wait_until(lock, deadline, ok))
      fail(ErrorKind::kTimeout,
           "replica {} {} stage {}'s gradients for {:g} s: its device's worker stopped "
           "answering (--timeout)",
           fmt::join(missing(), ", "), what, stage, timeout_s_);
  }
  if (aborted_) throw Aborted{};
}

namespace {

/// Checks a bucket and its R + 1 chunk or shard boundaries.
void check_shards(int stage, const Tensor& bucket, const std::vector<int64_t>& bounds,
                  int replicas) {
  if (bucket.dtype != DType::kFloat32 || bucket.rank() != 1)
    fail(ErrorKind::kUnsupported, "stage {}: the replicas' sum takes a 1-D float32 bucket, not {}",
         stage, bucket.describe());
  bool ok = bounds.size() == static_cast<size_t>(replicas) + 1 && bounds.front() == 0 &&
            bounds.back() == bucket.numel();
  for (size_t r = 1; ok && r < bounds.size(); ++r) ok = bounds[r] >= bounds[r - 1];
  if (!ok)
    fail(ErrorKind::kPlan,
         "stage {}: shard boundaries [{}] do not split a bucket of {} elements over {} replicas",
         stage, fmt::join(bounds, ", "), bucket.numel(), replicas);
}

/// Shard (or chunk) `r` of a bucket split at `bounds`.
Tensor shard_of(const Tensor& bucket, const std::vector<int64_t>& bounds, int r) {
  return slice_rows(bucket, bounds[static_cast<size_t>(r)], bounds[static_cast<size_t>(r) + 1]);
}

}  // namespace

void ReplicaSums::start(int replica, const BucketKey& key, ReplicaOp op, const Tensor& bucket,
                        const std::vector<int64_t>& bounds, DeviceContext& device) {
  std::vector<int64_t> split = bounds;
  if (op == ReplicaOp::kAllReduce) {
    split.clear();
    for (int c = 0; c < replicas_; ++c)
      split.push_back(replica_chunk(bucket.numel(), replicas_, c).first);
    split.push_back(bucket.numel());
  }
  check_shards(key.stage, bucket, split, replicas_);
  device.synchronize();  // the other replicas read it
  std::lock_guard lock(mutex_);
  if (aborted_) throw Aborted{};
  Sum& sum = sums_[key];
  if (sum.buckets.empty()) {
    sum.op = op;
    sum.bounds = split;
    sum.buckets.resize(static_cast<size_t>(replicas_));
    sum.phase.assign(static_cast<size_t>(replicas_), -1);
  }
  if (sum.phase.at(static_cast<size_t>(replica)) != -1)
    fail(ErrorKind::kPlan, "stage {}: replica {} sums gradient bucket {} twice in one step",
         key.stage, replica, key.bucket);
  if (sum.op != op || sum.bounds != split)
    fail(ErrorKind::kPlan,
         "stage {}: replica {}'s gradient bucket {} is {} split at [{}], another's split at [{}]",
         key.stage, replica, key.bucket, bucket.describe(), fmt::join(split, ", "),
         fmt::join(sum.bounds, ", "));
  sum.buckets[static_cast<size_t>(replica)] = bucket;
  sum.phase[static_cast<size_t>(replica)] = 0;
  ++sum.arrived;
  changed_.notify_all();
}

bool ReplicaSums::can_advance(const Sum& sum, int replica) const {
  switch (sum.phase[static_cast<size_t>(replica)]) {
    case 0:
      return sum.arrived == replicas_;  // every replica's bucket is there to read
    case 1:
      return sum.reduced == replicas_;  // every chunk is summed, in its owner's bucket
    default:
      return false;
  }
}

void ReplicaSums::advance(std::unique_lock<std::mutex>& lock, const BucketKey& key, Sum& sum,
                          int replica, DeviceContext& device) {
  const int phase = sum.phase[static_cast<size_t>(replica)];
  // The buckets stay put while this replica reads them: each replica changes only its own
  // chunk (shard) before every chunk is summed, and the others' after; the sum is forgotten
  // once every replica is done with it (a replica changes its bucket again only in the next
  // step, after the step barrier).
  const std::vector<Tensor> buckets = sum.buckets;
  const std::vector<int64_t> bounds = sum.bounds;
  const ReplicaOp op = sum.op;
  lock.unlock();
  const Tensor& bucket = buckets[static_cast<size_t>(replica)];
  auto other = [&](int k) { return buckets[static_cast<size_t>((replica + k) % replicas_)]; };
  if (phase == 0 && op == ReplicaOp::kAllReduce) {
    // This replica's chunk: its own values, then the next replicas' in ring order.
    Tensor mine = shard_of(bucket, bounds, replica);
    for (int k = 1; k < replicas_; ++k) device.accumulate(mine, shard_of(other(k), bounds, replica));
  } else if (phase == 0) {
    // Shard `replica`, summed in ring order from the next replica round to this one.
    Tensor mine = shard_of(bucket, bounds, replica);
    if (mine.numel() > 0) {
      Tensor total = device.new_tensor(DType::kFloat32, mine.shape, false);
      device.copy(shard_of(other(1), bounds, replica), total);
      for (int k = 2; k <= replicas_; ++k)
        device.accumulate(total, shard_of(other(k), bounds, replica));
      device.copy(total, mine);
    }
  } else {
    // Every chunk is summed, each in its owner's bucket: copy the others'.
    for (int c = 0; c < replicas_; ++c) {
      if (c == replica) continue;
      Tensor target = shard_of(bucket, bounds, c);
      device.copy(shard_of(buckets[static_cast<size_t>(c)], bounds, c), target);
    }
  }
  device.synchronize();
  lock.lock();
  if (phase == 0) ++sum.reduced;
  // A reduce-scatter is done once its shard is summed; an all-reduce once it has copied.
  const bool done = phase == 1 || op == ReplicaOp::kReduceScatter;
  sum.phase[static_cast<size_t>(replica)] = done ? 2 : 1;
  if (done && ++sum.done == replicas_) sums_.erase(key);
  changed_.notify_all();
}

void ReplicaSums::progress(int replica, int stage, DeviceContext& device) {
  std::unique_lock lock(mutex_);
  if (aborted_) throw Aborted{};
  for (auto it = sums_.lower_bound({stage, INT_MIN}); it != sums_.end() && it->first.stage == stage;) {
    const BucketKey key = it->first;
    Sum& sum = it->second;
    const bool mine = sum.phase[static_cast<size_t>(replica)] >= 0;
    if (mine && can_advance(sum, replica)) {
      advance(lock, key, sum, replica, device);  // may forget the sum: look it up again
      it = sums_.upper_bound(key);
      continue;
    }
    ++it;
  }
}

void ReplicaSums::finish(int replica, const BucketKey& key, DeviceContext& device) {
  std::unique_lock lock(mutex_);
  if (aborted_) throw Aborted{};
  for (;;) {
    auto it = sums_.find(key);
    // Forgotten once every replica is done: this one was too.
    if (it == sums_.end()) return;
    Sum& sum = it->second;
    const int phase = sum.phase[static_cast<size_t>(replica)];
    if (phase < 0)
      fail(ErrorKind::kPlan, "stage {}: replica {} waits for gradient bucket {}, never started",
           key.stage, replica, key.bucket);
    if (phase == 2) return;
    auto missing = [&] {
      std::vector<int> who;
      for (int r = 0; r < replicas_; ++r)
        if (sum.phase[static_cast<size_t>(r)] < phase) who.push_back(r);
      return who;
    };
    wait(
        lock, [&] { return can_advance(sum, replica); }, missing, key.stage,
        phase == 0 ? "gave none of" : "did not finish its chunk of");
    advance(lock, key, sum, replica, device);
  }
}

void ReplicaSums::all_gather(int replica, int stage, Tensor& bucket,
                             const std::vector<int64_t>& bounds, DeviceContext& device) {
  check_shards(stage, bucket, bounds, replicas_);
  device.synchronize();  // the other replicas read its shard
  std::unique_lock lock(mutex_);
  if (aborted_) throw Aborted{};
  Shards& e = gathers_[stage];
  if (e.buckets.empty()) {
    e.buckets.resize(static_cast<size_t>(replicas_));
    e.present.assign(static_cast<size_t>(replicas_), false);
  }
  if (e.present.at(static_cast<size_t>(replica)))
    fail(ErrorKind::kPlan, "stage {}: replica {} all-gathers twice in one step", stage, replica);
  e.buckets[static_cast<size_t>(replica)] = bucket;
  e.present[static_cast<size_t>(replica)] = true;
  ++e.arrived;
  changed_.notify_all();
  wait(
      lock, [&] { return e.arrived == replicas_; },
      [&] {
        std::vector<int> who;
        for (int r = 0; r < replicas_; ++r)
          if (!e.present[static_cast<size_t>(r)]) who.push_back(r);
        return who;
      },
      stage, "gave no updated shard of");
  for (const Tensor& other : e.buckets)
    if (other.shape != bucket.shape)
      fail(ErrorKind::kPlan, "stage {}: replica {}'s sharded bucket is {} but another's is {}",
           stage, replica, bucket.describe(), other.describe());
  std::vector<Tensor> buckets = e.buckets;
  lock.unlock();
  for (int r = 0; r < replicas_; ++r) {
    if (r == replica) continue;
    Tensor target = shard_of(bucket, bounds, r);
    device.copy(shard_of(buckets[static_cast<size_t>(r)], bounds, r), target);
  }
  device.synchronize();
  lock.lock();
  // The last replica done with the buckets forgets them (a replica changes its bucket's other
  // shards only after every replica has arrived at its next collective of the stage).
  if (++e.done == replicas_) gathers_.erase(stage);
  changed_.notify_all();
}

void ReplicaSums::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  changed_.notify_all();
}

void StepBarrier::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  if (aborted_) throw Aborted{};
  long generation = generation_;
  if (++waiting_ == parties_) {
    if (on_all_arrived_) {
      lock.unlock();  // the others wait for the generation, not the lock
      on_all_arrived_();
      lock.lock();
      if (aborted_) throw Aborted{};
    }
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
