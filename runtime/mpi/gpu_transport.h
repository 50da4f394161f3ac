#pragma once
/// \file
/// The transports between GPU ranks of one `mpirun` (`stagerun --backend cuda`): NCCL, device
/// to device, where it can be used, else MPI with the bytes staged through host memory
/// (runtime/exec/collective_layout.h chooses, and says why).
///
/// NCCL: one communicator per link between two devices of a replica's pipeline (its sender and
/// receiver: collective_layout.h says why not one per pipeline) and one per pipeline device's
/// data-parallel replicas, each with a stream of its own that waits for the compute stream by
/// a CUDA event (runtime/cuda/nccl_comms.cpp). They are made at a rank's first run, every rank
/// joining its groups in one order and exchanging a first message on each, so that NCCL
/// connects them then and not at a later send (which would wait for its peer's receive). A
/// message's header (microbatch, names, dtypes, shapes) goes over MPI as the CPU ranks' does,
/// its bytes by ncclSend and ncclRecv; the replicas' bucket sums by ncclAllReduce, ZeRO-1's
/// reduce-scatter and all-gather by grouped ncclReduce and ncclBroadcast per shard (shards of
/// any size), started while the backward goes on and waited for at ALLREDUCE. Shared-weight
/// sums (weights several stages hold) go through host memory over MPI, in ascending stage
/// order as elsewhere.
///
/// Failures: every wait polls, NCCL's included (communicators are non-blocking; the compute
/// stream never waits for NCCL work not seen complete), and gives up after the run's timeout
/// with `Error(kTimeout)` naming the rank waited for, aborting the communicator
/// (ncclCommAbort) so that no kernel is left waiting; the failing rank's MPI_Abort then ends
/// every rank (world.h). NCCL's own 10-minute watchdog never comes into it.

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/exec/collective_layout.h"
#include "runtime/mpi/mpi_transport.h"

namespace stagecraft::rt::mpi {

/// MPI between GPU ranks through host memory: what is sent is read into host memory first,
/// what arrives is host memory the receiving device adopts, and the sums (the replicas' rings,
/// the shared weights') run on host copies, written back to the device when complete.
class HostStagedTransport final : public Transport {
 public:
  /// `staging`: a context of this rank's GPU (the compute stream's order) for the reads.
  HostStagedTransport(std::unique_ptr<MpiTransport> mpi, std::unique_ptr<DeviceContext> staging);
  ~HostStagedTransport() override;
  MpiTransport& mpi() { return *mpi_; }

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
  std::unique_ptr<MpiTransport> mpi_;
  std::unique_ptr<DeviceContext> staging_;
  std::unique_ptr<DeviceContext> host_;  ///< The CPU's, for the sums on host copies.
  struct Staged {
    Tensor host, device;  ///< The host copy being summed; the caller's bucket.
  };
  std::map<BucketKey, Staged> sums_;
};

/// The NCCL communicators a rank has joined, made once (at its first run) and kept for the
/// later runs of the process.
struct NcclSession {
  std::vector<CommGroup> groups;            ///< Every rank's (collective_layout.h).
  std::map<int, std::unique_ptr<DeviceGroup>> joined;  ///< This rank's, by index in `groups`.
  std::vector<int> stage_device;            ///< Per stage, its pipeline device.
  std::vector<std::string> rank_names;      ///< Per rank (by device): "rank 1 (device 1)".
  int rank = 0;                             ///< This rank (by device).
  DeviceGroup& group(int index);
};

class NcclTransport final : public Transport {
 public:
  /// `staged`: MPI for the headers and the shared sums; `device`: a context of this rank's GPU
  /// (receive buffers come from its pool, in the compute stream's order).
  NcclTransport(std::shared_ptr<NcclSession> session, std::unique_ptr<HostStagedTransport> staged,
                std::unique_ptr<DeviceContext> device, int replica, int capacity,
                InProcessTransport::OnDelivered on_delivered, double timeout_s);
  /// Waits (within the timeout) for the sends in flight, as the MPI transport does.
  ~NcclTransport() override;

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
  struct InFlight {
    std::vector<int64_t> tickets;
    std::vector<Tensor> tensors;  ///< Kept alive until NCCL has sent them.
  };
  struct Sum {
    int group = 0;
    int64_t ticket = 0;
  };
  /// Polls `tickets` of group `index` until done; past the timeout aborts the group and throws
  /// `Error(kTimeout)` with `what()` ("link stage 0 -> stage 1 (activations) from rank 0").
  template <typename What>
  void wait(int index, const std::vector<int64_t>& tickets, What what);
  /// The replicas' group of this rank's pipeline device; `Error(kPlan)` naming `what` without.
  int replicas_group(int stage, const char* what) const;
  std::string describe(const Link& link) const;
  std::string replicas_named(int index) const;
  void check_open() const;

  std::shared_ptr<NcclSession> session_;
  std::unique_ptr<HostStagedTransport> staged_;
  std::unique_ptr<DeviceContext> device_;
  int replica_;
  size_t capacity_;
  InProcessTransport::OnDelivered on_delivered_;
  double timeout_s_;
  std::map<Link, std::deque<InFlight>> in_flight_;  ///< Per link, oldest first.
  std::map<Link, std::deque<Message>> local_;       ///< Links within this rank's device.
  std::map<BucketKey, Sum> sums_;
  std::atomic<bool> aborted_{false};
};

}  // namespace stagecraft::rt::mpi
