#pragma once
/// \file
/// The CUDA backend's kernels by op family, one .cpp each (attributes, shapes, library calls)
/// with its own device kernels in a .cu beside it; dispatch.cpp joins their tables into the
/// backend's one dispatch table. A family covers the same ops as the CPU backend's family of
/// the same name (runtime/cpu/families.h), forward and gradient, and accepts the same
/// signatures (`same_as_cpu`), so a plan checked for one runs on the other.

#include <span>
#include <string>

#include "runtime/core/kernel.h"

namespace stagecraft::rt::cuda {

std::span<const KernelEntry> matmul_kernels();  // matmul.cpp: MatMul, Gemm (cuBLAS)
std::span<const KernelEntry> conv_kernels();    // conv.cpp: Conv, pooling (cuDNN)
std::span<const KernelEntry>
norm_kernels();  // norm.cpp: BatchNormalization, LayerNormalization, Softmax
std::span<const KernelEntry>
elementwise_kernels();  // elementwise.cpp: unary, binary with broadcasting, Where, Cast, LeakyRelu
std::span<const KernelEntry> data_kernels();  // data.cpp: layout, indexing, shape ops, ReduceMean
std::span<const KernelEntry> loss_kernels();  // loss.cpp: SoftmaxCrossEntropyLoss and its gradient
std::span<const KernelEntry> pad_kernels();   // pad.cpp: Pad and its gradient
// reduce_ops.cpp: ReduceSum, Max, Min, Prod, L1, L2, SumSquare, LogSum, LogSumExp, gradients
std::span<const KernelEntry> reduction_kernels();
std::span<const KernelEntry> resize_kernels();  // resize.cpp: Resize and its gradient
// indexing.cpp: Tile, CumSum, GatherElements, ScatterND and their gradients
std::span<const KernelEntry> indexing_kernels();
// rearrange.cpp: DepthToSpace, SpaceToDepth, TopK and their gradients
std::span<const KernelEntry> rearrange_kernels();
// conv_transpose.cpp: ConvTranspose and its gradient (cuDNN)
std::span<const KernelEntry> conv_transpose_kernels();
// instance_norm.cpp: InstanceNormalization and its gradient (the batch-norm kernels)
std::span<const KernelEntry> instance_norm_kernels();
// rnn.cpp: LSTM, GRU, RNN and their gradients (cuBLAS and per-step kernels, cpu/rnn_core.h)
std::span<const KernelEntry> rnn_kernels();

// Gradient ops (domain ai.stagecraft, runtime/format/grad_ops.h): "<Op>Grad".
std::span<const KernelEntry> grad_matmul_kernels();   // grad_matmul.cpp
std::span<const KernelEntry> grad_conv_kernels();     // grad_conv.cpp: Conv and pooling
std::span<const KernelEntry> grad_norm_kernels();     // grad_norm.cpp
std::span<const KernelEntry> grad_eltwise_kernels();  // grad_eltwise.cpp
std::span<const KernelEntry> grad_data_kernels();     // grad_data.cpp

/// The CPU backend's answer for the same signature: a CUDA kernel takes what the CPU's takes.
std::string same_as_cpu(const OpSignature& signature);

/// The CPU's answer, and also "" for a node whose floats are all of one 16-bit type (bfloat16,
/// or float16) where the CPU takes its float32 form: for kernels with a native 16-bit path that
/// widens each element in registers, runs the float32 formula and rounds to nearest even, as the
/// program's widened fallback would, bit for bit, without its casts through memory.
std::string same_as_cpu_16bit(const OpSignature& signature);

/// The CPU's answer, float32 only: for a kernel the CPU runs in bfloat16 natively and this
/// backend does not (the program then runs a bfloat16 node widened to float32).
std::string same_as_cpu_float32(const OpSignature& signature);

}  // namespace stagecraft::rt::cuda
