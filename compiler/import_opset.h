#pragma once
/// \file
/// Reading models of default-domain opsets 18 to 22 (torch.onnx's dynamo exporter writes 18;
/// `opset_version=18..22` on the TorchScript one) with ONNX 1.12, whose checker and shape
/// inference know opset 17 at most: each node whose opset-18+ form differs from its opset-17 one
/// is rewritten into the latter before the checker runs, and the model then imports as opset 17.
///
/// What changed between 17 and 22, and what happens to it here:
/// - the Reduce ops but ReduceSum take `axes` as an input (18): a constant one (an initializer or
///   a Constant node's value) becomes the opset-17 attribute; `noop_with_empty_axes` = 1 with no
///   axes makes the node an Identity; a computed axes input is refused naming the node;
/// - Split's `num_outputs` (18) is dropped: opset 17 splits into as many equal parts as the
///   node has outputs (ONNX's shape inference names a dim they do not divide);
/// - Pad's `axes` input (18) and `wrap` mode (19), Resize's `antialias`, `axes` and
///   `keep_aspect_ratio_policy` (18) and `half_pixel_symmetric` mode (19), AveragePool's
///   `dilations` (19): dropped where they say what opset 17 does, refused with the node's name
///   otherwise; Cast's and CastLike's `saturate` (19, float8 only) is dropped;
/// - Gelu (20) and Mish (18) become their formulas in opset-17 ops (Erf or Tanh; Softplus and
///   Tanh), which the import's GELU fusion makes one fused node again; GroupNormalization (18,
///   21) becomes torch's opset-17 form (Reshape, InstanceNormalization, the affine per group at
///   18 and per channel at 21, Reshape back);
/// - any other op opset 17 does not have (Col2Im, the Bitwise ops, ...) is refused naming it,
///   the node and the file's opset;
/// - every other change (new element types) leaves the node as it is.
/// The ir_version becomes at most ONNX 1.12's (8): the fields and types of later ones (float8,
/// 4-bit) are refused where a tensor uses them, as any unknown element type is.

#include <onnx/onnx_pb.h>

#include <cstdint>

namespace stagecraft {

/// The newest default-domain opset import reads (rewritten into opset 17 by `lower_to_opset17`).
inline constexpr int64_t kNewestReadOpset = 22;

/// Rewrites `model` (default-domain opset 18 to kNewestReadOpset) into its opset-17 form, as the
/// file comment says, and sets its default-domain opset to 17: the number of nodes rewritten.
/// Does nothing (0) for an opset of 17 or older, or newer than kNewestReadOpset (refused
/// later). `Error(kUnsupported)` naming the node for what opset 17 cannot say.
int64_t lower_to_opset17(onnx::ModelProto& model);

}  // namespace stagecraft
