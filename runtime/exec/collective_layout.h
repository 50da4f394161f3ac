#pragma once
/// \file
/// How the GPU ranks of one `mpirun` reach each other (runtime/mpi/gpu_transport.h), decided
/// alike on every rank from the plan and what the ranks tell each other: which transport
/// (NCCL, or MPI through host memory where NCCL cannot be used), which NCCL communicators
/// there are and who is in each, which one a link uses and the peer on it, and how ZeRO-1's
/// shards map onto NCCL's rooted collectives. Plain C++ (no NCCL, no MPI), tested on its own.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/device_comm.h"
#include "runtime/exec/transport.h"

namespace stagecraft::rt {

/// Between GPU ranks: NCCL (device to device), or MPI with the bytes staged through host
/// memory (what is left where NCCL cannot be used).
enum class GpuTransport { kNccl, kHostStaged };

struct GpuTransportChoice {
  GpuTransport kind = GpuTransport::kHostStaged;
  std::string why;  ///< For the banner: "NCCL 2.28" or why host-staged MPI.
};

/// `requested`: "auto", "nccl" or "mpi" (stagerun --transport). `nccl_missing`: "" when NCCL
/// can be used, else why not. `identities`: per rank of the launch, its GPU (equal strings: a
/// shared GPU, which NCCL refuses); `rank_names` names them. "auto" takes NCCL unless it is
/// missing or two ranks share a GPU; "nccl" then throws `Error(kUnsupported)` saying why.
GpuTransportChoice choose_gpu_transport(const std::string& requested,
                                        const std::string& nccl_missing,
                                        const std::vector<std::string>& identities,
                                        const std::vector<std::string>& rank_names);

/// One NCCL communicator of a launch. Ranks are the launch's ranks by device (rank g runs
/// pipeline device g % P of replica g / P); a member's rank in the group is its index.
struct CommGroup {
  std::vector<int> ranks;
  bool replicas = false;  ///< A data-parallel group (a pipeline device's replicas), else a link.
  Link link;              ///< The link (of every replica's pipeline: one group per replica).
  int replica = 0;        ///< The link's replica; for a replicas' group, the pipeline device.
  friend bool operator==(const CommGroup&, const CommGroup&) = default;
};

/// Every communicator of a run of `replicas` replicas of a `pipeline_devices`-device pipeline
/// whose stage s runs on device `stage_device[s]`, in the order every rank makes them: per
/// replica, per link (in `Link` order) between two different devices, the pair (sender first:
/// NCCL matches a pair's sends and receives in the order each side issues them per
/// communicator, so one communicator per link keeps every link's order its own, where one per
/// pipeline would deadlock a 1F1B stage that sends activations and receives gradients in the
/// other order than its neighbour); then, with 2 replicas or more, per pipeline device its
/// replicas. A link within one device has no communicator (the tensor stays on the GPU).
std::vector<CommGroup> comm_groups(const std::vector<int>& stage_device, std::vector<Link> links,
                                   int pipeline_devices, int replicas);

/// The index in `groups` of `link`'s communicator in replica `replica`; -1 when the link stays
/// within one device. Throws `Error(kPlan)` for a link that is not the plan's.
int link_group(const std::vector<CommGroup>& groups, const std::vector<int>& stage_device,
               const Link& link, int replica);

/// The index in `groups` of pipeline device `device`'s replicas' communicator; -1 without one.
int replica_group(const std::vector<CommGroup>& groups, int device);

/// ZeRO-1's shards of a bucket of `elements` split at `bounds` (R + 1 offsets from 0 to
/// `elements`): shard r is replica r's; empty shards are left out (NCCL moves nothing for
/// them). Throws `Error(kPlan)` naming `stage` when the bounds do not split the bucket.
std::vector<OwnedShard> owned_shards(const std::vector<int64_t>& bounds, int64_t elements,
                                     int replicas, int stage);

/// The bytes of each tensor of `message` in the order they travel (one ncclSend each, after
/// the header, which goes over MPI), one entry per tensor: 0 sends nothing.
std::vector<int64_t> message_pieces(const Message& message);

}  // namespace stagecraft::rt
