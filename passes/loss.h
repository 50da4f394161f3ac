#pragma once
/// \file
/// The training loss: `stagec --train --loss mse|cross-entropy --labels NAME` appends it to the
/// model; without --loss, the model's own scalar float output is the loss.
///
///   mse            loss = ReduceMean((y - labels)^2) over every element; labels as y
///   cross-entropy  loss = SoftmaxCrossEntropyLoss(y, labels), reduction mean over the positions
///                  whose label is not the ignore index; y holds scores with the classes on one
///                  axis, labels int64 shaped like y without that axis
///
/// y is the model's one graph output (a model with several outputs is refused with their
/// names). The labels are the graph input NAME when the model has one (its dtype and shape are
/// checked), else a new graph input NAME. Afterwards the graph's only output is the scalar
/// "loss" (float32 []), and labels, like every graph input, go straight to the stage that reads
/// them.
///
/// Cross-entropy's class axis K of y [d0, d1, ..., d{r-1}] (the rule `class_axis` implements):
/// - `--loss-axis K` always wins (negative counts from the end; axis 0, the batch, is refused).
/// - Labels the model has: shaped like y without its last axis -> the last axis (a language
///   model's logits [B,T,V] with token labels [B,T]); like y without axis 1 -> axis 1 (ONNX's
///   and PyTorch's convention, [N,C,d1..] with [N,d1..]); both (e.g. T == V) or neither -> an
///   error that asks for --loss-axis and shows both shapes.
/// - Labels stagec adds: there is no shape to look at, so PyTorch's cross_entropy decides where
///   it can: rank 2 -> axis 1, rank 4 or more -> axis 1 ([N, C, H, W] segmentation maps and
///   volumes, as F.cross_entropy reads them). Rank 3 -> the last axis: a rank-3 output without a
///   labels input is most often an exported language model's logits [B, T, V]. The choice is
///   printed with the other reading (--loss-axis 1 for a sequence classifier's [N, C, L];
///   --loss-axis -1 for classes last on rank 4+) and the labels' shape (plan summary), and
///   enforced on every labels file stagerun is given, so it cannot be fed by mistake.
///
/// The graph stays plain ONNX: classes on axis 1 go straight into SoftmaxCrossEntropyLoss;
/// classes on the last axis are flattened first (Reshape y to [d0*...*d{r-2}, C] and labels to
/// [d0*...*d{r-2}], PyTorch's `logits.view(-1, V)`: each position's scores stay contiguous);
/// another axis is moved to axis 1 by a Transpose.
///
/// Positions whose label equals the ignore index (--ignore-index; PyTorch's -100 by default)
/// count neither in the loss nor in its divisor; a microbatch with every position ignored has
/// loss 0 and a zero gradient. The mean is per microbatch: with M microbatches each loss is
/// seeded with 1/M (grad_ops.h), so a step's loss and gradients are the mean of the
/// microbatches' means, as PyTorch's gradient accumulation of `loss / M` gives.

#include <cstdint>
#include <optional>
#include <string>

#include "compiler/ir/graph.h"

namespace stagecraft::passes {

/// PyTorch's `CrossEntropyLoss(ignore_index=-100)`: the label value padding carries.
inline constexpr int64_t kDefaultIgnoreIndex = -100;

struct LossOptions {
  std::string kind;  ///< "mse", "cross-entropy", or "" (the model's own output).
  std::string labels = "labels";
  /// --loss-axis: cross-entropy's class axis of the model's output (negative counts from the
  /// end). Unset: chosen by `class_axis` from the labels' shape.
  std::optional<int64_t> axis;
  /// --ignore-index: the label value of positions cross-entropy leaves out. Unset:
  /// kDefaultIgnoreIndex.
  std::optional<int64_t> ignore_index;
};

/// What `append_loss` appended.
struct AppendedLoss {
  ir::ValueId value = ir::kNoId;  ///< The scalar loss.
  /// One line for the terminal: the loss, its class axis and why, the labels' name and shape.
  std::string summary;
};

/// The model's own loss: its first scalar float32 output, if it has one.
std::optional<ir::ValueId> scalar_output(const ir::Graph& graph);

/// Cross-entropy's class axis of `scores` (in [1, rank)) by the rule above; `labels` is the
/// model's labels input, or nullptr when the loss adds one. Sets `why` to the reason, for the
/// summary. Throws `Error(kUsage)` for a --loss-axis out of range and `Error(kShape)` for labels
/// whose shape does not decide, naming both candidate shapes.
int64_t class_axis(const ir::Value& scores, const ir::Value* labels, const LossOptions& options,
                   std::string& why);

/// Appends the loss (or checks the model's own). Throws `Error(kUsage)` for an unknown kind or
/// a cross-entropy flag given to another loss, `Error(kModel)` for a model whose outputs do not
/// fit, `Error(kShape)` for labels of the wrong dtype or shape, naming them and the numbers.
AppendedLoss append_loss(ir::Graph& graph, const LossOptions& options);

}  // namespace stagecraft::passes
