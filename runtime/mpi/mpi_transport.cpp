#include "runtime/mpi/mpi_transport.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>

#include "runtime/format/error.h"
#include "runtime/mpi/wire.h"

namespace stagecraft::rt::mpi {

namespace {

// The largest piece of a tensor in one MPI message (counts are ints).
constexpr int64_t kPieceBytes = int64_t{1} << 30;

// Whether every one of `requests` is complete (non-blocking).
bool complete(std::vector<MPI_Request>& requests) {
  int flag = 0;
  MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE);
  return flag != 0;
}

}  // namespace

bool poll_until(const std::function<bool()>& done, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  if (done()) return true;
  const Clock::time_point start = Clock::now();
  for (;;) {
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (timeout_s > 0 && waited > timeout_s) return done();
    if (waited < 0.01)
      sched_yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (done()) return true;
  }
}

MpiTransport::MpiTransport(MPI_Comm comm, Layout layout, int capacity,
                           InProcessTransport::OnDelivered on_delivered, double timeout_s,
                           MPI_Comm replicas)
    : comm_(comm),
      layout_(std::move(layout)),
      capacity_(static_cast<size_t>(std::max(capacity, 1))),
      on_delivered_(std::move(on_delivered)),
      timeout_s_(timeout_s),
      replicas_(replicas) {
  std::sort(layout_.links.begin(), layout_.links.end());
  std::sort(layout_.shared_weights.begin(), layout_.shared_weights.end());
  void* value = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &value, &found);
  const int64_t tag_ub = found ? *static_cast<int*>(value) : 32767;  // the standard's least
  tag_ub_ = tag_ub;
  const int64_t tags = 1 + static_cast<int64_t>(layout_.links.size()) +
                       static_cast<int64_t>(layout_.shared_weights.size()) *
                           static_cast<int64_t>(layout_.stage_rank.size());
  if (tags > tag_ub)
    fail(ErrorKind::kUnsupported,
         "the MPI transport needs {} tags ({} links, {} shared weights x {} stages); this MPI "
         "allows {}",
         tags, layout_.links.size(), layout_.shared_weights.size(), layout_.stage_rank.size(),
         tag_ub);
}

MpiTransport::~MpiTransport() {
  if (aborted_) return;  // the run failed: the failing rank ends every rank (MPI_Abort)
  // In a run that ended well every receiver has taken its messages (it did before the last
  // step's end); a wait past the timeout is left to the run's end to report.
  for (auto& [link, queue] : in_flight_)
    for (InFlight& f : queue) poll_until([&] { return complete(f.requests); }, timeout_s_);
  for (InFlight& f : sum_parts_) poll_until([&] { return complete(f.requests); }, timeout_s_);
}

std::string MpiTransport::rank_name(int rank) const {
  if (rank >= 0 && rank < static_cast<int>(layout_.rank_names.size()))
    return layout_.rank_names[static_cast<size_t>(rank)];
  return fmt::format("rank {}", rank);
}

MPI_Status MpiTransport::probe(int rank, int tag, const std::function<std::string()>& what) {
  MPI_Status status;
  auto arrived = [&] {
    int flag = 0;
    MPI_Iprobe(rank, tag, comm_, &flag, &status);
    if (flag == 0) advance_rings();
    return flag != 0;
  };
  if (!poll_until(arrived, timeout_s_))
    fail(ErrorKind::kTimeout,
         "waited {:g} s for {} from {}: it died or stopped answering (stagerun --timeout)",
         timeout_s_, what(), rank_name(rank));
  return status;
}

std::string MpiTransport::describe(const Link& link) const {
  return fmt::format("link stage {} -> stage {} ({})", link.from_stage, link.to_stage,
                     link.gradient ? "gradients" : "activations");
}

int MpiTransport::link_tag(const Link& link) const {
  auto it = std::lower_bound(layout_.links.begin(), layout_.links.end(), link);
  if (it == layout_.links.end() || *it != link)
    fail(ErrorKind::kPlan, "no link from stage {} to stage {} ({}) in the plan", link.from_stage,
         link.to_stage, link.gradient ? "gradients" : "activations");
  return 1 + static_cast<int>(it - layout_.links.begin());
}

int MpiTransport::sum_tag(const std::string& weight, int stage) const {
  const auto& names = layout_.shared_weights;
  auto it = std::lower_bound(names.begin(), names.end(), weight);
  if (it == names.end() || *it != weight)
    fail(ErrorKind::kPlan, "shared weight '{}' is not among the plan's shared weights", weight);
  if (stage < 0 || stage >= static_cast<int>(layout_.stage_rank.size()))
    fail(ErrorKind::kPlan, "shared weight '{}': stage {} is out of range (the plan has {})",
         weight, stage, layout_.stage_rank.size());
  const int stages = static_cast<int>(layout_.stage_rank.size());
  return 1 + static_cast<int>(layout_.links.size()) +
         static_cast<int>(it - names.begin()) * stages + stage;
}

void MpiTransport::check_open() const {
  if (aborted_) throw Aborted{};
}

void MpiTransport::post_bytes(const Tensor& tensor, int rank, int tag, InFlight& into) {
  const int64_t total = tensor.bytes();
  for (int64_t at = 0; at < total; at += kPieceBytes) {
    const int count = static_cast<int>(std::min(kPieceBytes, total - at));
    MPI_Request request;
    MPI_Isend(tensor.data + at, count, MPI_BYTE, rank, tag, comm_, &request);
    into.requests.push_back(request);
  }
}

void MpiTransport::receive_bytes(Tensor& tensor, int rank, int tag, const std::string& what) {
  const int64_t total = tensor.bytes();
  for (int64_t at = 0; at < total; at += kPieceBytes) {
    const int count = static_cast<int>(std::min(kPieceBytes, total - at));
    // The size first: a message larger than the buffer would be MPI's (fatal) error.
    MPI_Status status = probe(rank, tag, [&] { return what; });
    int arrived = 0;
    MPI_Get_count(&status, MPI_BYTE, &arrived);
    if (arrived != count)
      fail(ErrorKind::kPlan, "{}: {} bytes arrived for {} (bytes {}..{} of {})", what, arrived,
           tensor.describe(), at, at + count, total);
    MPI_Recv(tensor.data + at, count, MPI_BYTE, rank, tag, comm_, MPI_STATUS_IGNORE);
  }
}

void MpiTransport::reap() {
  auto done = [](InFlight& f) { return complete(f.requests); };
  for (auto& [link, queue] : in_flight_)
    while (!queue.empty() && done(queue.front())) queue.pop_front();
  while (!sum_parts_.empty() && done(sum_parts_.front())) sum_parts_.pop_front();
}

void MpiTransport::send(const Link& link, Message message) {
  InFlight& f = post_header(link, message);
  const int to = layout_.stage_rank.at(static_cast<size_t>(link.to_stage));
  for (NamedTensor& t : message.tensors) {
    post_bytes(t.tensor, to, link_tag(link), f);
    f.tensors.push_back(std::move(t.tensor));
  }
}

void MpiTransport::send_header(const Link& link, const Message& message) {
  post_header(link, message);
}

MpiTransport::InFlight& MpiTransport::post_header(const Link& link, const Message& message) {
  check_open();
  const int tag = link_tag(link);
  const int to = layout_.stage_rank.at(static_cast<size_t>(link.to_stage));
  reap();
  std::deque<InFlight>& queue = in_flight_[link];
  // The link is full: wait until its oldest message is taken.
  while (queue.size() >= capacity_) {
    InFlight& oldest = queue.front();
    if (!poll_until(
            [&] {
              advance_rings();
              return complete(oldest.requests);
            },
            timeout_s_))
      fail(ErrorKind::kTimeout,
           "{} took nothing from the full {} for {:g} s: it died or stopped answering (stagerun "
           "--timeout)",
           rank_name(to), describe(link), timeout_s_);
    queue.pop_front();
  }
  InFlight& f = queue.emplace_back();
  f.header = message_header(message);
  MPI_Request request;
  MPI_Isend(f.header.data(), static_cast<int>(f.header.size()), MPI_BYTE, to, tag, comm_,
            &request);
  f.requests.push_back(request);
  return f;
}

Message MpiTransport::recv(const Link& link, int microbatch) {
  Message message = recv_header(link, microbatch);
  const int from = layout_.stage_rank.at(static_cast<size_t>(link.from_stage));
  for (NamedTensor& t : message.tensors)
    receive_bytes(t.tensor, from, link_tag(link),
                  fmt::format("{}: '{}'", describe(link), t.name));
  if (on_delivered_) on_delivered_(link, message);
  return message;
}

Message MpiTransport::recv_header(const Link& link, int microbatch) {
  check_open();
  const int tag = link_tag(link);
  const int from = layout_.stage_rank.at(static_cast<size_t>(link.from_stage));
  reap();
  MPI_Status status = probe(from, tag, [&] { return describe(link); });
  int size = 0;
  MPI_Get_count(&status, MPI_BYTE, &size);
  std::vector<char> header(static_cast<size_t>(size));
  MPI_Recv(header.data(), size, MPI_BYTE, from, tag, comm_, MPI_STATUS_IGNORE);
  Message message = message_from_header(header, describe(link));
  if (message.microbatch != microbatch)
    fail(ErrorKind::kPlan,
         "stage {} expected microbatch {} from stage {} but microbatch {} arrived first",
         link.to_stage, microbatch, link.from_stage, message.microbatch);
  return message;
}

void MpiTransport::start_shared_sum(const std::string& weight, const std::vector<int>& holders,
                                    int stage, const Tensor& gradient, DeviceContext& device) {
  check_open();
  if (gradient.dtype != DType::kFloat32)
    fail(ErrorKind::kUnsupported, "shared weight '{}': stage {} sums a {} gradient (float32 only)",
         weight, stage, dtype_name(gradient.dtype));
  if (std::find(holders.begin(), holders.end(), stage) == holders.end() ||
      own_parts_.count({weight, stage}))
    fail(ErrorKind::kPlan, "shared weight '{}': stage {} is not a holder ([{}]) or started twice",
         weight, stage, fmt::join(holders, ","));
  reap();
  Tensor part = clone_on(device, gradient);
  device.synchronize();  // MPI reads it
  const int tag = sum_tag(weight, stage);
  InFlight& f = sum_parts_.emplace_back();
  for (int holder : holders)
    if (holder != stage) post_bytes(part, layout_.stage_rank.at(static_cast<size_t>(holder)), tag, f);
  f.tensors.push_back(part);
  own_parts_[{weight, stage}] = part;
  holders_[weight] = holders;
}

void MpiTransport::finish_shared_sum(const std::string& weight, int stage, Tensor& gradient,
                                     DeviceContext& device) {
  check_open();
  auto own = own_parts_.find({weight, stage});
  if (own == own_parts_.end())
    fail(ErrorKind::kPlan, "shared weight '{}': stage {} finishes a sum it did not start", weight,
         stage);
  const Tensor part = own->second;
  own_parts_.erase(own);
  if (gradient.shape != part.shape || gradient.dtype != DType::kFloat32)
    fail(ErrorKind::kPlan, "shared weight '{}': stage {}'s gradient buffer is {}, the sum {}",
         weight, stage, gradient.describe(), part.describe());
  // Every holder adds the same parts in the same (ascending) order: the same bytes on each.
  const std::vector<int>& holders = holders_.at(weight);
  for (size_t h = 0; h < holders.size(); ++h) {
    Tensor other = part;
    if (holders[h] != stage) {
      other = Tensor::uninitialized(DType::kFloat32, part.shape);
      receive_bytes(other, layout_.stage_rank.at(static_cast<size_t>(holders[h])),
                    sum_tag(weight, holders[h]),
                    fmt::format("shared weight '{}': stage {}'s part for stage {}", weight,
                                holders[h], stage));
    }
    if (h == 0)
      device.copy(other, gradient);
    else
      device.accumulate(gradient, other);
  }
  device.synchronize();
}

int MpiTransport::ring_tag(const BucketKey& key) const {
  // Bucket -1: the all-gather. Every rank computes the same tag for the same bucket.
  const int64_t stages = static_cast<int64_t>(layout_.stage_rank.size());
  const int64_t tag = 1 + key.stage + stages * (int64_t{key.bucket} + 1);
  if (tag > tag_ub_)
    fail(ErrorKind::kUnsupported,
         "stage {}: gradient bucket {} needs MPI tag {}; this MPI allows {} (a larger "
         "--bucket-mb makes fewer buckets)",
         key.stage, key.bucket, tag, tag_ub_);
  return static_cast<int>(tag);
}

void MpiTransport::start_replica_sum(const BucketKey& key, ReplicaOp op, const Tensor& bucket,
                                     const std::vector<int64_t>& bounds, DeviceContext& device) {
  const bool all = op == ReplicaOp::kAllReduce;
  const int replicas = replica_count(key.stage, all ? "an ALLREDUCE" : "a sharded ALLREDUCE");
  if (rings_.count(key))
    fail(ErrorKind::kPlan, "stage {}: gradient bucket {} is summed twice in one step", key.stage,
         key.bucket);
  std::vector<int64_t> split = bounds;
  if (all) {
    split.clear();
    for (int c = 0; c < replicas; ++c)
      split.push_back(replica_chunk(bucket.numel(), replicas, c).first);
    split.push_back(bucket.numel());
  }
  // The reduce-scatter's ring chunk c is shard c - 1: the reduce-scatter ends chunk me + 1,
  // shard me, here.
  Ring ring = all ? make_ring(key, bucket, split, 0, true, true, "all-reduce")
                  : make_ring(key, bucket, split, -1, true, false, "reduce-scatter");
  device.synchronize();  // MPI reads the bucket
  ring.device = &device;
  Ring& started = rings_.emplace(key, std::move(ring)).first->second;
  advance(started);
}

void MpiTransport::progress_replicas(int /*stage*/, DeviceContext& /*device*/) {
  check_open();
  advance_rings();  // every ring of this rank (its stages are one device's)
}

void MpiTransport::advance_rings() {
  for (auto& [key, ring] : rings_)
    if (!ring.done()) advance(ring);
}

void MpiTransport::finish_replica_sum(const BucketKey& key, DeviceContext& device) {
  check_open();
  auto it = rings_.find(key);
  if (it == rings_.end())
    fail(ErrorKind::kPlan, "stage {}: waits for gradient bucket {}, never started", key.stage,
         key.bucket);
  complete_ring(it->second);
  rings_.erase(it);
}

void MpiTransport::replica_all_gather(int stage, Tensor& bucket,
                                      const std::vector<int64_t>& bounds, DeviceContext& device) {
  replica_count(stage, "a sharded OPT_STEP");
  device.synchronize();  // MPI reads the bucket
  Ring ring = make_ring({stage, -1}, bucket, bounds, -1, false, true, "all-gather");
  ring.device = &device;
  complete_ring(ring);
}

int MpiTransport::replica_count(int stage, const char* what) {
  check_open();
  int replicas = 1;
  if (replicas_ != MPI_COMM_NULL) MPI_Comm_size(replicas_, &replicas);
  if (replicas < 2) fail(ErrorKind::kPlan, "stage {}: {}, but the run has one replica", stage, what);
  return replicas;
}

MpiTransport::Ring MpiTransport::make_ring(const BucketKey& key, const Tensor& bucket,
                                           const std::vector<int64_t>& bounds, int shift,
                                           bool reduce, bool gather, const char* what) {
  int replicas = 1;
  MPI_Comm_size(replicas_, &replicas);
  const int stage = key.stage;
  if (bucket.dtype != DType::kFloat32 || bucket.rank() != 1)
    fail(ErrorKind::kUnsupported, "stage {}: the {} takes a 1-D float32 bucket, not {}", stage,
         what, bucket.describe());
  bool ok = bounds.size() == static_cast<size_t>(replicas) + 1 && bounds.front() == 0 &&
            bounds.back() == bucket.numel();
  int64_t largest = 0;
  for (size_t r = 1; ok && r < bounds.size(); ++r) {
    ok = bounds[r] >= bounds[r - 1];
    largest = std::max(largest, bounds[r] - bounds[r - 1]);
  }
  if (!ok)
    fail(ErrorKind::kPlan,
         "stage {}: shard boundaries [{}] do not split a bucket of {} elements over {} replicas",
         stage, fmt::join(bounds, ", "), bucket.numel(), replicas);
  if (4 * largest > INT_MAX)
    fail(ErrorKind::kUnsupported,
         "stage {}: a gradient chunk of {} floats is more than one MPI message holds", stage,
         largest);
  Ring ring;
  ring.key = key;
  ring.bucket = bucket;
  ring.incoming = Tensor::uninitialized(DType::kFloat32, {reduce ? largest : 0});
  ring.bounds = bounds;
  ring.shift = shift;
  ring.reduce = reduce;
  ring.gather = gather;
  ring.steps = (reduce ? replicas - 1 : 0) + (gather ? replicas - 1 : 0);
  ring.tag = ring_tag(key);
  ring.what = what;
  return ring;
}

bool MpiTransport::advance(Ring& ring) {
  DeviceContext& device = *ring.device;
  int replicas = 1, me = 0;
  MPI_Comm_size(replicas_, &replicas);
  MPI_Comm_rank(replicas_, &me);
  const int next = (me + 1) % replicas, previous = (me + replicas - 1) % replicas;
  auto chunk = [&](int c) {
    const int r = (((c + ring.shift) % replicas) + replicas) % replicas;
    return slice_rows(ring.bucket, ring.bounds[static_cast<size_t>(r)],
                      ring.bounds[static_cast<size_t>(r) + 1]);
  };
  const int reduce_steps = ring.reduce ? replicas - 1 : 0;
  while (!ring.done()) {
    // Reduce-scatter step k: this rank sends chunk me - k and adds the previous rank's chunk
    // me - k - 1 to its own, so after R - 1 steps chunk me + 1 is summed over replicas
    // me + 1 .. me + R in that order. All-gather step k: the whole chunk me + 1 - k goes on and
    // chunk me - k comes in.
    const bool reducing = ring.step < reduce_steps;
    const int k = reducing ? ring.step : ring.step - reduce_steps;
    if (ring.pending.empty()) {
      const Tensor out = reducing ? chunk(me - k) : chunk(me + 1 - k);
      Tensor in = reducing ? slice_rows(ring.incoming, 0, chunk(me - k - 1).numel()) : chunk(me - k);
      ring.pending.resize(2);
      MPI_Isend(out.data, static_cast<int>(out.bytes()), MPI_BYTE, next, ring.tag, replicas_,
                &ring.pending[0]);
      MPI_Irecv(in.data, static_cast<int>(in.bytes()), MPI_BYTE, previous, ring.tag, replicas_,
                &ring.pending[1]);
    }
    if (!complete(ring.pending)) return false;
    ring.pending.clear();
    if (reducing) {
      Tensor into = chunk(me - k - 1);
      device.accumulate(into, slice_rows(ring.incoming, 0, into.numel()));
      device.synchronize();  // the next step may send what was just added
    }
    ++ring.step;
  }
  return true;
}

void MpiTransport::complete_ring(Ring& ring) {
  auto done = [&] {
    for (auto& [key, other] : rings_)
      if (&other != &ring && !other.done()) advance(other);
    return advance(ring);
  };
  if (poll_until(done, timeout_s_)) return;
  int replicas = 1, me = 0;
  MPI_Comm_size(replicas_, &replicas);
  MPI_Comm_rank(replicas_, &me);
  auto name = [&](int rank) {
    return rank < static_cast<int>(layout_.replica_names.size())
               ? layout_.replica_names[static_cast<size_t>(rank)]
               : fmt::format("replica {}", rank);
  };
  int received = 0;
  if (ring.pending.size() == 2) MPI_Test(&ring.pending[1], &received, MPI_STATUS_IGNORE);
  const int reduce_steps = ring.reduce ? replicas - 1 : 0;
  const bool reducing = ring.step < reduce_steps;
  fail(ErrorKind::kTimeout,
       "waited {:g} s for {} (the {} of stage {}'s gradients{}, {} step {} of {}): it "
       "died or stopped answering (stagerun --timeout)",
       timeout_s_,
       received ? name((me + 1) % replicas) + " to take a chunk"
                : "a chunk from " + name((me + replicas - 1) % replicas),
       ring.what, ring.key.stage,
       ring.key.bucket >= 0 ? fmt::format(", bucket {}", ring.key.bucket) : std::string(),
       reducing ? "reduce-scatter" : "all-gather",
       (reducing ? ring.step : ring.step - reduce_steps) + 1, replicas - 1);
}

void MpiTransport::abort() { aborted_ = true; }

}  // namespace stagecraft::rt::mpi
