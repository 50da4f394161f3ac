// The CPU backend: one dispatch table built from the op families' tables.
#include <omp.h>
#include <unistd.h>

#include <limits>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::cpu {

CpuContext& context(const KernelArgs& args) { return static_cast<CpuContext&>(args.device); }

dnnl::memory::desc plain_desc(const Shape& shape, dnnl::memory::data_type type) {
  dnnl::memory::dims dims =
      shape.empty() ? dnnl::memory::dims(1, 1) : dnnl::memory::dims(shape.begin(), shape.end());
  dnnl::memory::dims strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * dims[i + 1];
  return dnnl::memory::desc(dims, type, strides);
}

dnnl::memory wrap(const Tensor& tensor, const CpuContext& ctx) {
  dnnl::memory::data_type type = dnnl::memory::data_type::f32;
  switch (tensor.dtype) {
    case DType::kFloat32:
      type = dnnl::memory::data_type::f32;
      break;
    case DType::kInt32:
      type = dnnl::memory::data_type::s32;
      break;
    case DType::kInt8:
      type = dnnl::memory::data_type::s8;
      break;
    case DType::kUInt8:
      type = dnnl::memory::data_type::u8;
      break;
    default:
      fail(ErrorKind::kUnsupported, "oneDNN has no {} tensors", dtype_name(tensor.dtype));
  }
  return dnnl::memory(plain_desc(tensor.shape, type), ctx.engine, tensor.data);
}

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    const std::span<const KernelEntry> families[] = {
#define STAGECRAFT_FAMILY(name) name##_kernels(),
#include "runtime/ops/families.def"
#undef STAGECRAFT_FAMILY
    };
    size_t total = 0;
    for (const auto& family : families) total += family.size();
    table_.reserve(total);
    for (const auto& family : families) table_.insert(table_.end(), family.begin(), family.end());
  }
  std::string_view name() const override { return "cpu"; }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::span<const KernelEntry> table() const override { return table_; }
  std::unique_ptr<DeviceContext> make_device(int /*device*/, int threads) const override {
    return std::make_unique<CpuContext>(threads);
  }
  // Every device of the CPU backend is a set of threads of this process: they share the
  // machine's memory.
  Physical physical_device(int /*device*/) const override {
    long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    int64_t bytes = pages <= 0 || page <= 0
                        ? std::numeric_limits<int64_t>::max()
                        : static_cast<int64_t>(pages) * static_cast<int64_t>(page);
    return {0, bytes, "this machine's physical memory (the cpu backend's devices share it)"};
  }

 private:
  std::vector<KernelEntry> table_;
};

}  // namespace
}  // namespace stagecraft::rt::cpu

namespace stagecraft::rt {
const Backend& cpu_backend() {
  static const cpu::CpuBackend backend;
  return backend;
}
}  // namespace stagecraft::rt
