#pragma once
/// \file
/// Stage files stay plain ONNX: a file that holds fused `Attention` nodes (domain ai.stagecraft,
/// runtime/ops/attention_shape.h) also holds a model-local function of that domain and name
/// whose body computes the same outputs from standard ops, so the ONNX checker accepts the file
/// and any ONNX runtime can run it. stagecraft's own runtime reads the graph only and runs the
/// fused kernel.

#include <onnx/onnx_pb.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stagecraft::plan {

/// The name of the zero mask given to the mask-less Attention nodes of a file whose nodes use
/// both arities (add_attention_function).
inline constexpr std::string_view kAttentionZeroMask = "ai.stagecraft.Attention/zero_mask";

/// Adds to `model` the function `ai.stagecraft.Attention` its Attention nodes call, unless it
/// has none (then nothing changes). The body, at the model's default-domain opset, computes
/// in float32 as the kernels do (Q, K, V read and O written through Casts where the nodes are
/// 16-bit, function_storage_type):
///
///   scores = MatMul(Q, K^T) * scale, keys j > i of query i set to -inf where causal is 1
///            (top-left aligned, as the kernels), + mask where the nodes pass one;
///   O = MatMul(Softmax(scores, last axis), V);  lse = ReduceLogSumExp(scores, last axis).
///
/// `scale` and `causal` are read from the calling node (ref_attr_name): the fusion always
/// writes both. The body is written for the arity and rank the file's nodes use. ONNX 1.12 has
/// no function overloads, and its function inference refuses a call that leaves out an
/// optional input, so a file whose nodes use both arities gets the masked body, and its
/// mask-less nodes read a float32 scalar zero (kAttentionZeroMask): scores + 0 are the
/// scores, bit for bit. Where the ranks differ, K^T is an Einsum over an ellipsis.
/// A query that sees no key (a mask of -inf across its row) gets NaN from the body, as from
/// the unfused ops the node replaced; the kernels give O = 0 and lse = -inf there.
/// Returns how many Attention nodes the function serves. Throws Error(kUnsupported) for a
/// default-domain opset below 11 (no CumSum).
int add_attention_function(onnx::ModelProto& model);

/// The element type (onnx::TensorProto::DataType) that the file's fused `op_type` nodes
/// (domain ai.stagecraft) read at input 0: FLOAT, or BFLOAT16 / FLOAT16 for the 16-bit nodes of
/// a mixed or fp16 plan (passes::fused_sixteen_bit). A body for a 16-bit type reads those
/// operands through Casts to float32 and casts its 16-bit outputs back, as the kernels compute
/// in float32 on 16-bit storage. FLOAT when the file has no such node. Throws
/// Error(kUnsupported) for a file whose nodes read two types (one body cannot serve both).
int function_storage_type(const onnx::ModelProto& model, std::string_view op_type);

/// The model's default-domain opset (-1 where it imports none): the opset of its functions'
/// bodies.
int64_t default_opset(const onnx::ModelProto& model);

/// An operand of a function whose body is one standard op between Casts (op_between_casts): its
/// name, and whether the body reads it through a Cast to float32 (an input) or writes it through
/// a Cast from float32 to the nodes' 16-bit type (an output).
struct CastOperand {
  std::string name;
  bool cast = false;
};

/// The model-local function `op` of domain ai.stagecraft whose body, at `opset`, is the
/// standard `op` on `inputs` giving `outputs` (each cast as it says; a cast operand's float32
/// value is named name + "_float"), with the op's `attributes` read from the calling node
/// (ref_attr_name; one the node leaves out takes the op's default): how a 16-bit node of ours
/// whose opset has no 16-bit form of the op (Conv, the pools, the loss on 16-bit scores) is
/// spelled in plain ONNX, computing in float32 as the kernels do. Body nodes are named op + "/"
/// + their output.
onnx::FunctionProto op_between_casts(
    const std::string& op, const std::string& doc, const std::vector<CastOperand>& inputs,
    const std::vector<CastOperand>& outputs,
    const std::vector<std::pair<const char*, onnx::AttributeProto::AttributeType>>& attributes,
    int storage, int64_t opset);

}  // namespace stagecraft::plan
