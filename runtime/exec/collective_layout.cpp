#include "runtime/exec/collective_layout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "runtime/format/error.h"

namespace stagecraft::rt {

GpuTransportChoice choose_gpu_transport(const std::string& requested,
                                        const std::string& nccl_missing,
                                        const std::vector<std::string>& identities,
                                        const std::vector<std::string>& rank_names) {
  if (requested != "auto" && requested != "nccl" && requested != "mpi")
    fail(ErrorKind::kUsage, "--transport {}: auto, nccl or mpi", requested);
  if (requested == "mpi")
    return {GpuTransport::kHostStaged, "MPI through host memory (--transport mpi)"};
  std::string why = nccl_missing;
  if (why.empty()) {
    // NCCL refuses a communicator with two ranks on one GPU.
    std::map<std::string, size_t> first;
    for (size_t r = 0; r < identities.size() && why.empty(); ++r) {
      auto [it, fresh] = first.emplace(identities[r], r);
      if (!fresh) {
        auto name = [&](size_t k) {
          return k < rank_names.size() ? rank_names[k] : fmt::format("rank {}", k);
        };
        why = fmt::format("{} and {} share a GPU, which NCCL refuses", name(it->second), name(r));
      }
    }
  }
  if (why.empty()) return {GpuTransport::kNccl, "NCCL"};
  if (requested == "nccl") fail(ErrorKind::kUnsupported, "--transport nccl: {}", why);
  return {GpuTransport::kHostStaged, fmt::format("MPI through host memory ({})", why)};
}

std::vector<CommGroup> comm_groups(const std::vector<int>& stage_device, std::vector<Link> links,
                                   int pipeline_devices, int replicas) {
  std::sort(links.begin(), links.end());
  links.erase(std::unique(links.begin(), links.end()), links.end());
  auto device_of = [&](int stage) {
    if (stage < 0 || stage >= static_cast<int>(stage_device.size()))
      fail(ErrorKind::kPlan, "a link names stage {}; the plan has {}", stage, stage_device.size());
    const int d = stage_device[static_cast<size_t>(stage)];
    if (d < 0 || d >= pipeline_devices)
      fail(ErrorKind::kPlan, "stage {} runs on device {}; the pipeline has {}", stage, d,
           pipeline_devices);
    return d;
  };
  std::vector<CommGroup> groups;
  for (int r = 0; r < replicas; ++r)
    for (const Link& link : links) {
      const int from = device_of(link.from_stage), to = device_of(link.to_stage);
      if (from == to) continue;
      const int base = r * pipeline_devices;
      groups.push_back({{base + from, base + to}, false, link, r});
    }
  if (replicas >= 2)
    for (int d = 0; d < pipeline_devices; ++d) {
      CommGroup g{{}, true, {}, d};
      for (int r = 0; r < replicas; ++r) g.ranks.push_back(r * pipeline_devices + d);
      groups.push_back(std::move(g));
    }
  return groups;
}

int link_group(const std::vector<CommGroup>& groups, const std::vector<int>& stage_device,
               const Link& link, int replica) {
  for (size_t k = 0; k < groups.size(); ++k)
    if (!groups[k].replicas && groups[k].link == link && groups[k].replica == replica)
      return static_cast<int>(k);
  const auto stages = static_cast<int>(stage_device.size());
  const bool known = link.from_stage >= 0 && link.from_stage < stages && link.to_stage >= 0 &&
                     link.to_stage < stages;
  if (known && stage_device[static_cast<size_t>(link.from_stage)] ==
                   stage_device[static_cast<size_t>(link.to_stage)])
    return -1;
  fail(ErrorKind::kPlan, "no link from stage {} to stage {} ({}) in replica {} of the plan",
       link.from_stage, link.to_stage, link.gradient ? "gradients" : "activations", replica);
}

int replica_group(const std::vector<CommGroup>& groups, int device) {
  for (size_t k = 0; k < groups.size(); ++k)
    if (groups[k].replicas && groups[k].replica == device) return static_cast<int>(k);
  return -1;
}

std::vector<OwnedShard> owned_shards(const std::vector<int64_t>& bounds, int64_t elements,
                                     int replicas, int stage) {
  bool ok = replicas >= 1 && bounds.size() == static_cast<size_t>(replicas) + 1 &&
            bounds.front() == 0 && bounds.back() == elements;
  for (size_t r = 1; ok && r < bounds.size(); ++r) ok = bounds[r] >= bounds[r - 1];
  if (!ok)
    fail(ErrorKind::kPlan,
         "stage {}: shard boundaries [{}] do not split a bucket of {} elements over {} replicas",
         stage, fmt::join(bounds, ", "), elements, replicas);
  std::vector<OwnedShard> shards;
  for (int r = 0; r < replicas; ++r) {
    const int64_t lo = bounds[static_cast<size_t>(r)], hi = bounds[static_cast<size_t>(r) + 1];
    if (hi > lo) shards.push_back({lo, hi - lo, r});
  }
  return shards;
}

std::vector<int64_t> message_pieces(const Message& message) {
  std::vector<int64_t> pieces;
  for (const NamedTensor& t : message.tensors) pieces.push_back(t.tensor.bytes());
  return pieces;
}

}  // namespace stagecraft::rt
