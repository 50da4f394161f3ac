#pragma once
/// \file
/// Declarations of the pass classes listed in passes.def.

#include <cstddef>
#include <vector>

#include "passes/pass.h"

namespace stagecraft::passes {

#define STAGECRAFT_PASS(cli_name, class_name, description)                   \
  class class_name final : public Pass {                                     \
   public:                                                                   \
    std::string_view name() const override { return cli_name; }              \
    bool run(ir::Graph& graph, PassContext& context) const override;         \
  };
#include "passes/passes.def"
#undef STAGECRAFT_PASS

/// Whether the `mixed-precision` pass keeps `node` in float32 whatever its schema allows (Casts
/// around it): ops of another domain but the fused ones below, BatchNormalization (float32
/// running statistics), the loss (nodes named "loss/...") and any node writing a graph output.
bool needs_float32(const ir::Graph& graph, const ir::Node& node);

/// The operands of one of our fused ops (domain ai.stagecraft) that the `mixed-precision` pass
/// gives the 16-bit type, by position; its other float operands stay float32.
struct SixteenBitOperands {
  std::vector<size_t> inputs, outputs;
  bool input(size_t k) const;
  bool output(size_t k) const;
};

/// For a fused op that computes on 16-bit activations (Attention: Q, K, V and O, its additive
/// mask and per-query log-sum-exp float32; Gelu: X and Y; the mixed-precision pass's 16-bit Conv
/// of our domain: X, W, B and Y; its SoftmaxCrossEntropyLoss of our domain: the scores), which
/// operands; null for every other node (those go by their
/// ONNX schema or stay float32).
const SixteenBitOperands* fused_sixteen_bit(const ir::Node& node);

/// Whether `node` is (or the mixed-precision pass makes it) a SoftmaxCrossEntropyLoss that reads
/// its scores in 16 bits: our domain's, or the standard op (opset 13 on) whose scores a node
/// running in 16 bits makes (not needs_float32: a language model's head). The pass turns such a
/// standard node into ours (fused_sixteen_bit: scores 16-bit; class weights, loss and
/// log-probabilities float32) when the scores are 16-bit by then; the planner's memory model
/// keeps its scores in 16 bits for the backward, as the runtime does.
bool reads_sixteen_bit_scores(const ir::Graph& graph, const ir::Node& node);

/// fused_sixteen_bit's operands, and those of the standard ops whose schema gives their
/// activations a type constraint of their own: BatchNormalization from opset 15 (X and Y; Scale,
/// B and the statistics stay float32). Null for every other node.
const SixteenBitOperands* sixteen_bit_operands(const ir::Graph& graph, const ir::Node& node);

}  // namespace stagecraft::passes
