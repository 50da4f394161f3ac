// The CUDA backend's loss family (families.h): not written yet, so the table is empty and
// every op of the family is refused by the backend's check ("op 'X' has no cuda kernel").
#include "runtime/cuda/families.h"

namespace stagecraft::rt::cuda {

std::span<const KernelEntry> loss_kernels() { return {}; }

}  // namespace stagecraft::rt::cuda
