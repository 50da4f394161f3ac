#pragma once
/// \file
/// The CUDA backend's kernels by op family, one .cpp each (`<family>.cpp`: attributes, shapes,
/// library calls; its table `<family>_kernels()`) with its device kernels in
/// `<family>_kernels.cu` beside it (the elementwise families share elementwise_kernels.cu and
/// grad_eltwise_kernels.cu, pool shares conv_kernels.cu); dispatch.cpp joins their tables into
/// the backend's one dispatch table. A family covers the same ops as the CPU backend's family of
/// the same name (the one list: runtime/ops/families.def; tools/check_layout.sh families checks
/// that each family's ops match), forward and gradient, and accepts the same signatures
/// (`same_as_cpu`), so a plan checked for one runs on the other. cuBLAS runs MatMul, Gemm and
/// the recurrent nets' products, cuDNN Conv and ConvTranspose; the rest are our own kernels.

#include <functional>
#include <span>
#include <string>

#include "runtime/core/kernel.h"

namespace stagecraft::rt::cuda {

// The op families (runtime/ops/families.def): each NAME_kernels() in NAME.cpp.
#define STAGECRAFT_FAMILY(name) std::span<const KernelEntry> name##_kernels();
#include "runtime/ops/families.def"
#undef STAGECRAFT_FAMILY

/// The CPU backend's answer for the same signature: a CUDA kernel takes what the CPU's takes.
std::string same_as_cpu(const OpSignature& signature);

/// The CPU's answer, and also "" for a node whose floats are all of one 16-bit type (bfloat16,
/// or float16) where the CPU takes its float32 form: for kernels with a native 16-bit path that
/// widens each element in registers, runs the float32 formula and rounds to nearest even, as the
/// program's widened fallback would, bit for bit, without its casts through memory.
std::string same_as_cpu_16bit(const OpSignature& signature);

/// The CPU's answer, and also "" for a node that mixes one 16-bit type with float32 by
/// position where the CPU takes its float32 form (the norms and their gradients, whose
/// statistics stay float32): every input and output `half_at(is_output, k)` names is of input
/// 0's 16-bit type, every other float32, any absent (kUndefined).
std::string same_as_cpu_16bit_at(const OpSignature& signature,
                                 const std::function<bool(bool is_output, size_t k)>& half_at);

/// For input `k` of a gradient node over a forward of `n` inputs and `m` outputs (the forward's
/// inputs, then its outputs, then their gradients: runtime/format/grad_ops.h): the forward
/// output it is, or is the gradient of; -1 for a forward input.
inline int forward_output_at(size_t k, size_t n, size_t m) {
  return k < n || m == 0 ? -1 : static_cast<int>((k - n) % m);
}

/// The CPU's answer, float32 only: for a kernel the CPU runs in bfloat16 natively and this
/// backend does not (the program then runs a bfloat16 node widened to float32).
std::string same_as_cpu_float32(const OpSignature& signature);

}  // namespace stagecraft::rt::cuda
