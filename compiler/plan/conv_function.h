#pragma once
/// \file
/// Stage files stay plain ONNX: a mixed (bfloat16) plan runs Conv in 16 bits (cuDNN on the
/// tensor cores), but opset 17's Conv has no bfloat16, so the mixed-precision pass writes such
/// a node as `Conv` of domain ai.stagecraft (passes::fused_sixteen_bit: X, W, B and Y 16-bit),
/// and a file that holds one also holds a model-local function of that domain and name whose
/// body is the standard Conv between Casts, as attention_function.h does for Attention.
/// stagecraft's own runtime reads the graph and runs its Conv kernel on the 16-bit operands.
#include <onnx/onnx_pb.h>

#include <string_view>

namespace stagecraft::plan {

/// The prefix of the zero biases given to the bias-less 16-bit Conv nodes of a file whose nodes
/// use both arities (add_conv_function); the name ends in the bias's length.
inline constexpr std::string_view kConvZeroBias = "ai.stagecraft.Conv/zero_bias_";

/// Adds to `model` the function `ai.stagecraft.Conv` its 16-bit Conv nodes call, unless it has
/// none (then nothing changes). The body, at the model's default-domain opset:
///
///   Y = Cast(Conv(Cast(X, float), Cast(W, float), Cast(B, float)), the nodes' 16-bit type)
///
/// with Conv's attributes (auto_pad, dilations, group, kernel_shape, pads, strides) read from
/// the calling node (ref_attr_name; one it leaves out takes Conv's default). cuDNN and the CPU's
/// widened kernel also compute in float32 and round Y once. ONNX 1.12 has no function
/// overloads and its function inference refuses a call that leaves out an optional input, so a
/// file whose nodes use both arities gets the body with B, and its bias-less nodes read a zero
/// bias of their output channels (kConvZeroBias, 16-bit zeros: y + 0 = y, bit for bit).
/// Returns how many Conv nodes the function serves. Throws Error(kUnsupported) for a file whose
/// nodes read two types (function_storage_type).
int add_conv_function(onnx::ModelProto& model);

}  // namespace stagecraft::plan
