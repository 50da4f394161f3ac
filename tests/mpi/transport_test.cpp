// The MPI transport between two ranks (run by `mpirun -np 2`, tests/mpi/CMakeLists.txt): a
// link's messages arrive in order with their names, dtypes, shapes and bytes; sends do not wait
// for the receiver; a wrong microbatch at a link's head is a plan fault; shared-weight sums give
// every holder the bytes of the in-process transport (the parts added in ascending stage
// order), also with two holders on one rank; the GPU ranks' host-staged fallback moves and sums
// host copies (CPU devices standing in); the NCCL transport's logic runs over an MPI stand-in
// for NCCL's groups (bytes per link, headers over MPI, capacity, replicas' sums and shards, a
// wait for bytes that never come ending in time, naming the rank and aborting the group); an
// aborted transport refuses further work. Every rank runs every case; the exit status is the
// worst of the ranks'.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "runtime/core/backend.h"
#include "runtime/exec/transport.h"
#include "runtime/format/error.h"
#include "runtime/mpi/gpu_transport.h"
#include "runtime/mpi/mpi_transport.h"
#include "runtime/mpi/wire.h"

namespace stagecraft::rt::mpi {
namespace {

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// A float tensor whose values depend on `seed`.
Tensor floats(Shape shape, float seed) {
  Tensor t = Tensor::owned(DType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = seed + 0.25f * static_cast<float>(i);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())) == 0;
}

// Two stages, stage s on rank s, with activations 0 -> 1 and gradients 1 -> 0.
Layout two_stages() {
  return {{0, 1}, {{0, 1, false}, {1, 0, true}}, {}};
}

TEST_CASE("wire: a message header gives back names, dtypes and shapes") {
  Tensor ids = Tensor::owned(DType::kInt64, {2, 3});
  Message m{5, {{"x", floats({4, 1, 2}, 1)}, {"ids", ids}, {"scalar", floats({}, 2)}}};
  Message back = message_from_header(message_header(m), "test");
  CHECK(back.microbatch == 5);
  REQUIRE(back.tensors.size() == 3);
  CHECK(back.tensors[0].name == "x");
  CHECK(back.tensors[0].tensor.shape == Shape{4, 1, 2});
  CHECK(back.tensors[1].tensor.dtype == DType::kInt64);
  CHECK(back.tensors[2].tensor.shape.empty());
  std::vector<char> cut = message_header(m);
  cut.resize(cut.size() - 3);
  CHECK_THROWS_WITH_AS(message_from_header(cut, "link 0 -> 1"),
                       doctest::Contains("link 0 -> 1"), Error);
}

TEST_CASE("a link's messages arrive in order and whole") {
  MpiTransport t(MPI_COMM_WORLD, two_stages(), 4);
  const Link forward{0, 1, false};
  if (rank() == 0) {
    for (int mb = 0; mb < 4; ++mb) {
      Tensor ids = Tensor::owned(DType::kInt64, {3});
      for (int64_t i = 0; i < 3; ++i) ids.as<int64_t>()[i] = mb * 10 + i;
      t.send(forward, Message{mb, {{"act", floats({2, 3}, static_cast<float>(mb))},
                                   {"ids", ids},
                                   {"empty", Tensor::owned(DType::kFloat32, {0, 4})}}});
    }
  } else {
    int64_t delivered = 0;
    MpiTransport counting(MPI_COMM_WORLD, two_stages(), 4,
                          [&](const Link&, const Message& m) { delivered += m.microbatch + 1; });
    for (int mb = 0; mb < 4; ++mb) {
      Message m = counting.recv(forward, mb);
      CHECK(m.microbatch == mb);
      REQUIRE(m.tensors.size() == 3);
      CHECK(m.tensors[0].name == "act");
      CHECK(same_bytes(m.tensors[0].tensor, floats({2, 3}, static_cast<float>(mb))));
      CHECK(m.tensors[1].tensor.as<int64_t>()[2] == mb * 10 + 2);
      CHECK(m.tensors[2].tensor.shape == Shape{0, 4});
    }
    CHECK(delivered == 1 + 2 + 3 + 4);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("sends do not wait for the receiver") {
  // Both ranks send two 4 MiB messages (past MPI's eager sizes) before receiving any: blocking
  // sends would wait for each other for ever.
  Layout both_ways{{0, 1}, {{0, 1, false}, {1, 0, true}}, {}};
  MpiTransport t(MPI_COMM_WORLD, both_ways, 2);
  const Link out = rank() == 0 ? Link{0, 1, false} : Link{1, 0, true};
  const Link in = rank() == 0 ? Link{1, 0, true} : Link{0, 1, false};
  for (int mb = 0; mb < 2; ++mb)
    t.send(out, Message{mb, {{"big", floats({1 << 20}, static_cast<float>(rank() + mb))}}});
  for (int mb = 0; mb < 2; ++mb) {
    Message m = t.recv(in, mb);
    CHECK(same_bytes(m.tensors.at(0).tensor, floats({1 << 20}, static_cast<float>(1 - rank() + mb))));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a different microbatch at a link's head is a plan fault") {
  MpiTransport t(MPI_COMM_WORLD, two_stages(), 1);
  const Link forward{0, 1, false};
  if (rank() == 0)
    t.send(forward, Message{1, {}});
  else
    CHECK_THROWS_WITH_AS(t.recv(forward, 0),
                         "stage 1 expected microbatch 0 from stage 0 but microbatch 1 arrived first",
                         Error);
  MPI_Barrier(MPI_COMM_WORLD);
}

// The in-process transport's sum of `parts` (one per holder stage, ascending), on one thread
// per holder: the bytes every holder must get.
Tensor in_process_sum(const std::vector<Tensor>& parts, DeviceContext& device) {
  const int holders = static_cast<int>(parts.size());
  std::vector<int> stages;
  for (int s = 0; s < holders; ++s) stages.push_back(s);
  InProcessTransport t({}, 1);
  std::vector<Tensor> out(parts.size());
  std::vector<std::thread> threads;
  for (int s = 0; s < holders; ++s)
    threads.emplace_back([&, s] {
      auto own = backend_by_name("cpu").make_device(0, 1);
      out[s] = clone_on(*own, parts[s]);
      t.start_shared_sum("w", stages, s, parts[s], *own);
      t.finish_shared_sum("w", s, out[s], *own);
    });
  for (std::thread& th : threads) th.join();
  return out[0];
}

TEST_CASE("shared sums: the same bytes on every holder, in ascending stage order") {
  auto device = backend_by_name("cpu").make_device(0, 1);
  // Values whose float sum depends on the order: (1 + 1e8) - 1e8 is 0, (-1e8 + 1e8) + 1 is 1.
  auto part = [](int stage) {
    Tensor t = Tensor::owned(DType::kFloat32, {3});
    const float values[] = {1.0f, 1e8f, -1e8f};
    for (int i = 0; i < 3; ++i) t.as<float>()[i] = values[(stage + i) % 3];
    return t;
  };
  // Three holders: stages 0 and 2 on rank 0, stage 1 on rank 1.
  Layout layout{{0, 1, 0}, {}, {"w"}};
  MpiTransport t(MPI_COMM_WORLD, layout, 1);
  const std::vector<int> holders{0, 1, 2};
  std::vector<int> mine = rank() == 0 ? std::vector<int>{0, 2} : std::vector<int>{1};
  std::map<int, Tensor> grads;
  for (int s : mine) {
    grads[s] = part(s);
    t.start_shared_sum("w", holders, s, grads[s], *device);
    grads[s].as<float>()[0] = 7;  // the transport kept its own copy
  }
  for (int s : mine) t.finish_shared_sum("w", s, grads[s], *device);
  Tensor expected = in_process_sum({part(0), part(1), part(2)}, *device);
  CHECK(expected.as<float>()[0] == 0.0f);  // ascending: (1 + 1e8) - 1e8
  for (int s : mine) CHECK(same_bytes(grads[s], expected));
  // And again (the next step reuses the tags).
  for (int s : mine) t.start_shared_sum("w", holders, s, part(s), *device);
  for (int s : mine) t.finish_shared_sum("w", s, grads[s], *device);
  for (int s : mine) CHECK(same_bytes(grads[s], expected));
  MPI_Barrier(MPI_COMM_WORLD);
}

// GPU ranks' fallback (gpu_transport.h) with CPU devices standing in for the GPUs: what is sent
// and summed goes through host copies, and the results land in the caller's tensors.
TEST_CASE("host-staged: messages arrive whole and headers alone carry no bytes") {
  HostStagedTransport t(std::make_unique<MpiTransport>(MPI_COMM_WORLD, two_stages(), 4),
                        backend_by_name("cpu").make_device(0, 1));
  const Link forward{0, 1, false}, back{1, 0, true};
  if (rank() == 0) {
    Tensor act = floats({2, 3}, 1);
    t.send(forward, Message{0, {{"act", act}}});
    act.as<float>()[0] = 99;  // the transport sent its own copy
    t.mpi().send_header(forward, Message{1, {{"big", floats({1000}, 0)}}});
    Message g = t.recv(back, 0);
    REQUIRE(g.tensors.size() == 1);
    CHECK(same_bytes(g.tensors[0].tensor, floats({4}, 5)));
  } else {
    Message m = t.recv(forward, 0);
    REQUIRE(m.tensors.size() == 1);
    CHECK(same_bytes(m.tensors[0].tensor, floats({2, 3}, 1)));
    Message h = t.mpi().recv_header(forward, 1);
    REQUIRE(h.tensors.size() == 1);
    CHECK(h.tensors[0].name == "big");
    CHECK(h.tensors[0].tensor.shape == Shape{1000});
    t.send(back, Message{0, {{"grad", floats({4}, 5)}}});
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("host-staged: the replicas' sums land in the caller's bucket") {
  auto device = backend_by_name("cpu").make_device(0, 1);
  HostStagedTransport t(std::make_unique<MpiTransport>(MPI_COMM_WORLD, Layout{{0}, {}, {}}, 1,
                                                       InProcessTransport::OnDelivered{}, 30,
                                                       MPI_COMM_WORLD),
                        backend_by_name("cpu").make_device(0, 1));
  const int me = rank();
  // Exact float sums: replica r's values are (r + 1) + i / 4.
  Tensor sum = floats({6}, 3);  // (1 + i / 4) + (2 + i / 4)
  for (int64_t i = 0; i < 6; ++i) sum.as<float>()[i] += 0.25f * static_cast<float>(i);
  Tensor bucket = floats({6}, static_cast<float>(me + 1));
  t.start_replica_sum({0, 0}, ReplicaOp::kAllReduce, bucket, {}, *device);
  t.progress_replicas(0, *device);
  t.finish_replica_sum({0, 0}, *device);
  CHECK(same_bytes(bucket, sum));
  // ZeRO-1: shard r (bounds 0, 2, 6) summed into replica r's bucket, then gathered to all.
  const std::vector<int64_t> bounds{0, 2, 6};
  Tensor shards = floats({6}, static_cast<float>(me + 1));
  t.start_replica_sum({0, 1}, ReplicaOp::kReduceScatter, shards, bounds, *device);
  t.finish_replica_sum({0, 1}, *device);
  const int64_t lo = bounds[static_cast<size_t>(me)], hi = bounds[static_cast<size_t>(me) + 1];
  CHECK(std::memcmp(shards.as<float>() + lo, sum.as<float>() + lo,
                    static_cast<size_t>(hi - lo) * 4) == 0);
  t.replica_all_gather(0, shards, bounds, *device);
  CHECK(same_bytes(shards, sum));
  CHECK_THROWS_WITH_AS(t.finish_replica_sum({0, 7}, *device), doctest::Contains("never started"),
                       Error);
  MPI_Barrier(MPI_COMM_WORLD);
}

// A DeviceGroup over MPI on host memory, standing in for NCCL's (runtime/cuda/nccl_comms.cpp)
// so that the NCCL transport's own logic runs here: the same calls, tickets polled by `done`.
class MpiGroup final : public DeviceGroup {
 public:
  explicit MpiGroup(MPI_Comm comm) : comm_(comm) { MPI_Comm_rank(comm_, &me_); }
  ~MpiGroup() override {
    for (auto& [ticket, requests] : pending_)
      for (MPI_Request& r : requests) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    MPI_Comm_free(&comm_);
  }
  int64_t send(const Tensor& t, int peer) override {
    return post(1, [&](MPI_Request* r) {
      MPI_Isend(t.data, static_cast<int>(t.bytes()), MPI_BYTE, peer, 0, comm_, r);
    });
  }
  int64_t recv(Tensor& t, int peer) override {
    return post(1, [&](MPI_Request* r) {
      MPI_Irecv(t.data, static_cast<int>(t.bytes()), MPI_BYTE, peer, 0, comm_, r);
    });
  }
  int64_t all_reduce(Tensor& b) override {
    return post(1, [&](MPI_Request* r) {
      MPI_Iallreduce(MPI_IN_PLACE, b.data, static_cast<int>(b.numel()), MPI_FLOAT, MPI_SUM,
                     comm_, r);
    });
  }
  int64_t reduce_to_owners(Tensor& b, const std::vector<OwnedShard>& shards) override {
    size_t k = 0;
    return post(shards.size(), [&](MPI_Request* r) {
      const OwnedShard& s = shards[k++];
      float* at = b.as<float>() + s.offset;
      MPI_Ireduce(s.root == me_ ? MPI_IN_PLACE : at, at, static_cast<int>(s.count), MPI_FLOAT,
                  MPI_SUM, s.root, comm_, r);
    });
  }
  int64_t broadcast_from_owners(Tensor& b, const std::vector<OwnedShard>& shards) override {
    size_t k = 0;
    return post(shards.size(), [&](MPI_Request* r) {
      const OwnedShard& s = shards[k++];
      MPI_Ibcast(b.as<float>() + s.offset, static_cast<int>(s.count), MPI_FLOAT, s.root, comm_, r);
    });
  }
  bool done(int64_t ticket) override {
    if (aborted) fail(ErrorKind::kInternal, "the group was aborted");
    auto it = pending_.find(ticket);
    if (it == pending_.end()) return true;
    int flag = 0;
    MPI_Testall(static_cast<int>(it->second.size()), it->second.data(), &flag,
                MPI_STATUSES_IGNORE);
    if (flag) pending_.erase(it);
    return flag != 0;
  }
  void connect(bool) override {}
  void abort() override { aborted = true; }
  bool aborted = false;

 private:
  template <typename Post>
  int64_t post(size_t count, Post call) {
    std::vector<MPI_Request>& requests = pending_[next_];
    requests.resize(count);
    for (MPI_Request& r : requests) call(&r);
    return next_++;
  }
  MPI_Comm comm_;
  int me_ = 0;
  std::map<int64_t, std::vector<MPI_Request>> pending_;
  int64_t next_ = 0;
};

// The session of 2 ranks over `groups`, this rank joined (through MpiGroup) to each of its own.
std::shared_ptr<NcclSession> fake_session(std::vector<CommGroup> groups,
                                          std::vector<int> stage_device) {
  auto s = std::make_shared<NcclSession>();
  s->groups = std::move(groups);
  s->stage_device = std::move(stage_device);
  s->rank = rank();
  s->rank_names = {"rank 0 (device 0)", "rank 1 (device 1)"};
  for (size_t k = 0; k < s->groups.size(); ++k) {
    const std::vector<int>& ranks = s->groups[k].ranks;
    const auto at = std::find(ranks.begin(), ranks.end(), s->rank);
    MPI_Comm comm = MPI_COMM_NULL;  // ranked as the group ranks them
    MPI_Comm_split(MPI_COMM_WORLD, at == ranks.end() ? MPI_UNDEFINED : 0,
                   static_cast<int>(at - ranks.begin()), &comm);
    if (at != ranks.end()) s->joined[static_cast<int>(k)] = std::make_unique<MpiGroup>(comm);
  }
  return s;
}

NcclTransport nccl_transport(std::shared_ptr<NcclSession> session, Layout layout,
                             double timeout_s, InProcessTransport::OnDelivered delivered = {}) {
  return NcclTransport(std::move(session),
                       std::make_unique<HostStagedTransport>(
                           std::make_unique<MpiTransport>(MPI_COMM_WORLD, std::move(layout), 2),
                           backend_by_name("cpu").make_device(0, 1)),
                       backend_by_name("cpu").make_device(0, 1), 0, 2, std::move(delivered),
                       timeout_s);
}

TEST_CASE("nccl transport: a link's bytes through its group, headers over MPI, in order") {
  const Link act{0, 1, false}, grad{1, 0, true};
  auto session = fake_session(comm_groups({0, 1}, {act, grad}, 2, 1), {0, 1});
  int64_t delivered = 0;
  NcclTransport t = nccl_transport(session, two_stages(), 10, [&](const Link&, const Message& m) {
    delivered += m.microbatch + 1;
  });
  if (rank() == 0) {
    for (int mb = 0; mb < 3; ++mb)  // capacity 2: the third waits for the first to be taken
      t.send(act, Message{mb, {{"x", floats({2, 3}, static_cast<float>(mb))},
                               {"none", Tensor::owned(DType::kFloat32, {0})}}});
    Message g = t.recv(grad, 0);
    REQUIRE(g.tensors.size() == 1);
    CHECK(same_bytes(g.tensors[0].tensor, floats({5}, 9)));
    CHECK(delivered == 1);
  } else {
    for (int mb = 0; mb < 3; ++mb) {
      Message m = t.recv(act, mb);
      REQUIRE(m.tensors.size() == 2);
      CHECK(m.tensors[0].name == "x");
      CHECK(same_bytes(m.tensors[0].tensor, floats({2, 3}, static_cast<float>(mb))));
      CHECK(m.tensors[1].tensor.shape == Shape{0});
    }
    CHECK(delivered == 6);
    t.send(grad, Message{0, {{"g", floats({5}, 9)}}});
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("nccl transport: replicas' sums and ZeRO-1's shards through the replicas' group") {
  auto session = fake_session(comm_groups({0}, {}, 1, 2), {0});
  NcclTransport t = nccl_transport(session, Layout{{0}, {}, {}}, 10);
  auto device = backend_by_name("cpu").make_device(0, 1);
  const int me = rank();
  Tensor sum = floats({6}, 3);
  for (int64_t i = 0; i < 6; ++i) sum.as<float>()[i] += 0.25f * static_cast<float>(i);
  Tensor bucket = floats({6}, static_cast<float>(me + 1));
  t.start_replica_sum({0, 0}, ReplicaOp::kAllReduce, bucket, {}, *device);
  t.progress_replicas(0, *device);
  t.finish_replica_sum({0, 0}, *device);
  CHECK(same_bytes(bucket, sum));
  const std::vector<int64_t> bounds{0, 0, 6};  // replica 0's shard is empty
  Tensor shards = floats({6}, static_cast<float>(me + 1));
  t.start_replica_sum({0, 1}, ReplicaOp::kReduceScatter, shards, bounds, *device);
  CHECK_THROWS_WITH_AS(
      t.start_replica_sum({0, 1}, ReplicaOp::kAllReduce, shards, {}, *device),
      doctest::Contains("summed twice"), Error);
  t.finish_replica_sum({0, 1}, *device);
  if (me == 1) CHECK(same_bytes(shards, sum));
  t.replica_all_gather(0, shards, bounds, *device);
  CHECK(same_bytes(shards, sum));
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("nccl transport: bytes that never come end the wait in time, naming the rank") {
  const Link act{0, 1, false}, grad{1, 0, true};
  auto session = fake_session(comm_groups({0, 1}, {act, grad}, 2, 1), {0, 1});
  NcclTransport t = nccl_transport(session, two_stages(), 0.5);
  if (rank() == 1) {
    // The header alone: the bytes never follow.
    MpiTransport headers(MPI_COMM_WORLD, two_stages(), 1);
    headers.send_header(grad, Message{0, {{"g", floats({5}, 9)}}});
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    CHECK_THROWS_WITH_AS(t.recv(grad, 0),
                         doctest::Contains("'s bytes from rank 1 (device 1) through NCCL"), Error);
    auto* group = dynamic_cast<MpiGroup*>(&session->group(
        link_group(session->groups, session->stage_device, grad, 0)));
    REQUIRE(group != nullptr);
    CHECK(group->aborted);  // no kernel is left waiting
    MPI_Barrier(MPI_COMM_WORLD);
  }
  t.abort();  // the run failed: no waits at the end
}

TEST_CASE("an aborted transport refuses every later call") {
  MpiTransport t(MPI_COMM_WORLD, two_stages(), 1);
  t.abort();
  CHECK_THROWS_AS(t.send({0, 1, false}, Message{0, {}}), Aborted);
  CHECK_THROWS_AS(t.recv({0, 1, false}, 0), Aborted);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace stagecraft::rt::mpi

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  doctest::Context context(argc, argv);
  int failed = context.run();
  int worst = 0;
  MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
