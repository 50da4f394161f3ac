// The CUDA backend: one dispatch table built from the op families' tables, devices dealt over
// the GPUs this process sees (cuda_context.h).
#include <fmt/format.h>

#include <span>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/nccl_comms.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::cuda {

// The CPU kernel's own check (not Backend::check, which also accepts what the CPU runs widened
// from bfloat16: this backend decides its own widening).
std::string same_as_cpu(const OpSignature& signature) {
  for (const KernelEntry& e : cpu_backend().table())
    if (e.op_type == signature.op_type) return e.check(signature);
  return fmt::format("op '{}' has no cpu kernel", signature.op_type);
}

std::string same_as_cpu_16bit(const OpSignature& signature) {
  std::string why = same_as_cpu(signature);
  if (why.empty()) return why;
  DType half = DType::kUndefined;
  const auto one_half = [&](std::span<const DType> types) {
    for (DType d : types) {
      if (d == DType::kFloat32 || d == DType::kFloat64) return false;
      if (!is_16bit_float(d)) continue;
      if (half != DType::kUndefined && d != half) return false;
      half = d;
    }
    return true;
  };
  if (!one_half(signature.inputs) || !one_half(signature.outputs) || half == DType::kUndefined)
    return why;
  return cpu_backend().runs_widened(signature) ? "" : why;
}

std::string same_as_cpu_16bit_at(const OpSignature& signature,
                                 const std::function<bool(bool is_output, size_t k)>& half_at) {
  std::string why = same_as_cpu(signature);
  if (why.empty() || signature.inputs.empty() || !is_16bit_float(signature.inputs[0])) return why;
  const DType half = signature.inputs[0];
  const auto typed = [&](std::span<const DType> types, bool is_output) {
    for (size_t k = 0; k < types.size(); ++k)
      if (types[k] != DType::kUndefined &&
          types[k] != (half_at(is_output, k) ? half : DType::kFloat32))
        return false;
    return true;
  };
  if (!typed(signature.inputs, false) || !typed(signature.outputs, true)) return why;
  return cpu_backend().runs_widened(signature) ? "" : why;
}

std::string same_as_cpu_float32(const OpSignature& signature) {
  std::string why = same_as_cpu(signature);
  return why.empty() ? all_float32(signature) : why;
}

namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    const std::span<const KernelEntry> families[] = {
#define STAGECRAFT_FAMILY(name) name##_kernels(),
#include "runtime/ops/families.def"
#undef STAGECRAFT_FAMILY
    };
    for (const auto& family : families) table_.insert(table_.end(), family.begin(), family.end());
  }
  std::string_view name() const override { return "cuda"; }
  DeviceKind kind() const override { return DeviceKind::kGpu; }
  std::span<const KernelEntry> table() const override { return table_; }
  std::unique_ptr<DeviceContext> make_device(int device, int /*threads*/) const override {
    return std::make_unique<CudaContext>(device);
  }
  std::string unavailable() const override { return unavailable_reason(); }
  Physical physical_device(int device) const override {
    if (gpu_count() == 0) fail(ErrorKind::kUnsupported, "{}", unavailable_reason());
    int gpu = gpu_of(device);
    cudaDeviceProp prop{};
    cuda::check(cudaGetDeviceProperties(&prop, gpu),
                fmt::format("cudaGetDeviceProperties({})", gpu));
    return {gpu, static_cast<int64_t>(prop.totalGlobalMem),
            fmt::format("GPU {} ({})", gpu, prop.name)};
  }
  Physical bind_local_rank(int local_rank) const override {
    if (gpu_count() == 0) fail(ErrorKind::kUnsupported, "{}", unavailable_reason());
    pin_gpu(local_rank % gpu_count());
    return physical_device(0);
  }
  const DeviceComms* device_comms() const override { return &nccl_comms(); }

 private:
  std::vector<KernelEntry> table_;
};

}  // namespace
}  // namespace stagecraft::rt::cuda

// The plugin's one entry point (runtime/core/backend.cpp loads it).
extern "C" __attribute__((visibility("default"))) const stagecraft::rt::Backend*
stagecraft_cuda_backend() {
  static const stagecraft::rt::cuda::CudaBackend backend;
  return &backend;
}
