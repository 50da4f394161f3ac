#pragma once
/// \file
/// Stage files stay plain ONNX: a mixed (bfloat16) plan runs MaxPool, AveragePool and
/// GlobalAveragePool on 16-bit X and Y, but their opset-17 schemas have no bfloat16, so the
/// mixed-precision pass writes such a node as the op of domain ai.stagecraft
/// (passes::fused_sixteen_bit), and a file that holds one also holds a model-local function of
/// that domain and name whose body is the standard op between Casts, as conv_function.h does for
/// Conv. stagecraft's runtime reads the graph and runs its pooling kernels on the 16-bit
/// operands (widened exactly, Y rounded once: the body's values).
#include <onnx/onnx_pb.h>

namespace stagecraft::plan {

/// Adds to `model` one function per pooling op of domain ai.stagecraft its nodes use, unless it
/// has none (then nothing changes). Each body, at the model's default-domain opset:
///
///   Y[, Indices] = Cast(Op(Cast(X, float)), the nodes' 16-bit type)[, Indices]
///
/// with the op's attributes read from the calling node (ref_attr_name; one it leaves out takes
/// the op's default). ONNX 1.12 has no function overloads, so the body gives the outputs the
/// nodes name (MaxPool's Indices where they ask for it); nodes of one op with two arities in one
/// file are refused (Error(kUnsupported)). Returns how many nodes the functions serve.
int add_pool_functions(onnx::ModelProto& model);

}  // namespace stagecraft::plan
