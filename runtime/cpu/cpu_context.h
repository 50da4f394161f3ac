#pragma once
/// \file
/// The CPU backend's per-device state: a oneDNN engine and stream, the number of threads its
/// kernels use, the pool of freed tensor buffers and the kernels' caches (convolution plans and
/// scratch). A worker thread sets its OpenMP thread count from `threads` once, so the devices
/// of one process each use their own share of the cores.

#include <memory>
#include <oneapi/dnnl/dnnl.hpp>

#include "runtime/core/kernel.h"

namespace stagecraft::rt::cpu {

class BufferPool;
struct ConvCache;

class CpuContext : public DeviceContext {
 public:
  explicit CpuContext(int threads);
  ~CpuContext() override;
  dnnl::engine engine;
  dnnl::stream stream;

  /// Tensors of at least `kPooledBytes` come from this device's pool of freed buffers kept by
  /// exact size: a training step allocates the same activations and gradients every step, and
  /// reusing their pages instead of returning them to the system saves the page faults of
  /// fresh memory (measured: more than half of a ResNet-50 training step on CPU). A pooled
  /// tensor keeps the pool alive, so it may outlive the context.
  static constexpr size_t kPooledBytes = size_t{1} << 16;
  /// Bytes the pool holds for reuse now (no tensor uses them).
  size_t pooled_bytes() const;
  /// Frees every buffer the pool holds.
  void release_pooled_buffers();

  /// The convolution kernels' cache (conv.cpp), made on first use.
  ConvCache& conv_cache();
  /// The thread that used the context lets it go (a run's worker at the run's end): the
  /// convolution plans are dropped here, to be made again by the next thread, since a oneDNN
  /// primitive keeps its scratchpad in the thread that made it (the library's default "global"
  /// scratchpad is thread-local and counted per thread): run or freed in another, it crashes.
  void unbind_thread() override;

  std::unique_ptr<Buffer> allocate(int64_t bytes) override;
  Tensor new_tensor(DType dtype, Shape shape, bool zeroed) override;
  void write(Tensor& dst, const void* host, int64_t bytes) override;
  void read(const Tensor& src, void* host, int64_t bytes) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void fill_zero(Tensor& t) override;
  void accumulate(Tensor& sum, const Tensor& add) override;
  bool unscale(Tensor& g, float factor) override;
  void sgd(Tensor& w, const Tensor& g, const SgdUpdate& u) override;
  void momentum(Tensor& w, const Tensor& g, Tensor& v, const MomentumUpdate& u) override;
  void adam(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamUpdate& u) override;
  void adagrad(Tensor& w, const Tensor& g, Tensor& h, const AdagradUpdate& u) override;

 private:
  std::shared_ptr<BufferPool> pool_;
  std::unique_ptr<ConvCache, void (*)(ConvCache*)> conv_cache_;
};

/// The context a kernel was called with (every CPU kernel is called with a CpuContext).
CpuContext& context(const KernelArgs& args);

/// A oneDNN memory descriptor for a dense row-major float32 tensor of `shape` (rank 0 is [1]).
dnnl::memory::desc plain_desc(const Shape& shape,
                              dnnl::memory::data_type type = dnnl::memory::data_type::f32);

/// A oneDNN memory over the tensor's own bytes (no copy).
dnnl::memory wrap(const Tensor& tensor, const CpuContext& ctx);

// The optimizer loops (update_kernels.cpp): n contiguous float32 elements, updated in place;
// vectorised with `omp simd` and split among the calling thread's OpenMP threads on big
// tensors. Elementwise, so the result does not depend on the thread count.

void sgd_loop(float* w, const float* g, int64_t n, const SgdUpdate& u);
void momentum_loop(float* w, const float* g, float* v, int64_t n, const MomentumUpdate& u);
void adam_loop(float* w, const float* g, float* m, float* v, int64_t n, const AdamUpdate& u);
void adagrad_loop(float* w, const float* g, float* h, int64_t n, const AdagradUpdate& u);

}  // namespace stagecraft::rt::cpu
