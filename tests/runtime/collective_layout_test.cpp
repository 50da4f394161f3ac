// The GPU ranks' transport logic that needs no GPU (runtime/exec/collective_layout.h): which
// transport, which NCCL communicators and who is in each, the link -> communicator map (and
// that it cannot deadlock 1F1B where one communicator per pipeline does), ZeRO-1's shards and
// a message's pieces.
#include <doctest/doctest.h>

#include <deque>
#include <functional>
#include <map>

#include "runtime/exec/collective_layout.h"
#include "runtime/format/error.h"
#include "runtime/mpi/rebase.h"

namespace stagecraft::rt {
namespace {

const std::vector<std::string> kNames = {"rank 0 (device 0)", "rank 1 (device 1)",
                                         "rank 2 (device 2)"};

TEST_CASE("choose_gpu_transport takes NCCL unless it is missing or two ranks share a GPU") {
  CHECK(choose_gpu_transport("auto", "", {"GPU-a", "GPU-b"}, kNames).kind == GpuTransport::kNccl);
  CHECK(choose_gpu_transport("nccl", "", {"GPU-a", "GPU-b"}, kNames).kind == GpuTransport::kNccl);
  GpuTransportChoice mpi = choose_gpu_transport("mpi", "", {"GPU-a", "GPU-b"}, kNames);
  CHECK(mpi.kind == GpuTransport::kHostStaged);
  CHECK(mpi.why.find("--transport mpi") != std::string::npos);
  // Two ranks on one GPU: NCCL refuses them, so auto falls back and says who.
  GpuTransportChoice shared = choose_gpu_transport("auto", "", {"GPU-a", "GPU-b", "GPU-a"}, kNames);
  CHECK(shared.kind == GpuTransport::kHostStaged);
  CHECK(shared.why == "MPI through host memory (rank 0 (device 0) and rank 2 (device 2) share a "
                      "GPU, which NCCL refuses)");
  GpuTransportChoice missing =
      choose_gpu_transport("auto", "rank 1 (device 1): this build has no NCCL", {"a", "b"}, kNames);
  CHECK(missing.kind == GpuTransport::kHostStaged);
  CHECK(missing.why.find("this build has no NCCL") != std::string::npos);
  CHECK_THROWS_WITH_AS(choose_gpu_transport("nccl", "", {"GPU-a", "GPU-a"}, kNames),
                       doctest::Contains("--transport nccl: rank 0 (device 0) and rank 1"), Error);
  CHECK_THROWS_WITH_AS(choose_gpu_transport("gloo", "", {"a"}, kNames),
                       doctest::Contains("auto, nccl or mpi"), Error);
}

TEST_CASE("comm_groups makes one pair per link between devices and one group per device's replicas") {
  // 3 stages on 2 devices (stages 0 and 2 on device 0: interleaved), training links both ways.
  const std::vector<int> stage_device = {0, 1, 0};
  const std::vector<Link> links = {{1, 2, false}, {0, 1, false}, {2, 1, true}, {1, 0, true}};
  const std::vector<CommGroup> groups = comm_groups(stage_device, links, 2, 2);
  // Per replica the 4 links in Link order (sender first), then per device its 2 replicas.
  REQUIRE(groups.size() == 10);
  CHECK(groups[0] == CommGroup{{0, 1}, false, {0, 1, false}, 0});
  CHECK(groups[1] == CommGroup{{1, 0}, false, {1, 0, true}, 0});
  CHECK(groups[2] == CommGroup{{1, 0}, false, {1, 2, false}, 0});
  CHECK(groups[3] == CommGroup{{0, 1}, false, {2, 1, true}, 0});
  CHECK(groups[4] == CommGroup{{2, 3}, false, {0, 1, false}, 1});
  CHECK(groups[7] == CommGroup{{2, 3}, false, {2, 1, true}, 1});
  CHECK(groups[8] == CommGroup{{0, 2}, true, {}, 0});
  CHECK(groups[9] == CommGroup{{1, 3}, true, {}, 1});
  CHECK(link_group(groups, stage_device, {1, 0, true}, 1) == 5);
  CHECK(replica_group(groups, 1) == 9);
  // One replica: no replicas' groups.
  CHECK(comm_groups(stage_device, links, 2, 1).size() == 4);
  CHECK(replica_group(comm_groups(stage_device, links, 2, 1), 0) == -1);
}

TEST_CASE("a link within one device has no communicator and an unknown link is refused") {
  const std::vector<int> stage_device = {0, 0, 1};
  const std::vector<Link> links = {{0, 1, false}, {1, 2, false}};
  const std::vector<CommGroup> groups = comm_groups(stage_device, links, 2, 1);
  REQUIRE(groups.size() == 1);
  CHECK(link_group(groups, stage_device, {0, 1, false}, 0) == -1);
  CHECK(link_group(groups, stage_device, {1, 2, false}, 0) == 0);
  CHECK_THROWS_WITH_AS(link_group(groups, stage_device, {2, 1, true}, 0),
                       doctest::Contains("no link from stage 2 to stage 1 (gradients)"), Error);
  CHECK_THROWS_WITH_AS(comm_groups({0, 3}, {{0, 1, false}}, 2, 1),
                       doctest::Contains("stage 1 runs on device 3; the pipeline has 2"), Error);
}

// Runs every rank's point-to-point operations as NCCL does: per communicator, each rank's
// operations in the order it issued them, a send completing only with the receive at the head
// of its peer's queue on that communicator. True when everything completes (no deadlock).
struct P2p {
  Link link;
  bool send = false;
};
bool completes(const std::vector<std::vector<P2p>>& ranks,
               const std::function<int(const Link&)>& comm_of) {
  std::map<std::pair<int, int>, std::deque<P2p>> queues;  // (comm, rank) -> issued ops
  for (size_t r = 0; r < ranks.size(); ++r)
    for (const P2p& op : ranks[r]) queues[{comm_of(op.link), static_cast<int>(r)}].push_back(op);
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& [key, queue] : queues) {
      if (queue.empty() || !queue.front().send) continue;
      const Link link = queue.front().link;
      const int to = link.to_stage;  // one stage per rank here
      auto& peer = queues[{key.first, to}];
      if (!peer.empty() && !peer.front().send && peer.front().link == link) {
        queue.pop_front();
        peer.pop_front();
        progress = true;
      }
    }
  }
  for (const auto& [key, queue] : queues)
    if (!queue.empty()) return false;
  return true;
}

TEST_CASE("one communicator per link runs 1F1B's crossing sends where one per pipeline deadlocks") {
  // 1F1B's steady state on 2 devices: device 0 sends microbatch 1's activations, then receives
  // microbatch 0's gradients; device 1 sends those gradients first, then receives.
  const Link act{0, 1, false}, grad{1, 0, true};
  const std::vector<std::vector<P2p>> ranks = {{{act, true}, {grad, false}},
                                               {{grad, true}, {act, false}}};
  const std::vector<int> stage_device = {0, 1};
  const std::vector<CommGroup> groups = comm_groups(stage_device, {act, grad}, 2, 1);
  CHECK(completes(ranks, [&](const Link& l) { return link_group(groups, stage_device, l, 0); }));
  CHECK_FALSE(completes(ranks, [](const Link&) { return 0; }));
}

TEST_CASE("owned_shards maps ZeRO-1's bounds onto rooted collectives") {
  CHECK(owned_shards({0, 3, 3, 10}, 10, 3, 1) ==
        std::vector<OwnedShard>{{0, 3, 0}, {3, 7, 2}});  // replica 1's shard is empty
  CHECK(owned_shards({0, 5, 10}, 10, 2, 0) == std::vector<OwnedShard>{{0, 5, 0}, {5, 5, 1}});
  CHECK_THROWS_WITH_AS(owned_shards({0, 6, 5}, 5, 2, 4),
                       doctest::Contains("stage 4: shard boundaries [0, 6, 5] do not split a "
                                         "bucket of 5 elements over 2 replicas"),
                       Error);
  CHECK_THROWS_AS(owned_shards({0, 5}, 5, 2, 0), Error);
}

TEST_CASE("message_pieces gives each tensor's bytes in order") {
  Message m{3, {{"a", Tensor::owned(DType::kFloat32, {2, 3})},
                {"b", Tensor::owned(DType::kInt64, {0})},
                {"c", Tensor::owned(DType::kBFloat16, {5})}}};
  CHECK(message_pieces(m) == std::vector<int64_t>{24, 0, 10});
}

TEST_CASE("a rank's trace moves onto rank 0's clock by one shift, its events kept in order") {
  // Rank 1 starts steps at 0 and 10 on its clock; rank 0 at 8 (it left the first step's
  // barrier 3 late) and 15. Rank 1's last event of step 1 ends at 9.5, its next starts at 10.
  // A shift per step (8, then 5) put the first after the second (17.5 against 15).
  std::vector<schedule::TimelineEvent> events{{1, schedule::Op::kForward, 1, 0, 9.0, 9.5},
                                              {1, schedule::Op::kForward, 1, 1, 10.0, 10.5}};
  std::vector<MemorySample> memory{{1, 9.5, 100}, {1, 10.0, 200}};
  mpi::rebase_events(events, memory, {0.0, 10.0}, {8.0, 15.0});
  CHECK(events[0].end_s <= events[1].start_s);
  CHECK(memory[0].time_s < memory[1].time_s);
  // One shift for both: the median of the steps' (the upper of two), 8.
  CHECK(events[0].start_s == doctest::Approx(17.0));
  CHECK(events[1].start_s == doctest::Approx(18.0));
  CHECK(memory[1].time_s == doctest::Approx(18.0));
  // Three steps: the median difference, 5, whichever step it comes from.
  std::vector<schedule::TimelineEvent> three{{1, schedule::Op::kForward, 1, 0, 21.0, 22.0}};
  std::vector<MemorySample> none;
  mpi::rebase_events(three, none, {0.0, 10.0, 20.0}, {8.0, 15.0, 24.0});
  CHECK(three[0].start_s == doctest::Approx(26.0));
  // No steps: nothing moves.
  mpi::rebase_events(three, none, {}, {});
  CHECK(three[0].start_s == doctest::Approx(26.0));
}

}  // namespace
}  // namespace stagecraft::rt
