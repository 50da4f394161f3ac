// The CPU device (cpu_context.h): host memory with a pool of freed buffers, copies as memcpy,
// and the accumulate and optimizer kernels.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/eltwise_common.h"
#include "runtime/format/error.h"
#include "runtime/format/memory_plan.h"

namespace stagecraft::rt::cpu {

void delete_conv_cache(ConvCache* cache);  // conv.cpp

// Freed buffers by exact byte size (rounded up to the alignment). Steps repeat the same shapes,
// so exact sizes are hit every time after the first step.
class BufferPool {
 public:
  ~BufferPool() { release(); }
  std::byte* take(size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        std::byte* p = it->second.back();
        it->second.pop_back();
        held_ -= bytes;
        return p;
      }
    }
    auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlign, bytes));
    if (!p) {
      fail(ErrorKind::kMemory, "out of memory: the cpu device could not get {} bytes ({:.2f} GiB)",
           bytes, static_cast<double>(bytes) / (1 << 30));
    }
    return p;
  }
  void give(std::byte* p, size_t bytes) {
    std::lock_guard lock(mutex_);
    free_[bytes].push_back(p);
    held_ += bytes;
  }
  size_t held() {
    std::lock_guard lock(mutex_);
    return held_;
  }
  void release() {
    std::lock_guard lock(mutex_);
    for (auto& [bytes, list] : free_)
      for (std::byte* p : list) std::free(p);
    free_.clear();
    held_ = 0;
  }
  static constexpr size_t kAlign = 64;

 private:
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<std::byte*>> free_;
  size_t held_ = 0;
};

namespace {

// An arena in host memory.
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(int64_t bytes) : size_(bytes) {
    // Rounded up to whole cache lines, and one more: kernels may read a vector past the end.
    // A hostile plan's arena size near 2^63 would wrap the rounding: refused before it.
    if (bytes < 0 || bytes > std::numeric_limits<int64_t>::max() - 128)
      fail(ErrorKind::kIo, "cannot allocate the {}-byte arena", bytes);
    const auto rounded = static_cast<size_t>((bytes + 63) / 64 * 64 + 64);
    data_ = static_cast<std::byte*>(std::aligned_alloc(plan::kArenaAlignment, rounded));
    if (!data_) fail(ErrorKind::kIo, "cannot allocate the {}-byte arena", bytes);
  }
  ~HostBuffer() override { std::free(data_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  std::byte* base() const override { return data_; }
  int64_t size() const override { return size_; }

 private:
  std::byte* data_ = nullptr;
  int64_t size_ = 0;
};

void expect_bytes(const Tensor& t, int64_t bytes, const char* what) {
  if (t.bytes() != bytes)
    fail(ErrorKind::kInternal, "{}: the tensor is {} ({} bytes) but {} bytes were given", what,
         t.describe(), t.bytes(), bytes);
}

void expect_float_like(const Tensor& a, const Tensor& b, const char* what) {
  if (a.dtype != DType::kFloat32 || b.dtype != DType::kFloat32 || a.shape != b.shape)
    fail(ErrorKind::kInternal, "{} of {} and {} (float32 of one shape only)", what, a.describe(),
         b.describe());
}

}  // namespace

CpuContext::CpuContext(int threads_)
    : engine(dnnl::engine::kind::cpu, 0),
      stream(engine),
      pool_(std::make_shared<BufferPool>()),
      conv_cache_(nullptr, delete_conv_cache) {
  threads = threads_;
}

CpuContext::~CpuContext() = default;

size_t CpuContext::pooled_bytes() const { return pool_->held(); }

void CpuContext::release_pooled_buffers() { pool_->release(); }

std::unique_ptr<Buffer> CpuContext::allocate(int64_t bytes) {
  return std::make_unique<HostBuffer>(bytes);
}

Tensor CpuContext::new_tensor(DType dtype, Shape shape, bool zeroed) {
  const int64_t bytes = shape_numel(shape) * dtype_size(dtype);
  if (dtype_size(dtype) <= 0 || static_cast<size_t>(bytes) < kPooledBytes)
    return zeroed ? Tensor::owned(dtype, std::move(shape))
                  : Tensor::uninitialized(dtype, std::move(shape));
  const size_t size = (static_cast<size_t>(bytes) + BufferPool::kAlign - 1) / BufferPool::kAlign *
                      BufferPool::kAlign;
  std::byte* p = pool_->take(size);
  if (zeroed) std::memset(p, 0, size);
  Tensor t = Tensor::view(dtype, std::move(shape), p);
  // The buffer goes back to this pool, which the tensor keeps alive.
  t.storage =
      std::shared_ptr<std::byte[]>(p, [pool = pool_, size](std::byte* q) { pool->give(q, size); });
  return t;
}

void CpuContext::write(Tensor& dst, const void* host, int64_t bytes) {
  expect_bytes(dst, bytes, "write to the device");
  if (bytes > 0) std::memcpy(dst.data, host, static_cast<size_t>(bytes));
}

void CpuContext::read(const Tensor& src, void* host, int64_t bytes) {
  expect_bytes(src, bytes, "read from the device");
  if (bytes > 0) std::memcpy(host, src.data, static_cast<size_t>(bytes));
}

void CpuContext::copy(const Tensor& src, Tensor& dst) {
  expect_bytes(dst, src.bytes(), "copy between buffers");
  if (src.bytes() > 0 && src.data != dst.data)
    std::memcpy(dst.data, src.data, static_cast<size_t>(src.bytes()));
}

void CpuContext::fill_zero(Tensor& t) {
  if (t.data && t.bytes() > 0) std::memset(t.data, 0, static_cast<size_t>(t.bytes()));
}

void CpuContext::accumulate(Tensor& sum, const Tensor& add) {
  // 16-bit gradients (mixed precision: a tensor read by several later stages): each sum in
  // float32, rounded to nearest even once (NaN stays NaN), as the Cast kernels round.
  auto sum16 = [&](auto narrow, auto tag) {
    using T = decltype(tag);
    T* out = static_cast<T*>(static_cast<void*>(sum.data));
    const T* in = static_cast<const T*>(static_cast<const void*>(add.data));
    for (int64_t i = 0, n = sum.numel(); i < n; ++i)
      out[i] = narrow(eltwise::to_float(out[i]) + eltwise::to_float(in[i]));
  };
  if (sum.dtype == add.dtype && sum.shape == add.shape && sum.dtype == DType::kBFloat16)
    return sum16(eltwise::to_bfloat16, eltwise::BFloat16{});
  if (sum.dtype == add.dtype && sum.shape == add.shape && sum.dtype == DType::kFloat16)
    return sum16(eltwise::to_half, eltwise::Half{});
  expect_float_like(sum, add, "accumulate");
  float* out = sum.as<float>();
  const float* in = add.as<float>();
  // simd: at -O2 GCC vectorises no loop that needs a run-time check that two pointers do not
  // overlap, and this one ran a scalar add per element (the gradient sums over microbatches:
  // 9-10% of a small CNN's CPU training step). Elementwise, so the same sums either way.
  const int64_t n = sum.numel();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] += in[i];
}

bool CpuContext::unscale(Tensor& g, float factor) {
  expect_float_like(g, g, "unscale");
  float* x = g.as<float>();
  bool finite = true;
  for (int64_t i = 0, n = g.numel(); i < n; ++i) {
    x[i] *= factor;
    finite &= std::isfinite(x[i]);
  }
  return finite;
}

void CpuContext::sgd(Tensor& w, const Tensor& g, const SgdUpdate& u) {
  sgd_loop(w.as<float>(), g.as<float>(), w.numel(), u);
}

void CpuContext::momentum(Tensor& w, const Tensor& g, Tensor& v, const MomentumUpdate& u) {
  momentum_loop(w.as<float>(), g.as<float>(), v.as<float>(), w.numel(), u);
}

void CpuContext::adam(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamUpdate& u) {
  adam_loop(w.as<float>(), g.as<float>(), m.as<float>(), v.as<float>(), w.numel(), u);
}

void CpuContext::adagrad(Tensor& w, const Tensor& g, Tensor& h, const AdagradUpdate& u) {
  adagrad_loop(w.as<float>(), g.as<float>(), h.as<float>(), w.numel(), u);
}

}  // namespace stagecraft::rt::cpu
