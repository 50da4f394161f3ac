#include "runtime/mpi/gpu_transport.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "runtime/format/error.h"

namespace stagecraft::rt::mpi {

namespace {

// A host copy of `t` (also of a host-visible device's tensor: the sums then never run on the
// caller's bytes, which get the result only when it is complete).
Tensor host_copy(DeviceContext& device, const Tensor& t) {
  Tensor host = Tensor::uninitialized(t.dtype, t.shape);
  if (t.bytes() > 0) device.read(t, host.data, t.bytes());
  return host;
}

}  // namespace

HostStagedTransport::HostStagedTransport(std::unique_ptr<MpiTransport> mpi,
                                         std::unique_ptr<DeviceContext> staging)
    : mpi_(std::move(mpi)), staging_(std::move(staging)), host_(cpu_backend().make_device(0, 1)) {}

HostStagedTransport::~HostStagedTransport() = default;

void HostStagedTransport::send(const Link& link, Message message) {
  // The worker has synchronised its stream: the reads see what the stage wrote.
  for (NamedTensor& t : message.tensors) t.tensor = host_copy(*staging_, t.tensor);
  mpi_->send(link, std::move(message));
}

Message HostStagedTransport::recv(const Link& link, int microbatch) {
  return mpi_->recv(link, microbatch);  // host memory: the receiving device adopts it
}

void HostStagedTransport::start_shared_sum(const std::string& weight,
                                           const std::vector<int>& holders, int stage,
                                           const Tensor& gradient, DeviceContext& device) {
  mpi_->start_shared_sum(weight, holders, stage, host_copy(device, gradient), *host_);
}

void HostStagedTransport::finish_shared_sum(const std::string& weight, int stage,
                                            Tensor& gradient, DeviceContext& device) {
  Tensor sum = Tensor::uninitialized(gradient.dtype, gradient.shape);
  mpi_->finish_shared_sum(weight, stage, sum, *host_);
  device.write(gradient, sum.data, sum.bytes());
}

void HostStagedTransport::start_replica_sum(const BucketKey& key, ReplicaOp op,
                                            const Tensor& bucket,
                                            const std::vector<int64_t>& bounds,
                                            DeviceContext& device) {
  Staged staged{host_copy(device, bucket), bucket};
  mpi_->start_replica_sum(key, op, staged.host, bounds, *host_);
  sums_[key] = std::move(staged);
}

void HostStagedTransport::progress_replicas(int stage, DeviceContext&) {
  mpi_->progress_replicas(stage, *host_);
}

void HostStagedTransport::finish_replica_sum(const BucketKey& key, DeviceContext& device) {
  mpi_->finish_replica_sum(key, *host_);  // Error(kPlan) for a key never started
  auto it = sums_.find(key);
  if (it == sums_.end())
    fail(ErrorKind::kInternal, "stage {}: bucket {} has no host copy", key.stage, key.bucket);
  device.write(it->second.device, it->second.host.data, it->second.host.bytes());
  sums_.erase(it);
}

void HostStagedTransport::replica_all_gather(int stage, Tensor& bucket,
                                             const std::vector<int64_t>& bounds,
                                             DeviceContext& device) {
  Tensor host = host_copy(device, bucket);
  mpi_->replica_all_gather(stage, host, bounds, *host_);
  device.write(bucket, host.data, host.bytes());
}

void HostStagedTransport::abort() { mpi_->abort(); }

DeviceGroup& NcclSession::group(int index) {
  auto it = joined.find(index);
  if (it == joined.end())
    fail(ErrorKind::kInternal, "rank {} is not in NCCL group {}", rank, index);
  return *it->second;
}

NcclTransport::NcclTransport(std::shared_ptr<NcclSession> session,
                             std::unique_ptr<HostStagedTransport> staged,
                             std::unique_ptr<DeviceContext> device, int replica, int capacity,
                             InProcessTransport::OnDelivered on_delivered, double timeout_s)
    : session_(std::move(session)),
      staged_(std::move(staged)),
      device_(std::move(device)),
      replica_(replica),
      capacity_(static_cast<size_t>(std::max(capacity, 1))),
      on_delivered_(std::move(on_delivered)),
      timeout_s_(timeout_s) {}

NcclTransport::~NcclTransport() {
  if (aborted_) return;
  // A run that ended well: every receiver took its messages before the last step's end.
  for (auto& [link, queue] : in_flight_) {
    const int index = link_group(session_->groups, session_->stage_device, link, replica_);
    for (InFlight& f : queue) try {
        wait(index, f.tickets, [] { return std::string("the last sends"); });
      } catch (const Error&) {
        return;  // the group is aborted: the run's end reports what failed
      }
  }
}

void NcclTransport::check_open() const {
  if (aborted_) throw Aborted{};
}

std::string NcclTransport::describe(const Link& link) const {
  return fmt::format("link stage {} -> stage {} ({})", link.from_stage, link.to_stage,
                     link.gradient ? "gradients" : "activations");
}

std::string NcclTransport::replicas_named(int index) const {
  std::vector<std::string> names;
  for (int rank : session_->groups.at(static_cast<size_t>(index)).ranks)
    if (rank != session_->rank)
      names.push_back(rank < static_cast<int>(session_->rank_names.size())
                          ? session_->rank_names[static_cast<size_t>(rank)]
                          : fmt::format("rank {}", rank));
  return fmt::format("{}", fmt::join(names, ", "));
}

template <typename What>
void NcclTransport::wait(int index, const std::vector<int64_t>& tickets, What what) {
  DeviceGroup& group = session_->group(index);
  size_t next = 0;
  auto done = [&] {
    if (aborted_) throw Aborted{};
    while (next < tickets.size() && group.done(tickets[next])) ++next;
    return next == tickets.size();
  };
  bool finished = false;
  try {
    finished = poll_until(done, timeout_s_);
  } catch (const Error& e) {
    group.abort();
    fail(e.kind(), "{}: {}", what(), e.what());
  }
  if (finished) return;
  group.abort();  // no kernel is left waiting for the silent rank
  fail(ErrorKind::kTimeout,
       "waited {:g} s for {} through NCCL: it died or stopped answering (stagerun --timeout)",
       timeout_s_, what());
}

void NcclTransport::send(const Link& link, Message message) {
  check_open();
  const int index = link_group(session_->groups, session_->stage_device, link, replica_);
  if (index < 0) {  // within this rank's device: the tensors stay where they are
    local_[link].push_back(std::move(message));
    return;
  }
  const int to = session_->groups[static_cast<size_t>(index)].ranks[1];
  std::deque<InFlight>& queue = in_flight_[link];
  while (!queue.empty() || queue.size() >= capacity_) {
    // Drops what NCCL has sent; waits for the oldest while the link is full.
    if (queue.size() < capacity_) {
      DeviceGroup& group = session_->group(index);
      const InFlight& oldest = queue.front();
      if (!std::all_of(oldest.tickets.begin(), oldest.tickets.end(),
                       [&](int64_t t) { return group.done(t); }))
        break;
    } else {
      wait(index, queue.front().tickets, [&] {
        return fmt::format("{} to take the full {}", session_->rank_names.at(static_cast<size_t>(to)),
                           describe(link));
      });
    }
    queue.pop_front();
  }
  // The bytes first (queued behind the compute stream), then the header that announces them.
  InFlight f;
  DeviceGroup& group = session_->group(index);
  for (const NamedTensor& t : message.tensors)
    if (t.tensor.bytes() > 0) f.tickets.push_back(group.send(t.tensor, 1));
  for (NamedTensor& t : message.tensors) f.tensors.push_back(t.tensor);
  staged_->mpi().send_header(link, message);
  queue.push_back(std::move(f));
}

Message NcclTransport::recv(const Link& link, int microbatch) {
  check_open();
  const int index = link_group(session_->groups, session_->stage_device, link, replica_);
  if (index < 0) {
    std::deque<Message>& queue = local_[link];
    if (queue.empty())
      fail(ErrorKind::kPlan, "stage {} receives microbatch {} from stage {} before it was sent",
           link.to_stage, microbatch, link.from_stage);
    Message message = std::move(queue.front());
    queue.pop_front();
    if (message.microbatch != microbatch)
      fail(ErrorKind::kPlan,
           "stage {} expected microbatch {} from stage {} but microbatch {} arrived first",
           link.to_stage, microbatch, link.from_stage, message.microbatch);
    if (on_delivered_) on_delivered_(link, message);
    return message;
  }
  Message message = staged_->mpi().recv_header(link, microbatch);  // waits within the timeout
  DeviceGroup& group = session_->group(index);
  std::vector<int64_t> tickets;
  for (NamedTensor& t : message.tensors) {
    t.tensor = device_->new_tensor(t.tensor.dtype, t.tensor.shape, false);
    if (t.tensor.bytes() > 0) tickets.push_back(group.recv(t.tensor, 0));
  }
  const int from = session_->groups[static_cast<size_t>(index)].ranks[0];
  wait(index, tickets, [&] {
    return fmt::format("{}'s bytes from {}", describe(link),
                       session_->rank_names.at(static_cast<size_t>(from)));
  });
  if (on_delivered_) on_delivered_(link, message);
  return message;
}

void NcclTransport::start_shared_sum(const std::string& weight, const std::vector<int>& holders,
                                     int stage, const Tensor& gradient, DeviceContext& device) {
  check_open();
  staged_->start_shared_sum(weight, holders, stage, gradient, device);
}

void NcclTransport::finish_shared_sum(const std::string& weight, int stage, Tensor& gradient,
                                      DeviceContext& device) {
  check_open();
  staged_->finish_shared_sum(weight, stage, gradient, device);
}

int NcclTransport::replicas_group(int stage, const char* what) const {
  check_open();
  const int d = session_->stage_device.at(static_cast<size_t>(stage));
  const int index = replica_group(session_->groups, d);
  if (index < 0) fail(ErrorKind::kPlan, "stage {}: {}, but the run has one replica", stage, what);
  return index;
}

void NcclTransport::start_replica_sum(const BucketKey& key, ReplicaOp op, const Tensor& bucket,
                                      const std::vector<int64_t>& bounds, DeviceContext&) {
  const bool all = op == ReplicaOp::kAllReduce;
  const int index = replicas_group(key.stage, all ? "an ALLREDUCE" : "a sharded ALLREDUCE");
  if (sums_.count(key))
    fail(ErrorKind::kPlan, "stage {}: gradient bucket {} is summed twice in one step", key.stage,
         key.bucket);
  if (bucket.dtype != DType::kFloat32 || bucket.rank() != 1)
    fail(ErrorKind::kUnsupported, "stage {}: the replicas' sum takes a 1-D float32 bucket, not {}",
         key.stage, bucket.describe());
  DeviceGroup& group = session_->group(index);
  Tensor target = bucket;  // summed in place: the caller leaves it alone until the finish
  const int replicas = static_cast<int>(session_->groups[static_cast<size_t>(index)].ranks.size());
  const int64_t ticket =
      all ? group.all_reduce(target)
          : group.reduce_to_owners(target, owned_shards(bounds, bucket.numel(), replicas,
                                                        key.stage));
  sums_[key] = {index, ticket};
}

void NcclTransport::progress_replicas(int, DeviceContext&) {
  check_open();
  // NCCL progresses on its own; this surfaces a failed communicator early.
  for (const auto& [key, sum] : sums_) session_->group(sum.group).done(sum.ticket);
}

void NcclTransport::finish_replica_sum(const BucketKey& key, DeviceContext&) {
  check_open();
  auto it = sums_.find(key);
  if (it == sums_.end())
    fail(ErrorKind::kPlan, "stage {}: waits for gradient bucket {}, never started", key.stage,
         key.bucket);
  const Sum sum = it->second;
  sums_.erase(it);
  wait(sum.group, {sum.ticket}, [&] {
    return fmt::format("the sum of stage {}'s gradient bucket {} with {}", key.stage, key.bucket,
                       replicas_named(sum.group));
  });
}

void NcclTransport::replica_all_gather(int stage, Tensor& bucket,
                                       const std::vector<int64_t>& bounds, DeviceContext&) {
  const int index = replicas_group(stage, "a sharded OPT_STEP");
  const int replicas = static_cast<int>(session_->groups[static_cast<size_t>(index)].ranks.size());
  const int64_t ticket = session_->group(index).broadcast_from_owners(
      bucket, owned_shards(bounds, bucket.numel(), replicas, stage));
  wait(index, {ticket}, [&] {
    return fmt::format("the all-gather of stage {}'s weights with {}", stage,
                       replicas_named(index));
  });
}

void NcclTransport::abort() {
  aborted_ = true;
  staged_->abort();
}

}  // namespace stagecraft::rt::mpi
