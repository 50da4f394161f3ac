#pragma once
/// \file
/// The transport between ranks of one `mpirun` (one rank per plan device, CPU ranks): MPI
/// point-to-point on a communicator, one tag per link so that each link's messages arrive in
/// the order they were sent (MPI's non-overtaking rule holds per sender, communicator and tag).
///
/// A message is a small header (microbatch; per tensor its name, dtype and shape: wire.h) and
/// then each tensor's bytes as messages of their own, all sent non-blocking: `send` returns
/// once they are posted and the transport holds the tensors until MPI is done with them, so the
/// sender goes on computing. `recv` blocks until the link's next message is in.
///
/// Failures: every wait polls (`poll_until`) and gives up after the timeout with
/// `Error(kTimeout)` naming the rank waited for and what for, so a rank that died or hangs
/// ends the run within the timeout even where mpirun does not notice it; the failing rank's
/// `MPI_Abort` (runtime/mpi/world.h) then ends every rank. `abort` makes this process's later
/// calls throw `Aborted`.

#include <mpi.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/exec/transport.h"

namespace stagecraft::rt::mpi {

/// Where things are: the rank of every stage, every link and every shared weight of the plan,
/// the same on every rank (all read the same plan.json).
struct Layout {
  std::vector<int> stage_rank;              ///< Per stage: the rank that runs it.
  std::vector<Link> links;                  ///< Every link of the plan, one tag each.
  std::vector<std::string> shared_weights;  ///< Names of the weights several stages hold.
  /// Per rank of the communicator, how messages name it: "rank 1 (device 1)".
  std::vector<std::string> rank_names = {};
  /// Per rank of the replicas' communicator (data parallelism), how messages name it.
  std::vector<std::string> replica_names = {};
};

/// Calls `done` until it returns true: at once at first, then yielding the processor between
/// calls and, once a wait is long (10 ms), sleeping 100 us between them, so a waiting rank
/// leaves an oversubscribed machine's cores to the ranks that compute. Returns false when
/// `timeout_s` (> 0; 0: no limit) has passed first.
bool poll_until(const std::function<bool()>& done, double timeout_s);

class MpiTransport final : public Transport {
 public:
  /// `capacity`: a link's sends in flight before `send` waits for the oldest to be received
  /// (the in-process transport's bound on a link's buffer). `on_delivered` is called in `recv`
  /// with the message received (the moment its bytes become this rank's).
  /// `replicas`: the communicator of this device's data-parallel replicas (rank = replica),
  /// over which `start_replica_sum` runs its rings; MPI_COMM_NULL without data parallelism.
  MpiTransport(MPI_Comm comm, Layout layout, int capacity,
               InProcessTransport::OnDelivered on_delivered = {}, double timeout_s = 0,
               MPI_Comm replicas = MPI_COMM_NULL);
  /// Waits for the sends still in flight (their receivers take them in a run that ends well).
  ~MpiTransport() override;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  void send(const Link& link, Message message) override;
  Message recv(const Link& link, int microbatch) override;
  /// Sends `stage`'s part (a copy, held until sent) to every other holder's rank.
  void start_shared_sum(const std::string& weight, const std::vector<int>& holders, int stage,
                        const Tensor& gradient, DeviceContext& device) override;
  /// Receives the other holders' parts and adds them all in ascending stage order, as the
  /// in-process transport does, so every holder gets the same bytes.
  void finish_shared_sum(const std::string& weight, int stage, Tensor& gradient,
                         DeviceContext& device) override;
  /// A ring over the replicas' communicator, run non-blocking: all-reduce: R - 1 steps of
  /// reduce-scatter (each rank sends one chunk to the next replica and adds the chunk the
  /// previous one sent), then R - 1 of all-gather; every message is 1/R of the bucket, so each
  /// rank sends 2 (R - 1) / R of it, the figure the planner counts. ZeRO-1's reduce-scatter:
  /// the first half alone, with ring chunk c being shard c - 1 (so that shard r ends at replica
  /// r). Each bucket's ring has a tag of its own, so several go round at once; a step is posted
  /// (MPI_Isend, MPI_Irecv) and the next one posted when `progress_replicas` or
  /// `finish_replica_sum` finds it complete (MPI_Testall), so the sums advance between the
  /// caller's kernels while it computes.
  void start_replica_sum(const BucketKey& key, ReplicaOp op, const Tensor& bucket,
                         const std::vector<int64_t>& bounds, DeviceContext& device) override;
  void progress_replicas(int stage, DeviceContext& device) override;
  void finish_replica_sum(const BucketKey& key, DeviceContext& device) override;
  /// ZeRO-1's all-gather after the optimizer step: the second half of the ring alone, blocking.
  void replica_all_gather(int stage, Tensor& bucket, const std::vector<int64_t>& bounds,
                          DeviceContext& device) override;
  void abort() override;

  /// The header of `message` alone on `link` (its microbatch, its tensors' names, dtypes and
  /// shapes), for a transport that moves the bytes itself (NCCL: gpu_transport.h); `send`'s
  /// bound on the link's messages in flight holds.
  void send_header(const Link& link, const Message& message);
  /// The next header on `link` (`recv`'s checks and timeout), its tensors allocated in host
  /// memory and not filled.
  Message recv_header(const Link& link, int microbatch);

  /// The tag of `link`, and of `stage`'s part of the sum of shared weight `weight`.
  int link_tag(const Link& link) const;
  int sum_tag(const std::string& weight, int stage) const;

 private:
  /// Sends posted and not yet complete, with what they read (kept alive until then).
  struct InFlight {
    std::vector<MPI_Request> requests;
    std::vector<char> header;
    std::vector<Tensor> tensors;
  };
  /// Posts `message`'s header on `link` once the link has room; its entry in flight.
  InFlight& post_header(const Link& link, const Message& message);
  /// Posts `tensor`'s bytes to `rank` with `tag`, in pieces MPI's int counts can hold.
  void post_bytes(const Tensor& tensor, int rank, int tag, InFlight& into);
  /// Receives what `post_bytes` sent into `tensor`, whose size the receiver knows.
  void receive_bytes(Tensor& tensor, int rank, int tag, const std::string& what);
  /// Waits for a message from `rank` with `tag` and returns its status; past the timeout
  /// throws `Error(kTimeout)` naming the rank and `what` it was to send ("link stage 1 ->
  /// stage 0 (gradients)").
  MPI_Status probe(int rank, int tag, const std::function<std::string()>& what);
  /// How messages name `rank`.
  std::string rank_name(int rank) const;
  /// Drops the sends in flight that MPI has finished with (non-blocking).
  void reap();
  void check_open() const;
  std::string describe(const Link& link) const;

  MPI_Comm comm_;
  Layout layout_;
  size_t capacity_;
  InProcessTransport::OnDelivered on_delivered_;
  std::map<Link, std::deque<InFlight>> in_flight_;  ///< Per link, oldest first.
  std::deque<InFlight> sum_parts_;                  ///< Shared-sum parts being sent.
  std::map<std::pair<std::string, int>, Tensor> own_parts_;  ///< (weight, stage) -> its part.
  std::map<std::string, std::vector<int>> holders_;  ///< Per shared weight: its holders.
  double timeout_s_ = 0;
  MPI_Comm replicas_ = MPI_COMM_NULL;
  std::atomic<bool> aborted_{false};

  /// A ring in progress over the replicas' communicator on `bucket` split at `bounds` (ring
  /// chunk c is shard c + `shift`, mod R): R - 1 reduce-scatter steps when `reduce`, then R - 1
  /// all-gather steps when `gather`.
  struct Ring {
    BucketKey key;
    Tensor bucket, incoming;
    std::vector<int64_t> bounds;
    int shift = 0, step = 0, steps = 0, tag = 0;
    bool reduce = false, gather = false;
    const char* what = "";
    DeviceContext* device = nullptr;   ///< The starting worker's, which adds the chunks.
    std::vector<MPI_Request> pending;  ///< The step's send and receive while posted.
    bool done() const { return step == steps; }
  };
  /// R, the replicas; `Error(kPlan)` naming `what` with one.
  int replica_count(int stage, const char* what);
  /// Checks `bounds` and makes the ring of `key` (not started: `advance` posts its first step).
  Ring make_ring(const BucketKey& key, const Tensor& bucket, const std::vector<int64_t>& bounds,
                 int shift, bool reduce, bool gather, const char* what);
  /// Takes `ring` as far as it goes without waiting; true once it is done.
  bool advance(Ring& ring);
  /// Advances every ring in flight (also while a send or receive waits: a replica may be
  /// waiting for this rank's next ring step).
  void advance_rings();
  /// Advances every ring until `ring` is done; past the timeout throws naming the silent peer.
  void complete_ring(Ring& ring);
  /// The tag of a bucket's ring on the replicas' communicator.
  int ring_tag(const BucketKey& key) const;
  std::map<BucketKey, Ring> rings_;  ///< Started and not yet finished.
  int64_t tag_ub_ = 32767;
};

}  // namespace stagecraft::rt::mpi
