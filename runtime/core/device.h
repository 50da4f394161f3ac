#pragma once
/// \file
/// One device as its backend runs it (ggml's backend instance and buffer interface are the
/// model): memory (buffers for an arena, tensors the device owns), copies to and from the host
/// and between buffers, fill, accumulate and the optimizer updates, beside the op kernels of
/// the backend's table. The executor moves and changes every byte through these, so a second
/// kind of device plugs in without touching it. The CPU backend implements them on host memory
/// (runtime/cpu/device_ops.cpp).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/core/tensor.h"

namespace stagecraft::rt {

/// One block of device memory (an arena); frees itself when destroyed.
class Buffer {
 public:
  virtual ~Buffer() = default;
  /// The first byte (device address), aligned to plan::kArenaAlignment.
  virtual std::byte* base() const = 0;
  /// Bytes usable from `base()`.
  virtual int64_t size() const = 0;
};

/// The scalars of one plain SGD update: w -= lr * (g + l2*w).
struct SgdUpdate {
  float lr = 0;
  float l2 = 0;
};

/// v = alpha*v + beta*g' (g' = g + l2*w);  w -= lr * (nesterov ? g' + alpha*v : v).
struct MomentumUpdate {
  float lr = 0;
  float l2 = 0;
  float alpha = 0;  ///< Decay of the previous velocity.
  float beta = 1;   ///< Scale of the current gradient.
  bool nesterov = false;
};

/// m = b1*m + (1-b1)*g';  v = b2*v + (1-b2)*g'^2;
/// w = post_scale * (pre_scale*w - step_size * m / (sqrt(v)*denom_scale + eps)).
struct AdamUpdate {
  float l2 = 0;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float step_size = 0;    ///< Multiplies m / denom.
  float denom_scale = 1;  ///< denom = sqrt(v)*denom_scale + eps.
  float eps = 0;
  float pre_scale = 1;   ///< w is scaled by this before the update (AdamW's decay).
  float post_scale = 1;  ///< and by this after it (ONNX's norm_coefficient_post).
};

/// One weight's tensors for `DeviceContext::adam_many`: the weight, its gradient and Adam's two
/// moments, float32 of one shape.
struct AdamTensors {
  Tensor* w = nullptr;
  Tensor* g = nullptr;
  Tensor* m = nullptr;
  Tensor* v = nullptr;
};

/// h += g'^2;  w -= lr * g' / (sqrt(h) + eps).
struct AdagradUpdate {
  float lr = 0;
  float l2 = 0;
  float eps = 0;
};

/// The per-device state and operations of a backend (engines, streams, pools, caches); each
/// backend derives its own. One thread at a time uses a context.
class DeviceContext {
 public:
  virtual ~DeviceContext() = default;
  int threads = 1;  ///< CPU threads its kernels use.
  /// Whether kernels must give the same bytes run after run (stagerun --deterministic): on
  /// CUDA, cuDNN's convolutions then use only its deterministic algorithms; off (the default,
  /// as PyTorch's), its fastest, some of which sum with atomics in a varying order. The CPU's
  /// kernels are deterministic either way.
  bool deterministic = false;
  /// While true (stagerun --profile-nodes' step, one node at a time), kernels that choose
  /// between implementations append their choice to `notes` ("forward IMPLICIT_PRECOMP_GEMM");
  /// the caller reads and clears it after each node.
  bool collect_notes = false;
  std::string notes;

  /// Whether the device's tensors are host memory (the CPU backend): then host tensors are used
  /// as they are, with no copy (`to_device`, `to_host`).
  virtual bool host_visible() const { return true; }
  /// A context outlives the run that made it (the pipeline keeps it for the next,
  /// runtime/exec/pipeline.h): each run's worker thread calls `bind_thread` before it uses the
  /// context (CUDA: its GPU made current) and `unbind_thread` when done with it (the CPU: what
  /// must be freed by the thread that made it is).
  virtual void bind_thread() {}
  virtual void unbind_thread() {}
  /// Waits until everything the device was asked to do is done (a kernel's output may then be
  /// read by another device's worker). Nothing to wait for where kernels run synchronously.
  virtual void synchronize() {}
  /// `t` as this device can read it: `t` itself where it can (host memory, this device's own
  /// memory), else a copy on this device (a tensor another GPU made).
  virtual Tensor adopt(const Tensor& t) { return t; }
  /// Milliseconds `body` keeps the device busy: wall time where kernels run synchronously (the
  /// CPU), elapsed time between events queued around it on the device's stream (CUDA).
  virtual double time_ms(const std::function<void()>& body);
  /// Opens and closes a named range around work queued on the device (NVTX on CUDA, so that
  /// Nsight Systems and Nsight Compute name each kernel's node and instruction); nothing on the
  /// CPU. Ranges nest; every push has its pop on the same thread.
  virtual void range_push(const char* /*name*/) {}
  virtual void range_pop() {}
  /// What the device itself says of its memory, where it keeps count (CUDA): the highest it held
  /// for tensors and arena, and what the driver reports in use now (cudaMemGetInfo), both for
  /// the physical device (shared by the plan devices on it); -1 where unknown (the CPU: the
  /// executor's own meter is the figure).
  struct MemoryUse {
    int64_t peak_bytes = -1;
    int64_t used_bytes = -1;
  };
  virtual MemoryUse memory_use() const { return {}; }

  /// How often the host waited for the device since the context was made (a synchronize, or a
  /// copy to or from host memory that waits for the queue), and the seconds it spent blocked
  /// so: a device that runs behind a queue idles after each wait until the host queues more
  /// work. count -1 where the device keeps no count (the CPU backend runs on the host).
  struct HostWaits {
    int64_t count = -1;
    double seconds = 0;
  };
  virtual HostWaits host_waits() const { return {}; }

  // Memory.

  /// A buffer of at least `bytes` bytes (an arena). Throws `Error(kIo)` naming the size when
  /// the device has no room.
  virtual std::unique_ptr<Buffer> allocate(int64_t bytes) = 0;
  /// A tensor whose bytes the device owns and frees when the last copy of the tensor goes,
  /// zero-filled when `zeroed` (else left as they are: for a kernel's output).
  virtual Tensor new_tensor(DType dtype, Shape shape, bool zeroed) = 0;

  // Copies (sizes must agree: `Error(kInternal)` otherwise).

  /// Host bytes into the device tensor `dst`.
  virtual void write(Tensor& dst, const void* host, int64_t bytes) = 0;
  /// `write` of host bytes that stay as they are, and allocated, until the device's next
  /// `synchronize` (a run's inputs, which live for the run): the device may still be reading
  /// them when this returns (CUDA: queued behind the work before it, with no wait for that
  /// work; asynchronous from pinned memory, `pin_host`). The CPU backend copies at once.
  virtual void write_pending(Tensor& dst, const void* host, int64_t bytes) {
    write(dst, host, bytes);
  }
  /// Page-locks `bytes` of host memory from `host` for copies to the device (CUDA:
  /// cudaHostRegister, which then copies it without staging) until `unpin_host(host)`; false
  /// where it is not done (nothing to undo then: another pin overlapping it, or no need).
  virtual bool pin_host(const void* /*host*/, int64_t /*bytes*/) { return false; }
  virtual void unpin_host(const void* /*host*/) {}
  /// The device tensor `src` into host bytes.
  virtual void read(const Tensor& src, void* host, int64_t bytes) = 0;
  /// dst = src, both on this device (or a peer it can read).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;

  // Fill and accumulate.

  /// Every byte of `t` set to zero.
  virtual void fill_zero(Tensor& t) = 0;
  /// sum += add, float32, elementwise in index order (gradient sums: every device gets the
  /// same bytes for the same parts in the same order); bfloat16 too (mixed precision's
  /// activation gradients), and float16, each sum in float32 rounded to nearest even.
  virtual void accumulate(Tensor& sum, const Tensor& add) = 0;
  /// g *= factor on float32 elements in place (dynamic loss scaling: the gradients divided by
  /// the scale); returns whether every element of the result is finite (no inf, no NaN).
  virtual bool unscale(Tensor& g, float factor) = 0;
  /// `unscale` on each of `count` tensors; whether every element of all of them is finite: the
  /// same bytes as the calls one by one, which is what this does; the CUDA backend reads one
  /// flag for all of them rather than one a tensor (each a wait for the device).
  virtual bool unscale_many(Tensor* const* grads, size_t count, float factor);

  // Optimizer updates of float32 tensors of one shape, in place (runtime/optim derives the
  // scalars per rule; optimizer.h gives the formulas).

  virtual void sgd(Tensor& w, const Tensor& g, const SgdUpdate& u) = 0;
  virtual void momentum(Tensor& w, const Tensor& g, Tensor& v, const MomentumUpdate& u) = 0;
  virtual void adam(Tensor& w, const Tensor& g, Tensor& m, Tensor& v, const AdamUpdate& u) = 0;
  virtual void adagrad(Tensor& w, const Tensor& g, Tensor& h, const AdagradUpdate& u) = 0;

  /// `adam` on every item with one `u` (a stage's weights at one step), then, with
  /// `zero_grads`, each gradient zeroed: the same bytes as the calls one by one, which is what
  /// this does; the CUDA backend runs the lot in a few launches rather than two per weight.
  /// (A pointer and a count: this header is also compiled as C++17 by nvcc.)
  virtual void adam_many(const AdamTensors* items, size_t count, const AdamUpdate& u,
                         bool zero_grads);
};

/// A copy of `t` the device owns.
Tensor clone_on(DeviceContext& device, const Tensor& t);

/// The host tensor `host` on the device: `host` itself on a host-visible device, else a copy.
Tensor to_device(DeviceContext& device, const Tensor& host);

/// `to_device` through `DeviceContext::write_pending`: `host` must stay as it is until the
/// device's next synchronize.
Tensor to_device_pending(DeviceContext& device, const Tensor& host);

/// The device tensor `t` in host memory: `t` itself on a host-visible device, else a copy.
Tensor to_host(DeviceContext& device, const Tensor& t);

/// The one float32 element of `t` (a loss), read back to the host.
float read_float(DeviceContext& device, const Tensor& t);

/// A float32 scalar tensor on the device holding `value` (a loss seed).
Tensor scalar_on(DeviceContext& device, float value);

}  // namespace stagecraft::rt
