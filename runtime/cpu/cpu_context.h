#pragma once
/// \file
/// The CPU backend's per-device state: a oneDNN engine and stream, and the number of threads
/// its kernels use. A worker thread sets its OpenMP thread count from `threads` once, so the
/// devices of one process each use their own share of the cores.

#include <oneapi/dnnl/dnnl.hpp>

#include "runtime/core/kernel.h"

namespace stagecraft::rt::cpu {

class CpuContext : public DeviceContext {
 public:
  explicit CpuContext(int threads);
  dnnl::engine engine;
  dnnl::stream stream;
};

/// The context a kernel was called with (every CPU kernel is called with a CpuContext).
CpuContext& context(const KernelArgs& args);

/// A oneDNN memory descriptor for a dense row-major float32 tensor of `shape` (rank 0 is [1]).
dnnl::memory::desc plain_desc(const Shape& shape, dnnl::memory::data_type type = dnnl::memory::data_type::f32);

/// A oneDNN memory over the tensor's own bytes (no copy).
dnnl::memory wrap(const Tensor& tensor, const CpuContext& ctx);

}  // namespace stagecraft::rt::cpu
