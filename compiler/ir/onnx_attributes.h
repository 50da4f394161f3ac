#pragma once
/// \file
/// Attribute checks that run before ONNX's shape inference sees a model. ONNX 1.12 trusts the
/// numbers it is given: a Conv or pool with `strides = [0, 0]` divides by zero inside libonnx
/// (SIGFPE), and a Slice whose constant `steps` hold INT64_MIN sends its data propagation into a
/// loop that never ends (and -2^63 + 1 into a read out of bounds). These checks refuse such a node first, with one line naming it.

#include <onnx/onnx_pb.h>

#include <string>

namespace stagecraft::ir {

/// Refuses, with one `Error(kModel)` line naming the node, the attribute and its value, every
/// node of `model`'s graph (default domain) that holds:
/// - `kernel_shape`, `strides` or `dilations` with an entry below 1;
/// - `pads` (outside Pad, where negative pads crop) or `output_padding` with a negative entry;
/// - `group` or `blocksize` below 1;
/// - a Slice whose constant `steps` input (an initializer or a Constant node's value) holds 0
///   or a step past 2^31 - 1 in magnitude (ONNX 1.12 steps through shape tensors in 32 bits);
/// - a TopK whose constant K is negative or has other than one element (ONNX's inference leaves
///   the outputs' shape unknown, which would be blamed on the data).
void check_attributes_for_inference(const onnx::ModelProto& model);

/// The numbers ONNX's inference does not say in its line for a failing node of `model` named
/// `node` (as node_name_or_default names it): " (K = 6, axis = 1)" for a TopK with a constant
/// K; "" for other nodes.
std::string inference_context(const onnx::ModelProto& model, const std::string& node);

}  // namespace stagecraft::ir
