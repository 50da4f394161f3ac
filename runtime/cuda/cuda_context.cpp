// The CUDA device (cuda_context.h): memory from the GPU's stream-ordered pool and one arena,
// copies with cudaMemcpyAsync (peer copies between GPUs), and the update kernels.
#include "runtime/cuda/cuda_context.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <nvtx3/nvToolsExt.h>  // header-only NVTX 3 of the CUDA toolkit: no library to link

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/update_kernels.h"
#include "runtime/format/error.h"
#include "runtime/format/memory_plan.h"

namespace stagecraft::rt::cuda {
namespace {

struct Probe {
  int count = 0;
  std::string why;
};

const Probe& probe() {
  static const Probe p = [] {
    int n = 0;
    cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      cudaGetLastError();
      // cudart says "insufficient driver" also where there is no driver at all.
      void* driver = status == cudaErrorInsufficientDriver ? ::dlopen("libcuda.so.1", RTLD_LAZY)
                                                           : reinterpret_cast<void*>(1);
      if (driver == nullptr)
        return Probe{0, "no CUDA GPU is visible (no NVIDIA driver: libcuda.so.1 is not installed)"};
      return Probe{0, fmt::format("no CUDA GPU is visible (cudaGetDeviceCount: {})",
                                  cudaGetErrorString(status))};
    }
    if (n == 0) return Probe{0, "no CUDA GPU is visible (cudaGetDeviceCount found none)"};
    return Probe{n, ""};
  }();
  return p;
}

constexpr int kMaxGpus = 64;

// Makes `gpu` current on the calling thread when it is not.
void use_gpu(int gpu) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != gpu)
    check(cudaSetDevice(gpu), fmt::format("cudaSetDevice({})", gpu));
}

class ArenaBuffer final : public Buffer {
 public:
  ArenaBuffer(void* base, int64_t bytes) : base_(static_cast<std::byte*>(base)), bytes_(bytes) {}
  ~ArenaBuffer() override { cudaFree(base_); }
  std::byte* base() const override { return base_; }
  int64_t size() const override { return bytes_; }

 private:
  std::byte* base_;
  int64_t bytes_;
};

void expect_float32(const Tensor& t, const char* role, const char* what) {
  if (t.dtype != DType::kFloat32)
    fail(ErrorKind::kInternal, "{}: {} is {} (float32 only)", what, role, t.describe());
}

void expect_same_size(const Tensor& a, const Tensor& b, const char* what) {
  if (a.numel() != b.numel() || a.dtype != b.dtype)
    fail(ErrorKind::kInternal, "{}: {} and {} differ", what, a.describe(), b.describe());
}

}  // namespace

int gpu_count() { return probe().count; }

const std::string& unavailable_reason() { return probe().why; }

namespace {
std::atomic<int> pinned_gpu{-1};  // pin_gpu's; -1: none
}  // namespace

void pin_gpu(int gpu) {
  if (gpu < 0 || gpu >= gpu_count())
    fail(ErrorKind::kInternal, "GPU {} pinned; this process sees {}", gpu, gpu_count());
  pinned_gpu = gpu;
}

int gpu_of(int device) {
  if (const int pinned = pinned_gpu.load(); pinned >= 0) return pinned;
  int n = gpu_count();
  return n > 0 ? device % n : 0;
}

cudaStream_t gpu_stream(int gpu) {
  static std::mutex mutex;
  static std::array<cudaStream_t, kMaxGpus> streams{};
  if (gpu < 0 || gpu >= kMaxGpus) fail(ErrorKind::kInternal, "GPU {} is out of range", gpu);
  std::lock_guard lock(mutex);
  if (streams[gpu] == nullptr) {
    use_gpu(gpu);
    check(cudaStreamCreateWithFlags(&streams[gpu], cudaStreamNonBlocking), "cudaStreamCreate");
    // The GPU's pool keeps what tensors free for the next step instead of giving it back.
    cudaMemPool_t pool = nullptr;
    check(cudaDeviceGetDefaultMemPool(&pool, gpu), "cudaDeviceGetDefaultMemPool");
    uint64_t keep_all = std::numeric_limits<uint64_t>::max();
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all),
          "cudaMemPoolSetAttribute(release threshold)");
  }
  return streams[gpu];
}

CudaContext::CudaContext(int device) {
  if (gpu_count() == 0) fail(ErrorKind::kUnsupported, "{}", unavailable_reason());
  gpu_ = gpu_of(device);
  use_gpu(gpu_);
  stream_ = gpu_stream(gpu_);
}

void CudaContext::bind_thread() { use_gpu(gpu_); }

CudaContext::~CudaContext() {
  cudaSetDevice(gpu_);
  cudaStreamSynchronize(stream_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (cublas_lt_ != nullptr) cublasLtDestroy(cublas_lt_);
  if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
  if (workspace_ != nullptr) cudaFreeAsync(workspace_, stream_);
}

cublasHandle_t CudaContext::cublas() {
  if (cublas_ == nullptr) {
    check(cublasCreate(&cublas_), "cublasCreate");
    check(cublasSetStream(cublas_, stream_), "cublasSetStream");
    // Float32 stays float32 (no TF32): results are held to the CPU backend's at rtol 1e-4.
    check(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  return cublas_;
}

cublasLtHandle_t CudaContext::cublas_lt() {
  if (cublas_lt_ == nullptr) check(cublasLtCreate(&cublas_lt_), "cublasLtCreate");
  return cublas_lt_;
}

cudnnHandle_t CudaContext::cudnn() {
  if (cudnn_ == nullptr) {
    check(cudnnCreate(&cudnn_), "cudnnCreate");
    check(cudnnSetStream(cudnn_, stream_), "cudnnSetStream");
  }
  return cudnn_;
}

void* CudaContext::workspace(int64_t bytes) {
  if (bytes <= workspace_bytes_) return workspace_;
  if (workspace_ != nullptr) check(cudaFreeAsync(workspace_, stream_), "cudaFreeAsync");
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  check(cudaMallocAsync(&workspace_, static_cast<size_t>(bytes), stream_),
        fmt::format("cudaMallocAsync({} bytes of workspace on GPU {})", bytes, gpu_));
  workspace_bytes_ = bytes;
  return workspace_;
}

int64_t CudaContext::pool_peak_bytes() const {
  cudaMemPool_t pool = nullptr;
  uint64_t high = 0;
  if (cudaDeviceGetDefaultMemPool(&pool, gpu_) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) != cudaSuccess)
    return -1;
  return static_cast<int64_t>(high) + arena_bytes_;
}

DeviceContext::MemoryUse CudaContext::memory_use() const {
  MemoryUse use;
  use.peak_bytes = pool_peak_bytes();
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess)
    use.used_bytes = static_cast<int64_t>(total - free);
  else
    cudaGetLastError();
  return use;
}

void CudaContext::synchronize() {
  const auto start = std::chrono::steady_clock::now();
  const cudaError_t status = cudaStreamSynchronize(stream_);
  wait_ns_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  ++waits_;
  check(status, "cudaStreamSynchronize");
}

DeviceContext::HostWaits CudaContext::host_waits() const {
  return {waits_.load(), static_cast<double>(wait_ns_.load()) * 1e-9};
}

Tensor CudaContext::adopt(const Tensor& t) {
  if (t.data == nullptr || t.bytes() == 0) return t;
  cudaPointerAttributes attr{};
  check(cudaPointerGetAttributes(&attr, t.data), "cudaPointerGetAttributes");
  if (attr.type == cudaMemoryTypeDevice && attr.device == gpu_) return t;
  Tensor mine = new_tensor(t.dtype, t.shape, false);
  if (attr.type == cudaMemoryTypeDevice) {
    // Another GPU's: a peer copy (through the host where the GPUs have no P2P link).
    check(cudaMemcpyPeerAsync(mine.data, gpu_, t.data, attr.device, static_cast<size_t>(t.bytes()),
                              stream_),
          "cudaMemcpyPeerAsync");
    synchronize();  // the sender may free its copy as soon as this returns
  } else {
    write(mine, t.data, t.bytes());  // host memory
  }
  return mine;
}

double CudaContext::time_ms(const std::function<void()>& body) {
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  float ms = 0;
  try {
    check(cudaEventRecord(start, stream_), "cudaEventRecord");
    body();
    check(cudaEventRecord(stop, stream_), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

// Without a profiler attached NVTX's calls return at once (it looks for one on the first).
void CudaContext::range_push(const char* name) { nvtxRangePushA(name); }

void CudaContext::range_pop() { nvtxRangePop(); }

std::unique_ptr<Buffer> CudaContext::allocate(int64_t bytes) {
  void* p = nullptr;
  int64_t size = std::max<int64_t>(bytes, plan::kArenaAlignment);
  check(cudaMalloc(&p, static_cast<size_t>(size)),
        fmt::format("cudaMalloc({} bytes of arena on GPU {})", size, gpu_));
  arena_bytes_ = size;
  return std::make_unique<ArenaBuffer>(p, size);
}

Tensor CudaContext::new_tensor(DType dtype, Shape shape, bool zeroed) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  int64_t bytes = std::max<int64_t>(t.bytes(), 1);
  void* p = nullptr;
  // The message is formatted only on failure: this runs for every tensor a step makes.
  if (const cudaError_t status = cudaMallocAsync(&p, static_cast<size_t>(bytes), stream_);
      status != cudaSuccess)
    check(status,
          fmt::format("cudaMallocAsync({} bytes for {} on GPU {})", bytes, t.describe(), gpu_));
  const int gpu = gpu_;
  cudaStream_t stream = stream_;
  // Freed in the GPU's one stream order, after everything queued so far has read it.
  t.storage = std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p), [gpu, stream](std::byte* q) {
    int current = -1;
    cudaGetDevice(&current);
    if (current != gpu) cudaSetDevice(gpu);
    cudaFreeAsync(q, stream);
    if (current != gpu && current >= 0) cudaSetDevice(current);
  });
  t.data = t.storage.get();
  if (zeroed) check(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream_), "cudaMemsetAsync");
  return t;
}

void CudaContext::write(Tensor& dst, const void* host, int64_t bytes) {
  write_pending(dst, host, bytes);
  if (bytes > 0) synchronize();  // the host bytes may go as soon as this returns
}

void CudaContext::write_pending(Tensor& dst, const void* host, int64_t bytes) {
  if (bytes != dst.bytes())
    fail(ErrorKind::kInternal, "writing {} bytes into {}", bytes, dst.describe());
  if (bytes == 0) return;
  // No wait for the queue: the caller keeps the bytes until the next synchronize. From pinned
  // memory the copy engine reads them in stream order; from pageable memory the driver stages
  // them first (and may wait for the stream to do so).
  check(
      cudaMemcpyAsync(dst.data, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync (host to device)");
}

bool CudaContext::pin_host(const void* host, int64_t bytes) {
  if (host == nullptr || bytes <= 0) return false;
  // Portable: every GPU's context may copy from it (the devices of one process share inputs).
  if (cudaHostRegister(const_cast<void*>(host), static_cast<size_t>(bytes),
                       cudaHostRegisterPortable) == cudaSuccess)
    return true;
  (void)cudaGetLastError();  // already registered (overlapping another pin), or refused: unpinned
  return false;
}

void CudaContext::unpin_host(const void* host) {
  if (cudaHostUnregister(const_cast<void*>(host)) != cudaSuccess) (void)cudaGetLastError();
}

void CudaContext::read(const Tensor& src, void* host, int64_t bytes) {
  if (bytes != src.bytes())
    fail(ErrorKind::kInternal, "reading {} bytes from {}", bytes, src.describe());
  if (bytes == 0) return;
  check(
      cudaMemcpyAsync(host, src.data, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync (device to host)");
  synchronize();
}

void CudaContext::copy(const Tensor& src, Tensor& dst) {
  if (src.bytes() != dst.bytes())
    fail(ErrorKind::kInternal, "copying {} into {}", src.describe(), dst.describe());
  if (src.bytes() == 0 || src.data == dst.data) return;
  check(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(src.bytes()), cudaMemcpyDefault,
                        stream_),
        "cudaMemcpyAsync");
}

void CudaContext::fill_zero(Tensor& t) {
  if (t.bytes() == 0) return;
  check(cudaMemsetAsync(t.data, 0, static_cast<size_t>(t.bytes()), stream_), "cudaMemsetAsync");
}

void CudaContext::accumulate(Tensor& sum, const Tensor& add) {
  if (sum.dtype == add.dtype && is_16bit_float(sum.dtype)) {
    expect_same_size(sum, add, "accumulate");
    Tensor here = adopt(add);
    launch_accumulate_16bit(sum.data, here.data, sum.numel(), sum.dtype == DType::kFloat16,
                            stream_);
    check(cudaGetLastError(), "accumulate kernel launch");
    return;
  }
  expect_float32(sum, "the sum", "accumulate");
  expect_same_size(sum, add, "accumulate");
  Tensor here = adopt(add);
  launch_accumulate(sum.as<float>(), here.as<float>(), sum.numel(), stream_);
  check(cudaGetLastError(), "accumulate kernel launch");
}

bool CudaContext::unscale(Tensor& g, float factor) {
  Tensor* one = &g;
  return unscale_many(&one, 1, factor);
}

bool CudaContext::unscale_many(Tensor* const* grads, size_t count, float factor) {
  // One flag for every tensor's kernel (each sets it to 1 on a non-finite element), read once.
  Tensor flag = new_tensor(DType::kInt32, {1}, true);
  for (size_t k = 0; k < count; ++k) {
    Tensor& g = *grads[k];
    expect_float32(g, "the gradient", "unscale");
    launch_unscale(g.as<float>(), g.numel(), factor, flag.as<int>(), stream_);
    check(cudaGetLastError(), "unscale kernel launch");
  }
  int nonfinite = 0;
  read(flag, &nonfinite, sizeof nonfinite);
  return nonfinite == 0;
}

void CudaContext::sgd(Tensor& w, const Tensor& g, const SgdUpdate& u) {
  expect_float32(w, "the weight", "sgd");
  expect_same_size(w, g, "sgd");
  launch_sgd(w.as<float>(), g.as<float>(), w.numel(), u, stream_);
  check(cudaGetLastError(), "sgd kernel launch");
}

void CudaContext::momentum(Tensor& w, const Tensor& g, Tensor& v, const MomentumUpdate& u) {
  expect_float32(w, "the weight", "momentum");
  expect_same_size(w, g, "momentum");
  expect_same_size(w, v, "momentum");
  launch_momentum(w.as<float>(), g.as<float>(), v.as<float>(), w.numel(), u, stream_);
  check(cudaGetLastError(), "momentum kernel launch");
}

namespace {

// Adam's operands: a float32 weight, and a gradient and two moments of its size and type.
void expect_adam_operands(const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v) {
  expect_float32(w, "the weight", "adam");
  expect_same_size(w, g, "adam");
  expect_same_size(w, m, "adam");
  expect_same_size(w, v, "adam");
}

}  // namespace

void CudaContext::adam(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamUpdate& u) {
  expect_adam_operands(w, g, m, v);
  launch_adam(w.as<float>(), g.as<float>(), m.as<float>(), v.as<float>(), w.numel(), u, stream_);
  check(cudaGetLastError(), "adam kernel launch");
}

void CudaContext::adam_many(const AdamTensors* items, size_t count, const AdamUpdate& u,
                            bool zero_grads) {
  std::vector<AdamArrays> arrays;
  arrays.reserve(count);
  for (const AdamTensors& t : std::span(items, count)) {
    expect_adam_operands(*t.w, *t.g, *t.m, *t.v);
    arrays.push_back(
        {t.w->as<float>(), t.g->as<float>(), t.m->as<float>(), t.v->as<float>(), t.w->numel()});
  }
  launch_adam_many(arrays.data(), arrays.size(), u, zero_grads, stream_);
  check(cudaGetLastError(), "adam kernel launch");
}

void CudaContext::adagrad(Tensor& w, const Tensor& g, Tensor& h, const AdagradUpdate& u) {
  expect_float32(w, "the weight", "adagrad");
  expect_same_size(w, g, "adagrad");
  expect_same_size(w, h, "adagrad");
  launch_adagrad(w.as<float>(), g.as<float>(), h.as<float>(), w.numel(), u, stream_);
  check(cudaGetLastError(), "adagrad kernel launch");
}

CudaContext& context(const KernelArgs& args) { return static_cast<CudaContext&>(args.device); }

std::vector<int64_t> read_ints(CudaContext& ctx, const Tensor& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  // A constant's host mirror (to_device) saves a wait for the device.
  const auto read = [&](void* host) {
    if (t.host_mirror != nullptr)
      std::memcpy(host, t.host_mirror.get(), static_cast<size_t>(t.bytes()));
    else
      ctx.read(t, host, t.bytes());
  };
  if (t.dtype == DType::kInt64) {
    read(out.data());
  } else if (t.dtype == DType::kInt32) {
    std::vector<int32_t> narrow(out.size());
    read(narrow.data());
    for (size_t i = 0; i < out.size(); ++i) out[i] = narrow[i];
  } else {
    fail(ErrorKind::kModel, "expected an int64 or int32 tensor, got {}", t.describe());
  }
  return out;
}

}  // namespace stagecraft::rt::cuda
