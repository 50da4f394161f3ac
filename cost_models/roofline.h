#pragma once
/// \file
/// Time of one op on one device. `OpCostModel` is the one interface the partitioner and the
/// simulator ask; the analytic roofline below is the first implementation, and measured
/// profiles (issue 4) plug in behind the same interface.
///
/// Conventions of the roofline model (all times in seconds, per node, at the graph's shapes):
///
/// - Forward = launch_overhead + max(flops / (peak * efficiency), bytes / memory_bandwidth).
///   MatMul/Gemm and Conv use the device's `efficiency` and, in mixed precision, its 16-bit
///   tensor peak; every other op uses the fp32 peak at full efficiency (they are memory-bound
///   at any realistic size, so their compute term is only a bound). Memory runs at the
///   datasheet bandwidth.
/// - Bytes are every input read and every output written (`forward_work`), except:
///   views (ops.def's kView: Reshape, Flatten, Squeeze, Unsqueeze, Identity) move nothing and cost the launch
///   alone; other layout ops (Gather, Slice, Split, Concat, Transpose, Expand) read what they
///   write (twice the output bytes, plus Gather's indices), not their whole input; shape ops
///   write only their output. In mixed precision (and fp16), floating-point tensors
///   (activations and the 16-bit weight copies) count half their fp32 bytes; integer tensors
///   stay as they are.
/// - 16-bit plans, kernel by kernel as the runtimes run them (`runs_16_bit`): the ops that move
///   bytes (layout, shape, Cast) and the 16-bit products (MatMul and its gradients on both
///   backends; Gemm's in bfloat16 on the CPU; float16 products on CUDA alone; the fused
///   Attention and Gelu, Conv, the element-wise arithmetic, the activations and
///   LayerNormalization on CUDA, at the fp32 peak but Conv's) run on 16-bit tensors, the
///   products at the 16-bit peak. Every other op runs widened: its float32 kernel
///   between casts (runtime/core/kernel.h `run_widened`), each floating input read at 2
///   bytes and written at 4, each output read at 4 and written at 2, on top of the float32
///   kernel's own traffic (2.5x its float bytes), one launch more per cast, at the fp32 peak.
/// - Backward of MatMul/Gemm/Conv: one product per differentiable input of the forward's size,
///   each costing what the forward costs (launch included). The product for a weight is
///   backward_weight (W, which zero-bubble schedules may defer); the one for an activation is
///   backward_input (B). So MatMul(activation, weight) has B = W = forward. A weight bias
///   adds one read of the output gradient to W.
/// - Backward of any other op: B = launch + max(2 * flops / peak, (forward bytes + output
///   bytes) / bandwidth), i.e. the gradient is read besides what the forward moved (Relu:
///   1.5x the forward bytes, Add 1.3x). When the op has weight inputs (LayerNorm scale,
///   bias add, embedding Gather) W = launch + output bytes / bandwidth, the reduction of the
///   output gradient; an op whose only differentiable inputs are weights (embedding Gather)
///   has its whole backward in W and B = 0. Views cost the launch alone.
/// - Differentiable inputs are floating-point inputs that are weights or non-initializer
///   values; graph inputs count as activations (the model sees one node, not which tensors
///   are stage inputs), which overstates only the first layer's B. An op with no
///   differentiable input, or no floating-point output (Equal, Shape), has no backward.

#include <string>

#include "compiler/ir/graph.h"
#include "cost_models/device_spec.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::cost {

/// Seconds one node takes, forward and backward.
struct OpTime {
  double forward_s = 0;
  double backward_s = 0;         ///< backward_input_s + backward_weight_s.
  double backward_input_s = 0;   ///< Gradients of the node's activation inputs (B).
  double backward_weight_s = 0;  ///< Gradients of the node's weights (W).
};

/// The time of one node on one device. Implementations are immutable after construction, so
/// one model may be asked from several threads.
class OpCostModel {
 public:
  virtual ~OpCostModel();
  /// The time of `node`, which belongs to `graph` and has static shapes.
  virtual OpTime op_time(const ir::Graph& graph, const ir::Node& node) const = 0;
  /// What the model is, for plans and messages: "roofline(h100, mixed)".
  virtual std::string name() const = 0;
};

/// The analytic roofline model of this file's conventions.
class RooflineCostModel final : public OpCostModel {
 public:
  /// Throws `Error(kUsage)` when `device` has a non-positive number (see `validate`).
  RooflineCostModel(DeviceSpec device, Precision precision);

  OpTime op_time(const ir::Graph& graph, const ir::Node& node) const override;
  std::string name() const override;

  const DeviceSpec& device() const { return device_; }
  Precision precision() const { return precision_; }

  /// Whether `node` of a 16-bit plan runs on 16-bit tensors on this device's backend (else
  /// widened: the header).
  bool runs_16_bit(const ir::Node& node) const;

 private:
  /// max(flops / (peak * efficiency), bytes / bandwidth), without the launch overhead; the
  /// 16-bit peak where `sixteen_bit` (a tensor op's 16-bit kernel).
  double roofline_seconds(double flops, double bytes, bool tensor_op, bool sixteen_bit) const;
  /// Bytes `value` moves for a node: as this precision stores it, or, where the node runs
  /// `widened`, its float32 bytes with the casts' traffic around them (2.5x).
  double stored_bytes(const ir::Graph& graph, ir::ValueId value, bool widened) const;
  DeviceSpec device_;
  Precision precision_;
};

}  // namespace stagecraft::cost
