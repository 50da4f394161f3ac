#pragma once
/// \file
/// The CPU backend's kernels by op family, one file each (`<family>.cpp`, its table
/// `<family>_kernels()`); dispatch.cpp joins their tables into the backend's one dispatch table.
/// The families and the ops each holds are listed once for both backends
/// (runtime/ops/families.def); the CUDA backend files each op under the same family
/// (tools/check_layout.sh families checks it), so an op's kernels are found by one rule on
/// either backend. The oneDNN primitives run Conv, pooling, MatMul, Gemm,
/// normalisation and Softmax; the rest are plain loops.

#include <span>

#include "runtime/core/kernel.h"

namespace stagecraft::rt::cpu {

#define STAGECRAFT_FAMILY(name) std::span<const KernelEntry> name##_kernels();
#include "runtime/ops/families.def"
#undef STAGECRAFT_FAMILY

}  // namespace stagecraft::rt::cpu
