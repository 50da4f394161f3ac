#pragma once
/// \file
/// A backend: one kind of device, behind one dispatch table. Its op kernels are the table
/// (`table`, `kernel`); its devices (`make_device`, runtime/core/device.h) own their memory,
/// copies, fill, accumulate and optimizer updates. The compiler asks it which ops and dtypes
/// it runs (`check`); the runtime asks it for kernels and devices. Backends are found by name
/// (`backend_by_name`): adding one is one line of the registry in backend.cpp.

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::rt {

class DeviceComms;  // runtime/core/device_comm.h

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  /// The kind of device it runs (what a plan's `device.kind` is checked against).
  virtual DeviceKind kind() const = 0;

  /// "" when the backend runs `signature`, else the reason, e.g. "op 'Foo' has no cpu kernel".
  /// A signature with 16-bit float tensors (bfloat16, float16) that the kernel runs only in
  /// float32 is accepted: the program runs it widened (`runs_widened`).
  std::string check(const OpSignature& signature) const;

  /// Whether `signature` runs through the 16-bit fallback: its kernel has no path for its
  /// 16-bit floats (bfloat16, float16) but takes the signature with each made float32, so the
  /// program widens the node's 16-bit inputs to float32 copies, runs the float32 kernel and
  /// rounds the float32 results into the 16-bit outputs (to nearest even: the backend's own Cast
  /// kernel, both ways).
  bool runs_widened(const OpSignature& signature) const;

  /// The kernel for `op_type`; throws `Error(kUnsupported)` when there is none.
  KernelFn kernel(std::string_view op_type) const;

  /// The table entry for `op_type`; throws `Error(kUnsupported)` when there is none.
  const KernelEntry& entry(std::string_view op_type) const;

  /// The ops the backend has kernels for, in table order.
  virtual std::span<const KernelEntry> table() const = 0;

  /// A context for device `device` using `threads` CPU threads for its kernels: the device's
  /// memory, copies and update kernels (runtime/core/device.h).
  virtual std::unique_ptr<DeviceContext> make_device(int device, int threads) const = 0;

  /// "" when this process can use the backend's devices, else why not, in one line ("no CUDA
  /// GPU is visible: cudaGetDeviceCount says ..."). Asked before anything is allocated.
  virtual std::string unavailable() const { return ""; }

  /// The physical device that a plan's device `device` runs on, and its memory: several plan
  /// devices may share one (the CPU backend's devices are all this machine; on one GPU, a
  /// plan's devices all share it).
  struct Physical {
    int index = 0;
    int64_t memory_bytes = 0;
    std::string name;  ///< For messages: "this machine's physical memory", "GPU 0 (NVIDIA H100)".
  };
  virtual Physical physical_device(int device) const = 0;

  /// Under mpirun: every device of this process runs on physical device `local_rank` (the
  /// process's index among the launch's processes on its machine) modulo the ones it sees;
  /// returns that device. The CPU backend's devices are this machine's cores: no change.
  virtual Physical bind_local_rank(int /*local_rank*/) const { return physical_device(0); }

  /// Collectives between processes' devices (the CUDA backend: NCCL); null where the backend
  /// has none (the CPU's ranks use MPI).
  virtual const DeviceComms* device_comms() const { return nullptr; }

 protected:
  const KernelEntry* find(std::string_view op_type) const;
};

/// One line when the plan devices `devices` run on fewer physical accelerators than there are
/// devices: the planner costs each device as running at once with the others, but stages that
/// share a GPU take turns, so the step is about the sum of their work. "" when each device has
/// its own, and for the CPU backend (its devices are groups of this machine's cores).
std::string shared_device_warning(const Backend& backend, std::span<const int> devices);

/// The CPU backend (oneDNN and plain C++; runtime/cpu).
const Backend& cpu_backend();

/// The CUDA backend (runtime/cuda), loaded from its plugin (libstagecraft_cuda.so) on first
/// use; null in a build without CUDA or when the plugin cannot be loaded (`cuda_backend_missing`
/// says why).
const Backend* cuda_backend();
std::string cuda_backend_missing();
/// "" when the CUDA backend is loaded and a GPU is visible, else why not, in one line.
std::string cuda_unusable();

/// The names of the backends this build knows, in registry order ("cpu", "cuda").
std::vector<std::string_view> backend_names();

/// `--backend auto`: the CUDA backend where it is built and a GPU is visible, else the CPU
/// backend; `why` (when given) gets the reason ("a GPU is visible", or why the CPU's).
const Backend& auto_backend(std::string* why = nullptr);

/// The backend named `name` ("auto" too: `auto_backend`); throws `Error(kUsage)` listing the
/// known names for an unknown one, and `Error(kUnsupported)` for a known one this build lacks
/// ("cuda" without CUDA) or this process cannot use (no GPU: `unavailable`).
const Backend& backend_by_name(std::string_view name);

}  // namespace stagecraft::rt
