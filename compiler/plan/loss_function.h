#pragma once
/// \file
/// Stage files stay plain ONNX: a mixed (bfloat16) or fp16 plan's loss on 16-bit scores is
/// `SoftmaxCrossEntropyLoss` of domain ai.stagecraft (passes::reads_sixteen_bit_scores: the
/// scores 16-bit, the loss and log-probabilities float32, which ONNX's op cannot say: its
/// outputs take the scores' type), and a file that holds one also holds a model-local function
/// of that domain and name whose body is the standard op after a Cast of the scores to float32,
/// as conv_function.h does for Conv. stagecraft's runtime reads the graph and runs its loss
/// kernel on the 16-bit scores, widening each exactly, as the body's Cast does.
#include <onnx/onnx_pb.h>

namespace stagecraft::plan {

/// Adds to `model` the function `ai.stagecraft.SoftmaxCrossEntropyLoss` its loss nodes call,
/// unless it has none (then nothing changes). The body, at the model's default-domain opset:
///
///   loss[, log_prob] = SoftmaxCrossEntropyLoss(Cast(scores, float), labels[, weights])
///
/// with the op's attributes (ignore_index, reduction) read from the calling node
/// (ref_attr_name). ONNX 1.12 has no function overloads and its function inference refuses a
/// call that leaves out an optional input, so the body takes the nodes' own inputs and outputs;
/// nodes of two arities in one file are refused (Error(kUnsupported); a plan has one loss).
/// Returns how many nodes the function serves.
int add_loss_function(onnx::ModelProto& model);

}  // namespace stagecraft::plan
