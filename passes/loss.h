#pragma once
/// \file
/// The training loss: `stagec --train --loss mse|cross-entropy --labels NAME` appends it to the
/// model; without --loss, the model's own scalar float output is the loss.
///
///   mse            loss = ReduceMean((y - labels)^2) over every element; labels as y
///   cross-entropy  loss = SoftmaxCrossEntropyLoss(y, labels), reduction mean; y [N, C, ...]
///                  scores, labels int64 [N, ...]
///
/// y is the model's one graph output (a model with several outputs is refused with their
/// names). The labels are the graph input NAME when the model has one (its dtype and shape are
/// checked), else a new graph input NAME. Afterwards the graph's only output is the scalar
/// "loss" (float32 []), and labels, like every graph input, go straight to the stage that reads
/// them.

#include <optional>
#include <string>

#include "compiler/ir/graph.h"

namespace stagecraft::passes {

struct LossOptions {
  std::string kind;  ///< "mse", "cross-entropy", or "" (the model's own output).
  std::string labels = "labels";
};

/// The model's own loss: its first scalar float32 output, if it has one.
std::optional<ir::ValueId> scalar_output(const ir::Graph& graph);

/// Appends the loss (or checks the model's own) and returns its value. Throws `Error(kUsage)`
/// for an unknown kind, `Error(kModel)` for a model whose outputs do not fit, `Error(kShape)`
/// for labels of the wrong dtype or shape, naming them and the numbers.
ir::ValueId append_loss(ir::Graph& graph, const LossOptions& options);

}  // namespace stagecraft::passes
