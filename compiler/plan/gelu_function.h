#pragma once
/// \file
/// Stage files stay plain ONNX: a file that holds fused `Gelu` nodes (domain ai.stagecraft,
/// runtime/ops/gelu_element.h, written by passes/fuse_gelu.cpp) also holds a model-local
/// function of that domain and name whose body computes the same output from standard ops, as
/// attention_function.h does for Attention. stagecraft's own runtime runs the fused kernel.

#include <onnx/onnx_pb.h>

namespace stagecraft::plan {

/// Adds to `model` the function `ai.stagecraft.Gelu` its Gelu nodes call, unless it has none
/// (then nothing changes). The body computes in float32 as the kernels do (X read and Y written
/// through Casts where the nodes are 16-bit, function_storage_type in attention_function.h);
/// it is the one of the nodes' `approximate`:
///   "none": Y = X * (1 + Erf(X * (1 / sqrt 2))) * 0.5;
///   "tanh": Y = X * (1 + Tanh((X + X * X * X * 0.044715) * sqrt(2 / pi))) * 0.5.
/// ONNX 1.12 has no function overloads and its opset-17 ops cannot branch on a string
/// attribute, so a file holds one form only: fuse-gelu fuses one form per graph. Throws
/// Error(kInternal) for a file whose nodes mix them. Returns how many Gelu nodes it serves.
int add_gelu_function(onnx::ModelProto& model);

}  // namespace stagecraft::plan
