#include "runtime/core/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/format/error.h"

namespace stagecraft::rt {

const KernelEntry* Backend::find(std::string_view op_type) const {
  for (const KernelEntry& entry : table())
    if (entry.op_type == op_type) return &entry;
  return nullptr;
}

std::string Backend::check(const OpSignature& signature) const {
  const KernelEntry* entry = find(signature.op_type);
  if (entry == nullptr) return fmt::format("op '{}' has no {} kernel", signature.op_type, name());
  return entry->check(signature);
}

const KernelEntry& Backend::entry(std::string_view op_type) const {
  const KernelEntry* entry = find(op_type);
  if (entry == nullptr) fail(ErrorKind::kUnsupported, "op '{}' has no {} kernel", op_type, name());
  return *entry;
}

KernelFn Backend::kernel(std::string_view op_type) const { return entry(op_type).run; }

namespace {

// The registry: every backend by name; `get` is null for one this build lacks.
struct Registered {
  std::string_view name;
  const Backend& (*get)();
};
constexpr Registered kBackends[] = {
    {"cpu", cpu_backend}, {"cuda", nullptr},  // runtime/cuda, not built yet
};

}  // namespace

std::vector<std::string_view> backend_names() {
  std::vector<std::string_view> names;
  for (const Registered& r : kBackends) names.push_back(r.name);
  return names;
}

const Backend& backend_by_name(std::string_view name) {
  for (const Registered& r : kBackends) {
    if (r.name != name) continue;
    if (r.get == nullptr)
      fail(ErrorKind::kUnsupported, "the {} backend is not built yet; use --backend cpu", name);
    return r.get();
  }
  fail(ErrorKind::kUsage, "unknown backend '{}' (valid: {})", name,
       fmt::join(backend_names(), ", "));
}

Tensor clone_on(DeviceContext& device, const Tensor& t) {
  Tensor copy = device.new_tensor(t.dtype, t.shape, false);
  device.copy(t, copy);
  return copy;
}

float read_float(DeviceContext& device, const Tensor& t) {
  if (t.dtype != DType::kFloat32 || t.numel() != 1)
    fail(ErrorKind::kInternal, "reading a float from {} (one float32 element only)", t.describe());
  float value = 0;
  device.read(t, &value, sizeof value);
  return value;
}

Tensor scalar_on(DeviceContext& device, float value) {
  Tensor t = device.new_tensor(DType::kFloat32, {}, false);
  device.write(t, &value, sizeof value);
  return t;
}

}  // namespace stagecraft::rt
