#pragma once
/// \file
/// The CPU backend's kernels by op family, one file each; dispatch.cpp joins their tables
/// into the backend's one dispatch table.

#include <span>

#include "runtime/core/kernel.h"

namespace stagecraft::rt::cpu {

std::span<const KernelEntry> conv_kernels();         // conv.cpp: Conv (oneDNN)
// conv_transpose.cpp: ConvTranspose and its gradient (oneDNN deconvolution)
std::span<const KernelEntry> conv_transpose_kernels();
// instance_norm.cpp: InstanceNormalization and its gradient
std::span<const KernelEntry> instance_norm_kernels();
// rnn.cpp: LSTM, GRU, RNN and their gradients (sgemm and per-step loops, rnn_core.h)
std::span<const KernelEntry> rnn_kernels();
std::span<const KernelEntry> pool_kernels();         // pool.cpp: MaxPool, AveragePool, GlobalAveragePool (oneDNN)
std::span<const KernelEntry> matmul_kernels();       // matmul.cpp: MatMul, Gemm (oneDNN)
std::span<const KernelEntry> norm_kernels();         // norm.cpp: BatchNormalization, LayerNormalization (oneDNN)
std::span<const KernelEntry> reduce_kernels();       // reduce.cpp: Softmax (oneDNN), ReduceMean
std::span<const KernelEntry> elementwise_kernels();  // elementwise.cpp: unary, binary with broadcasting, Where, Cast
std::span<const KernelEntry> data_kernels();         // data.cpp: layout and indexing (Reshape, Gather, ...)
std::span<const KernelEntry> shape_kernels();        // shape_ops.cpp: Shape, Constant, ConstantOfShape, Range
std::span<const KernelEntry> loss_kernels();         // loss.cpp: SoftmaxCrossEntropyLoss and its gradient
std::span<const KernelEntry> leaky_relu_kernels();   // leaky_relu.cpp: LeakyRelu and its gradient
std::span<const KernelEntry> pad_kernels();          // pad.cpp: Pad (constant, reflect, edge) and its gradient
std::span<const KernelEntry> reduction_kernels();    // reduce_ops.cpp: ReduceSum, Max, Min, Prod, L1, L2, SumSquare, LogSum(Exp), gradients
std::span<const KernelEntry> activation_kernels();   // activations.cpp: Elu, Selu, Softplus, PRelu and their gradients
std::span<const KernelEntry> compare_logic_kernels();  // compare_logic.cpp: Greater, Less, Not, And, Or, Min, Max, Mod; Min, Max, Mod gradients
std::span<const KernelEntry> unary_math_kernels();   // unary_math.cpp: Exp, Log, Neg, Abs, Ceil, Floor and their gradients
std::span<const KernelEntry> resize_kernels();       // resize.cpp: Resize (nearest, linear) and its gradient
std::span<const KernelEntry> indexing_kernels();     // indexing.cpp: Tile, CumSum, GatherElements, ScatterND, gradients
std::span<const KernelEntry> rearrange_kernels();    // rearrange.cpp: DepthToSpace, SpaceToDepth, TopK, gradients

// Gradient ops (domain ai.stagecraft, contract in runtime/format/grad_ops.h): "<Op>Grad".
std::span<const KernelEntry> grad_matmul_kernels();   // grad_matmul.cpp: MatMul, Gemm
std::span<const KernelEntry> grad_conv_kernels();     // grad_conv.cpp: Conv, MaxPool, AveragePool, GlobalAveragePool
std::span<const KernelEntry> grad_norm_kernels();     // grad_norm.cpp: BatchNormalization, LayerNormalization, Softmax
std::span<const KernelEntry> grad_eltwise_kernels();  // grad_eltwise.cpp: elementwise ops
std::span<const KernelEntry> grad_data_kernels();     // grad_data.cpp: data ops, ReduceMean

}  // namespace stagecraft::rt::cpu
