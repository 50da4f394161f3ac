#pragma once
/// \file
/// Collectives between the GPUs of several processes (NCCL), as the multi-process runtime
/// (runtime/mpi) asks for them without seeing NCCL or CUDA: the CUDA plugin implements these
/// (runtime/cuda/nccl_comms.cpp), and the ranks share each group's id over MPI.
///
/// A `DeviceGroup` is one NCCL communicator with a CUDA stream of its own. Each operation is
/// queued on that stream after the work the device's compute stream holds so far (a CUDA event
/// recorded there), and returns a ticket; `done(ticket)` says, without waiting, whether it has
/// completed, and throws when the communicator has failed. The caller polls it (with its
/// timeout) before it uses or frees the bytes, so the compute stream never waits for NCCL and a
/// peer that died cannot hang this process: `abort` (ncclCommAbort) ends what is in flight.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace stagecraft::rt {

/// One shard of a bucket that ZeRO-1's reduce-scatter and all-gather move: elements
/// [offset, offset + count) of the bucket, owned by group rank `root`.
struct OwnedShard {
  int64_t offset = 0;
  int64_t count = 0;
  int root = 0;
  friend bool operator==(const OwnedShard&, const OwnedShard&) = default;
};

class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;
  /// Sends `tensor`'s bytes to group rank `peer` (ncclSend); the caller keeps `tensor` alive
  /// until the ticket is done.
  virtual int64_t send(const Tensor& tensor, int peer) = 0;
  /// Receives `tensor.bytes()` bytes from group rank `peer` into `tensor` (ncclRecv).
  virtual int64_t recv(Tensor& tensor, int peer) = 0;
  /// Sums the float32 `bucket` over the group in place (ncclAllReduce).
  virtual int64_t all_reduce(Tensor& bucket) = 0;
  /// Sums each shard of the float32 `bucket` into its root's bucket (one ncclReduce per shard,
  /// grouped): ZeRO-1's reduce-scatter with shards of any size.
  virtual int64_t reduce_to_owners(Tensor& bucket, const std::vector<OwnedShard>& shards) = 0;
  /// Copies each shard of `bucket` from its root to every rank (one ncclBroadcast per shard,
  /// grouped): ZeRO-1's all-gather.
  virtual int64_t broadcast_from_owners(Tensor& bucket, const std::vector<OwnedShard>& shards) = 0;
  /// Whether the operation of `ticket` has completed (cudaEventQuery); throws
  /// `Error(kInternal)` with NCCL's words when the communicator reports an error.
  virtual bool done(int64_t ticket) = 0;
  /// Makes NCCL connect the group's ranks now, every rank of the group calling it together
  /// (the first operation between two ranks waits for both to reach it; later ones do not):
  /// a pair (`pair`, rank 0 the sender) exchanges a byte, a replicas' group runs each collective
  /// it will run once on a few floats. Throws `Error(kTimeout)` past the group's time limit.
  virtual void connect(bool pair) = 0;
  /// Aborts the communicator (ncclCommAbort): whatever is in flight ends; later calls throw.
  virtual void abort() = 0;
};

/// What a backend offers for collectives between processes (the CUDA backend: NCCL).
class DeviceComms {
 public:
  virtual ~DeviceComms() = default;
  /// "" when groups can be made, else why not, in one line ("this build has no NCCL").
  virtual std::string unavailable() const = 0;
  /// A new group id (ncclGetUniqueId), as bytes, for the caller to share with the group.
  virtual std::vector<char> new_id() const = 0;
  /// What identifies the physical device plan device `device` runs on (the GPU's UUID), so
  /// that ranks can tell when two of them share one (which NCCL refuses).
  virtual std::string device_identity(int device) const = 0;
  /// Joins group `id` as rank `rank` of `ranks` on plan device `device`'s GPU
  /// (ncclCommInitRankConfig, non-blocking): every rank of the group calls it. Throws
  /// `Error(kTimeout)` when the group is not complete within `timeout_s` (> 0; 0: no limit).
  virtual std::unique_ptr<DeviceGroup> join(const std::vector<char>& id, int ranks, int rank,
                                            int device, double timeout_s) const = 0;
};

}  // namespace stagecraft::rt
