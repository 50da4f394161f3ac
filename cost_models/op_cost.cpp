#include "cost_models/op_cost.h"

#include "compiler/ir/ops.h"
#include "runtime/format/error.h"

namespace stagecraft::cost {
namespace {

double numel(const ir::Graph& g, ir::ValueId v) {
  return v == ir::kNoId ? 0.0 : static_cast<double>(g.value(v).numel());
}

const std::vector<int64_t>& shape(const ir::Graph& g, ir::ValueId v) { return g.value(v).shape; }

/// FLOPs per output element of the element-wise ops: transcendental ones cost more than one
/// arithmetic operation, but counting conventions (fvcore, DeepSpeed's profiler) use small
/// constants; these follow them.
double elementwise_flops_per_element(const std::string& op) {
  if (op == "Erf" || op == "Tanh" || op == "Sigmoid" || op == "Pow" || op == "Sqrt") return 4;
  if (op == "HardSigmoid" || op == "HardSwish" || op == "Clip") return 3;
  if (op == "Cast" || op == "Dropout" || op == "Where") return 0;
  return 1;
}

double pool_window(const ir::Node& node) {
  double w = 1;
  for (int64_t k : node.attr_ints("kernel_shape")) w *= static_cast<double>(k);
  return w;
}

}  // namespace

OpWork forward_work(const ir::Graph& g, const ir::Node& node) {
  OpWork w;
  for (ir::ValueId in : node.inputs) {
    if (in != ir::kNoId) w.bytes_read += static_cast<double>(g.value(in).bytes());
  }
  for (ir::ValueId out : node.outputs) {
    if (out != ir::kNoId) w.bytes_written += static_cast<double>(g.value(out).bytes());
  }
  const std::string& op = node.op_type;
  double out0 = node.outputs.empty() ? 0.0 : numel(g, node.outputs[0]);
  auto family = op_family(op);
  if (!family) return w;
  switch (*family) {
    case OpFamily::kMatMul: {
      // Output [..., M, N]; the shared dim K is A's last dim (or its first, transposed in Gemm).
      const auto& a = shape(g, node.inputs[0]);
      double k = a.empty() ? 1.0 : static_cast<double>(a.back());
      if (op == "Gemm" && node.attr_int("transA", 0) != 0 && a.size() == 2) k = static_cast<double>(a[0]);
      w.flops = 2.0 * out0 * k;
      if (op == "Gemm" && node.inputs.size() > 2 && node.inputs[2] != ir::kNoId) w.flops += out0;
      break;
    }
    case OpFamily::kConv: {
      // Each output element is a dot product over (C_in / group) * kernel window.
      const auto& weight = shape(g, node.inputs[1]);
      double per_output = 1;
      for (std::size_t i = 1; i < weight.size(); ++i) per_output *= static_cast<double>(weight[i]);
      w.flops = 2.0 * out0 * per_output;
      if (node.inputs.size() > 2 && node.inputs[2] != ir::kNoId) w.flops += out0;
      break;
    }
    case OpFamily::kNorm:
      // BatchNorm at inference is a scale and a shift; LayerNorm computes mean and variance,
      // normalises, scales and shifts (about 8 per element).
      w.flops = (op == "BatchNormalization" ? 2.0 : 8.0) * out0;
      break;
    case OpFamily::kPool:
      w.flops = op == "GlobalAveragePool" ? numel(g, node.inputs[0]) : out0 * pool_window(node);
      break;
    case OpFamily::kReduce:
      // Softmax: max, subtract, exp, sum, divide. ReduceMean: one add per input element.
      w.flops = op == "Softmax" ? 5.0 * out0 : numel(g, node.inputs[0]);
      break;
    case OpFamily::kElementwise:
      w.flops = elementwise_flops_per_element(op) * out0;
      break;
    case OpFamily::kData:
    case OpFamily::kShape:
      break;
  }
  return w;
}

}  // namespace stagecraft::cost
