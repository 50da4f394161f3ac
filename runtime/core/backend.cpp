#include "runtime/core/backend.h"

#include <fmt/format.h>

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

const Backend& backend_by_name(std::string_view name) {
  if (name == "cpu") return cpu_backend();
  if (name == "cuda")
    fail(ErrorKind::kUnsupported, "the cuda backend is not built yet; use --backend cpu");
  fail(ErrorKind::kUsage, "unknown backend '{}' (valid: cpu, cuda)", name);
}

}  // namespace stagecraft::rt
