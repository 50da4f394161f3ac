// Kernels of the reduce family (see families.h).
#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::cpu {

std::span<const KernelEntry> reduce_kernels() { return {}; }

}  // namespace stagecraft::rt::cpu
