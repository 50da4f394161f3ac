#pragma once
/// \file
/// The CUDA backend's per-device state: the GPU a plan device runs on, the GPU's compute
/// stream, cuBLAS and cuDNN handles (made on first use), and the stream-ordered memory pool its
/// tensors come from. The arena is one cudaMalloc made when a run starts (`allocate`); tensors
/// a step makes (stashes, gradients, messages) come from the GPU's memory pool, which keeps
/// what is freed (its release threshold is the whole GPU), so after the first step no
/// allocation reaches the driver. Kernels are queued on the compute stream; `synchronize` waits
/// for them before another device's worker reads what they wrote.
///
/// The plan devices that share one GPU share its one stream: every kernel, copy and free on a
/// GPU is then in one order, so a tensor one device made and another read is never freed while
/// still being read, whichever device lets go of it last. (Separate send and receive streams
/// ordered by events are the next step, for overlap.)

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/kernel.h"

namespace stagecraft::rt::cuda {

/// The GPUs this process sees (0 when none, or no driver).
int gpu_count();

/// The GPU a plan's device `device` runs on: devices are dealt round-robin over the GPUs, so on
/// one GPU every device shares it; after `pin_gpu`, that GPU.
int gpu_of(int device);

/// Under mpirun: every device of this process runs on `gpu` (its local rank modulo the GPUs).
void pin_gpu(int gpu);

/// cuDNN's descriptors and chosen algorithms per convolution signature (conv_cudnn.cpp).
struct CudnnConvCache;

class CudaContext : public DeviceContext {
 public:
  /// Makes the context current on this thread (cudaSetDevice) and creates its stream.
  explicit CudaContext(int device);
  ~CudaContext() override;
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int gpu() const { return gpu_; }
  cudaStream_t stream() const { return stream_; }
  /// cuBLAS on this context's stream, made on first use.
  cublasHandle_t cublas();
  /// cuBLASLt (for epilogues), made on first use, and its workspace.
  cublasLtHandle_t cublas_lt();
  /// cuDNN on this context's stream, made on first use.
  cudnnHandle_t cudnn();
  /// Every convolution signature's cuDNN descriptors and algorithms (conv_cudnn.cpp), made on
  /// its first call and kept for the context's life: cuDNN's heuristics run once per shape.
  CudnnConvCache& conv_cache();
  /// Scratch of at least `bytes` on the device (cuBLAS/cuDNN workspaces, reductions); valid
  /// until the next call on this context. Grows, never shrinks.
  void* workspace(int64_t bytes);

  /// Bytes the memory pool held at its highest, plus the arena and workspace: the device's
  /// measured peak (reported beside the plan's prediction).
  int64_t pool_peak_bytes() const;

  bool host_visible() const override { return false; }
  void bind_thread() override;
  void synchronize() override;
  Tensor adopt(const Tensor& t) override;
  double time_ms(const std::function<void()>& body) override;
  void range_push(const char* name) override;
  void range_pop() override;
  MemoryUse memory_use() const override;
  HostWaits host_waits() const override;

  std::unique_ptr<Buffer> allocate(int64_t bytes) override;
  Tensor new_tensor(DType dtype, Shape shape, bool zeroed) override;
  void write(Tensor& dst, const void* host, int64_t bytes) override;
  void write_pending(Tensor& dst, const void* host, int64_t bytes) override;
  bool pin_host(const void* host, int64_t bytes) override;
  void unpin_host(const void* host) override;
  void read(const Tensor& src, void* host, int64_t bytes) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void fill_zero(Tensor& t) override;
  void accumulate(Tensor& sum, const Tensor& add) override;
  bool unscale(Tensor& g, float factor) override;
  bool unscale_many(Tensor* const* grads, size_t count, float factor) override;
  void sgd(Tensor& w, const Tensor& g, const SgdUpdate& u) override;
  void momentum(Tensor& w, const Tensor& g, Tensor& v, const MomentumUpdate& u) override;
  void adam(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamUpdate& u) override;
  void adagrad(Tensor& w, const Tensor& g, Tensor& h, const AdagradUpdate& u) override;
  void adam_many(const AdamTensors* items, size_t count, const AdamUpdate& u,
                 bool zero_grads) override;

 private:
  int gpu_ = 0;
  cudaStream_t stream_ = nullptr;  // the GPU's (gpu_stream), not owned
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublas_lt_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::shared_ptr<CudnnConvCache> conv_cache_;  // conv_cudnn.cpp, made on first use
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
  int64_t arena_bytes_ = 0;
  std::atomic<int64_t> waits_{0};    // synchronize() calls
  std::atomic<int64_t> wait_ns_{0};  // and the nanoseconds spent in them
};

/// The GPUs' compute stream (one per GPU for the process, made on first use, never destroyed).
cudaStream_t gpu_stream(int gpu);

/// "" when this process sees a GPU, else one line saying why not.
const std::string& unavailable_reason();

/// The context a kernel was called with (every CUDA kernel is called with a CudaContext).
CudaContext& context(const KernelArgs& args);

/// Host-side copy of a small device tensor (shape inputs, axes): the kernel that needs one
/// waits for the stream. Integers are widened to int64.
std::vector<int64_t> read_ints(CudaContext& ctx, const Tensor& t);

}  // namespace stagecraft::rt::cuda
