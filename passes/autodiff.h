#pragma once
/// \file
/// Reverse-mode autodiff for one pipeline stage: from the stage's forward nodes, writes the
/// stage's backward program as an ONNX model of gradient ops (the contract is
/// runtime/format/grad_ops.h).
///
/// The backward model:
///
/// - Opset imports: the forward graph's (the default domain at `graph.opset`) plus
///   `ai.stagecraft` version 1.
/// - Inputs, in this order: "loss@grad" (float32 scalar []) when `spec.loss` is set; "V@grad" for
///   each of `spec.output_grads` (always listed, even when no gradient node reads one); then every
///   forward value a gradient node reads, by its forward name, in first-use order: the stage's
///   inputs, its intermediates and outputs (the runtime keeps them from the forward run of the
///   same microbatch) and its weights (initializers marked `is_weight`, bound by name from the
///   forward program, never copied into the backward model).
/// - Initializers: only the forward non-weight constants (folded shapes, indices, masks) a
///   gradient node reads, embedded.
/// - Outputs: "W@grad" for each value of `spec.wanted` that gets a gradient, in `wanted` order.
///   A wanted value the stage's nodes read but from which no differentiable path reaches a seed
///   (nothing downstream of it is seeded, or it is read only as a shape, index or condition) gets
///   no output; it is listed in `*no_gradient` and the runtime treats its gradient as zero.
/// - Nodes: for each forward node on a path from a wanted value to a seed, in reverse execution
///   order, one `<Op>Grad` node named "<forward node>@grad" (activation gradients) and/or one
///   named "<forward node>@grad_w" carrying `weight_gradients = 1` (gradients that lead only to
///   weights, not to any wanted activation). A value read by several nodes (or twice by one) gets
///   its partial gradients "V@grad.0", "V@grad.1", ... summed by ONNX `Add` nodes into "V@grad".
///   The W part never feeds the B part: a W node's results are read only by W nodes and by Adds
///   that sum W results (plus, for a stage output also read inside the stage, its incoming
///   "V@grad" input), so the W part can run later (zero-bubble schedules).
///   Inputs of the forward node that need no gradient get "" outputs; outputs that receive no
///   gradient get "" dy inputs. One exception: an `Add` input of the output's shape and dtype
///   that is not wanted takes the Add's dy itself as its partial (its gradient is dy), with no
///   node for it (a residual Add then has no AddGrad at all).
/// - Every tensor (inputs, intermediates, outputs) has a typed entry with its static shape; a
///   gradient has its value's dtype and shape.
///
/// The output is deterministic: it depends only on the graph and the spec.

#include <onnx/onnx_pb.h>

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "compiler/ir/graph.h"

namespace stagecraft::passes {

/// What one stage's backward program must compute.
struct BackwardSpec {
  /// The stage's forward nodes, in execution order (every in-stage producer before its readers).
  std::vector<ir::NodeId> nodes;
  /// Stage outputs whose gradients arrive from later stages (backward inputs "V@grad"). When a
  /// value is read by several later stages, the runtime sums their gradients into one "V@grad".
  std::vector<ir::ValueId> output_grads;
  /// The scalar loss (float32, shape []) when this stage computes it (backward input "loss@grad").
  std::optional<ir::ValueId> loss;
  /// Values whose gradients the stage outputs: the float stage inputs that come from other
  /// stages, and the stage's trainable weights (`trainable_weights`).
  std::vector<ir::ValueId> wanted;
};

/// False for ops whose outputs carry no gradient (ops.def's kNoGradient: Shape, ConstantOfShape,
/// Range, Equal, Constant) and for ops stagecraft does not know; true for the other supported ops.
bool has_gradient(std::string_view op_type);

/// Whether input `index` of an `op_type` node is differentiable, by position (dtypes aside), as
/// ops.def's Differentiable column says: BatchNormalization: X, scale, B (not input_mean,
/// input_var); Clip, Dropout: the data only; Reshape, Expand, Slice, Squeeze, Unsqueeze, Split,
/// ReduceMean: the first input only (not shapes, axes, starts, splits); Gather: data only; Where:
/// X and Y (not the condition); SoftmaxCrossEntropyLoss: scores only (not labels, weights); every
/// input of the other ops with a gradient (Pow: base and exponent). False for every input of an
/// op without a gradient.
bool differentiable_input(std::string_view op_type, std::size_t index);

/// `differentiable_input` for input `index` of `node`, where one node's attribute decides: a
/// fused Attention's mask (input 3) is differentiable where the node has mask_gradient = 1
/// (passes/fuse_attention.cpp: a learned position bias), else not.
bool differentiable_at(const ir::Node& node, std::size_t index);

/// Input `k` of `node` lies on a gradient path: a floating-point value at a differentiable
/// position (`differentiable_at`); every float input of an op stagecraft does not know, so
/// that a path through it is reported rather than dropped.
bool on_gradient_path(const ir::Graph& graph, const ir::Node& node, std::size_t k);

/// Per value of `graph`: whether a gradient path (`on_gradient_path`, through nodes whose
/// outputs carry one) leads from it to `loss`, over the whole graph (`order`: its live nodes in
/// a topological order).
std::vector<char> reaches_loss(const ir::Graph& graph, ir::ValueId loss,
                               const std::vector<ir::NodeId>& order);

/// Whether `node`'s backward gives input `k` a gradient towards the loss: input k lies on a
/// gradient path and one of the node's float outputs reaches the loss (`reaches`, from
/// `reaches_loss`). A stage output gets a gradient back from a later stage exactly when one of
/// that stage's nodes passes it one; the attention mask an Attention node reads, say, does not.
bool passes_gradient(const ir::Graph& graph, const ir::Node& node, std::size_t k,
                     const std::vector<char>& reaches);

/// Why PyTorch would not train the float32 initializer `v` ("" when it would): non-finite
/// values (checked for initializers of at most 2^20 elements: masks, not the big weights whose
/// bytes planning leaves unread), or a mask's use: with a negative entry (where scanned), of
/// rank 2 or more, read only as an operand of
/// Adds whose sums feed a Softmax and whose other operand is not a product with a weight (a
/// vector, or a tensor added to x W, is a Linear's bias: a router's, trained). Such tensors are
/// buffers or exporter constants in PyTorch (a causal mask registered with register_buffer), never
/// trained there; trained here, a -inf entry becomes NaN after one step. The planner freezes them
/// (stagec --train-also trains them).
std::string untrainable_reason(const ir::Graph& graph, const ir::Value& v);

/// The stage's trainable weights: the float32 initializers marked `is_weight` that a node of
/// `nodes` (default domain, with a gradient) reads at a differentiable position, in first-read
/// order, each once.
std::vector<ir::ValueId> trainable_weights(const ir::Graph& graph,
                                           const std::vector<ir::NodeId>& nodes);

/// Whether a training backward reads the bytes of `v`, a node's output: the gradient of the node
/// that writes it, or of a node that reads it, reads them by the gradient-op contract's table
/// (runtime/format/grad_reads.h). The runtime keeps exactly such values from a microbatch's
/// forward until its backward (the others are gone after the forward), so the planner counts
/// only these as activations. Counted whether or not the node lies on a gradient path (a bound).
bool backward_reads_bytes(const ir::Graph& graph, ir::ValueId v);

/// The backward program of the stage described by `spec` (see the file comment). Wanted values
/// that get no gradient are appended to `*no_gradient` when it is given.
///
/// Throws `Error(kInternal)` for an inconsistent spec (a node listed twice or out of execution
/// order; a seed or wanted value that is not floating point; a wanted value no stage node
/// reads; a value listed twice or both seeded and wanted; a loss that is not a float32 scalar),
/// `Error(kShape)` for a value without a static shape, `Error(kUnsupported)` when a node on a
/// gradient path has no gradient op, and `Error(kModel)` when a forward value is already called
/// like a gradient.
onnx::ModelProto build_backward(const ir::Graph& graph, const BackwardSpec& spec,
                                std::vector<ir::ValueId>* no_gradient = nullptr);

/// Training: gives every Dropout that may run in training mode (its training_mode input present
/// and not a constant false) its mask output (bool, the output's shape, named "<output>.mask")
/// where the file omits it, so that its gradient reads the very mask the forward drew. Returns
/// how many it gave one.
int keep_dropout_masks(ir::Graph& graph);

}  // namespace stagecraft::passes
