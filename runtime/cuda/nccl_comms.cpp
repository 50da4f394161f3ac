// NCCL between the GPUs of several processes (device_comm.h): one non-blocking communicator
// and one CUDA stream per group. Every operation is queued on the group's stream behind an
// event of the GPU's compute stream, then an event of its own marks its end (the ticket);
// nothing here waits for a peer without a time limit.
#include "runtime/cuda/nccl_comms.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/format/error.h"

#ifdef STAGECRAFT_WITH_NCCL
#include <nccl.h>
#endif

namespace stagecraft::rt::cuda {
namespace {

#ifdef STAGECRAFT_WITH_NCCL

// Calls `done` until it returns true, sleeping 100 us between calls; false once `timeout_s`
// (> 0; 0: no limit) has passed first.
template <typename Done>
bool poll(Done done, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  while (!done()) {
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s > 0 && waited > timeout_s) return done();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

void use_gpu(int gpu) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != gpu)
    check(cudaSetDevice(gpu), fmt::format("cudaSetDevice({})", gpu));
}

class NcclGroup final : public DeviceGroup {
 public:
  NcclGroup(ncclComm_t comm, int gpu, int ranks, int rank, double timeout_s)
      : comm_(comm), gpu_(gpu), ranks_(ranks), rank_(rank), timeout_s_(timeout_s) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags (NCCL)");
  }
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int64_t send(const Tensor& tensor, int peer) override {
    return queue(fmt::format("ncclSend({} bytes to group rank {})", tensor.bytes(), peer), [&] {
      return ncclSend(tensor.data, static_cast<size_t>(tensor.bytes()), ncclUint8, peer, comm_,
                      stream_);
    });
  }
  int64_t recv(Tensor& tensor, int peer) override {
    return queue(fmt::format("ncclRecv({} bytes from group rank {})", tensor.bytes(), peer), [&] {
      return ncclRecv(tensor.data, static_cast<size_t>(tensor.bytes()), ncclUint8, peer, comm_,
                      stream_);
    });
  }
  int64_t all_reduce(Tensor& bucket) override {
    expect_float32(bucket, "ncclAllReduce");
    return queue(fmt::format("ncclAllReduce({} floats)", bucket.numel()), [&] {
      return ncclAllReduce(bucket.data, bucket.data, static_cast<size_t>(bucket.numel()),
                           ncclFloat32, ncclSum, comm_, stream_);
    });
  }
  int64_t reduce_to_owners(Tensor& bucket, const std::vector<OwnedShard>& shards) override {
    expect_float32(bucket, "ncclReduce");
    return queue(fmt::format("ncclReduce of {} shards", shards.size()), [&] {
      return grouped(shards, [&](const OwnedShard& s) {
        float* at = bucket.as<float>() + s.offset;
        return ncclReduce(at, at, static_cast<size_t>(s.count), ncclFloat32, ncclSum, s.root,
                          comm_, stream_);
      });
    });
  }
  int64_t broadcast_from_owners(Tensor& bucket, const std::vector<OwnedShard>& shards) override {
    expect_float32(bucket, "ncclBroadcast");
    return queue(fmt::format("ncclBroadcast of {} shards", shards.size()), [&] {
      return grouped(shards, [&](const OwnedShard& s) {
        float* at = bucket.as<float>() + s.offset;
        return ncclBroadcast(at, at, static_cast<size_t>(s.count), ncclFloat32, s.root, comm_,
                             stream_);
      });
    });
  }
  bool done(int64_t ticket) override {
    check_comm("the NCCL communicator");
    auto it = events_.find(ticket);
    if (it == events_.end()) return true;  // done before
    use_gpu(gpu_);
    const cudaError_t state = cudaEventQuery(it->second);
    if (state == cudaErrorNotReady) return false;
    check(state, "cudaEventQuery (NCCL)");
    cudaEventDestroy(it->second);
    events_.erase(it);
    return true;
  }
  void connect(bool pair) override {
    use_gpu(gpu_);
    const int64_t floats = std::max(ranks_, 1);
    void* bytes = nullptr;
    check(cudaMalloc(&bytes, static_cast<size_t>(floats) * 4), "cudaMalloc (NCCL connect)");
    Tensor t = Tensor::view(DType::kFloat32, {floats}, static_cast<std::byte*>(bytes));
    try {
      std::vector<int64_t> tickets;
      if (pair) {
        Tensor one = Tensor::view(DType::kUInt8, {1}, t.data);
        tickets.push_back(rank_ == 0 ? send(one, 1) : recv(one, 0));
      } else {
        std::vector<OwnedShard> shards;
        for (int r = 0; r < ranks_; ++r) shards.push_back({r, 1, r});
        tickets = {all_reduce(t), reduce_to_owners(t, shards), broadcast_from_owners(t, shards)};
      }
      for (int64_t ticket : tickets)
        if (!poll([&] { return done(ticket); }, timeout_s_)) {
          abort();
          fail(ErrorKind::kTimeout,
               "NCCL group rank {} of {}: the first exchange did not complete within {:g} s (a "
               "rank died or stopped answering; stagerun --timeout)",
               rank_, ranks_, timeout_s_);
        }
    } catch (...) {
      if (aborted_) throw;  // a kernel may still hold the bytes: leave them
      cudaFree(bytes);
      throw;
    }
    cudaFree(bytes);
  }
  void abort() override {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);  // ends the kernels in flight; its status changes nothing now
  }

 private:
  static void expect_float32(const Tensor& t, const char* what) {
    if (t.dtype != DType::kFloat32 || t.rank() != 1)
      fail(ErrorKind::kInternal, "{}: a 1-D float32 bucket, not {}", what, t.describe());
  }
  // Throws when the communicator has failed (or was aborted); true while a call is still being
  // queued (ncclInProgress).
  bool check_comm(std::string_view what) {
    if (aborted_) fail(ErrorKind::kInternal, "{}: the NCCL communicator was aborted", what);
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    check(state, fmt::format("{} (NCCL group rank {} of {})", what, rank_, ranks_));
    return state == ncclInProgress;
  }
  // Waits until the communicator has taken the last call (non-blocking: ncclInProgress while
  // it connects to its peers, which must call too).
  void settle(const std::string& what) {
    if (!poll([&] { return !check_comm(what); }, timeout_s_)) {
      abort();
      fail(ErrorKind::kTimeout,
           "{}: NCCL did not take it within {:g} s (a peer of the group did not join in: it "
           "died or stopped answering; stagerun --timeout)",
           what, timeout_s_);
    }
  }
  template <typename Call>
  ncclResult_t grouped(const std::vector<OwnedShard>& shards, Call call) {
    check(ncclGroupStart(), "ncclGroupStart");
    for (const OwnedShard& s : shards) {
      const ncclResult_t status = call(s);
      if (status != ncclSuccess && status != ncclInProgress) {
        ncclGroupEnd();
        return status;
      }
    }
    return ncclGroupEnd();
  }
  // Queues `call` on the group's stream after the compute stream's work so far; the ticket.
  template <typename Call>
  int64_t queue(const std::string& what, Call call) {
    use_gpu(gpu_);
    settle(what);  // the communicator takes one call at a time
    cudaEvent_t ready = nullptr, end = nullptr;
    check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate (NCCL)");
    const cudaError_t recorded = cudaEventRecord(ready, gpu_stream(gpu_));
    const cudaError_t waited =
        recorded == cudaSuccess ? cudaStreamWaitEvent(stream_, ready, 0) : recorded;
    cudaEventDestroy(ready);  // released once the wait is queued
    check(waited, "cudaStreamWaitEvent (NCCL after the compute stream)");
    check(call(), what);
    settle(what);
    check(cudaEventCreateWithFlags(&end, cudaEventDisableTiming), "cudaEventCreate (NCCL)");
    const cudaError_t marked = cudaEventRecord(end, stream_);
    if (marked != cudaSuccess) cudaEventDestroy(end);
    check(marked, "cudaEventRecord (NCCL)");
    events_[next_] = end;
    return next_++;
  }

  ncclComm_t comm_;
  int gpu_, ranks_, rank_;
  double timeout_s_;
  cudaStream_t stream_ = nullptr;
  std::map<int64_t, cudaEvent_t> events_;  ///< Tickets not yet seen done.
  int64_t next_ = 0;
  bool aborted_ = false;
};

NcclGroup::~NcclGroup() {
  cudaSetDevice(gpu_);
  // A run that ended well has seen every ticket done: the communicator is finalised (bounded
  // wait); anything else is aborted, so that no kernel waits for a peer that is gone.
  bool clean = !aborted_ && events_.empty();
  if (clean && ncclCommFinalize(comm_) != ncclSuccess) {
    ncclResult_t state = ncclInProgress;
    clean = poll(
        [&] {
          return ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress;
        },
        10.0);
    clean = clean && state == ncclSuccess;
  }
  if (clean)
    ncclCommDestroy(comm_);
  else if (!aborted_)
    ncclCommAbort(comm_);
  for (auto& [ticket, event] : events_) cudaEventDestroy(event);
  if (clean) cudaStreamDestroy(stream_);  // an aborted group's stream may hold a dead kernel
}

class NcclComms final : public DeviceComms {
 public:
  std::string unavailable() const override {
    if (gpu_count() == 0) return unavailable_reason();
    int version = 0;
    check(ncclGetVersion(&version), "ncclGetVersion");
    if (version < NCCL_VERSION(2, 14, 0))
      return fmt::format("NCCL {} is older than 2.14 (non-blocking communicators)", version);
    return "";
  }
  std::vector<char> new_id() const override {
    ncclUniqueId id;
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    return std::vector<char>(id.internal, id.internal + sizeof id.internal);
  }
  std::string device_identity(int device) const override {
    const int gpu = gpu_of(device);
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, gpu), fmt::format("cudaGetDeviceProperties({})", gpu));
    std::string uuid = "GPU-";
    for (char byte : prop.uuid.bytes)
      uuid += fmt::format("{:02x}", static_cast<unsigned char>(byte));
    return uuid;
  }
  std::unique_ptr<DeviceGroup> join(const std::vector<char>& id, int ranks, int rank, int device,
                                    double timeout_s) const override;
};

std::unique_ptr<DeviceGroup> NcclComms::join(const std::vector<char>& id, int ranks, int rank,
                                             int device, double timeout_s) const {
  ncclUniqueId uid;
  if (id.size() != sizeof uid.internal)
    fail(ErrorKind::kInternal, "an NCCL id of {} bytes (NCCL's are {})", id.size(),
         sizeof uid.internal);
  std::memcpy(uid.internal, id.data(), id.size());
  const int gpu = gpu_of(device);
  use_gpu(gpu);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait is this process's, with its time limit
  ncclComm_t comm = nullptr;
  const std::string what = fmt::format("ncclCommInitRankConfig(rank {} of {}, GPU {})", rank,
                                       ranks, gpu);
  check(ncclCommInitRankConfig(&comm, ranks, uid, rank, &config), what);
  ncclResult_t state = ncclInProgress;
  const bool joined = poll(
      [&] {
        check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
        return state != ncclInProgress;
      },
      timeout_s);
  if (!joined || state != ncclSuccess) ncclCommAbort(comm);
  if (!joined)
    fail(ErrorKind::kTimeout,
         "{}: the group was not complete within {:g} s (a rank died or stopped answering; "
         "stagerun --timeout)",
         what, timeout_s);
  check(state, what);
  return std::make_unique<NcclGroup>(comm, gpu, ranks, rank, timeout_s);
}

#else  // no NCCL in this build

class NcclComms final : public DeviceComms {
 public:
  std::string unavailable() const override {
    return "this build has no NCCL (nccl.h or libnccl was not found when CMake configured it)";
  }
  std::vector<char> new_id() const override { fail(ErrorKind::kInternal, "{}", unavailable()); }
  std::string device_identity(int device) const override { return fmt::format("GPU {}", device); }
  std::unique_ptr<DeviceGroup> join(const std::vector<char>&, int, int, int,
                                    double) const override {
    fail(ErrorKind::kInternal, "{}", unavailable());
  }
};

#endif

}  // namespace

const DeviceComms& nccl_comms() {
  static const NcclComms comms;
  return comms;
}

}  // namespace stagecraft::rt::cuda
