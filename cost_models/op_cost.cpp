#include "cost_models/op_cost.h"

#include <algorithm>

#include "compiler/ir/ops.h"
#include "runtime/format/error.h"

namespace stagecraft::cost {
namespace {

double numel(const ir::Graph& g, ir::ValueId v) {
  return v == ir::kNoId ? 0.0 : static_cast<double>(g.value(v).numel());
}

const std::vector<int64_t>& shape(const ir::Graph& g, ir::ValueId v) { return g.value(v).shape; }

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
  const OpInfo* info = op_info(node.op_type);
  if (info == nullptr || !info->supported) return w;
  double out0 = node.outputs.empty() ? 0.0 : numel(g, node.outputs[0]);
  const bool bias = node.inputs.size() > 2 && node.inputs[2] != ir::kNoId;
  switch (info->flops.kind) {
    case FlopKind::kMatMul: {
      // Output [..., M, N]; the shared dim K is A's last dim (or its first, transposed in Gemm).
      const auto& a = shape(g, node.inputs[0]);
      double k = a.empty() ? 1.0 : static_cast<double>(a.back());
      if (node.attr_int("transA", 0) != 0 && a.size() == 2) k = static_cast<double>(a[0]);
      w.flops = 2.0 * out0 * k;
      if (bias) w.flops += out0;
      break;
    }
    case FlopKind::kConv: {
      // Each output element is a dot product over (C_in / group) * kernel window.
      const auto& weight = shape(g, node.inputs[1]);
      double per_output = 1;
      for (std::size_t i = 1; i < weight.size(); ++i) per_output *= static_cast<double>(weight[i]);
      w.flops = 2.0 * out0 * per_output;
      if (bias) w.flops += out0;
      break;
    }
    case FlopKind::kConvTranspose: {
      // Each input element is multiplied into W's row of (C_out / group) * kernel window values
      // (W is [C_in, C_out / group, kernel...]) and added where it lands.
      const auto& weight = shape(g, node.inputs[1]);
      double per_input = 1;
      for (std::size_t i = 1; i < weight.size(); ++i) per_input *= static_cast<double>(weight[i]);
      w.flops = 2.0 * numel(g, node.inputs[0]) * per_input;
      if (bias) w.flops += out0;
      break;
    }
    case FlopKind::kRecurrent: {
      // W is [D, G * H, I], R [D, G * H, H], X [T, B, I]: per step and direction the products
      // X_t W^T and H_{t-1} R^T, then about 8 element operations per gate output (activations,
      // biases, the cell or hidden update).
      const auto& x = shape(g, node.inputs[0]);
      const auto& r = shape(g, node.inputs[2]);
      if (x.size() == 3 && r.size() == 3) {
        const double steps = static_cast<double>(x[0]) * static_cast<double>(x[1]);
        const double rows = static_cast<double>(r[0]) * static_cast<double>(r[1]);
        const double k = static_cast<double>(x[2]) + static_cast<double>(r[2]);
        w.flops = 2.0 * steps * rows * k + 8.0 * steps * rows;
      }
      break;
    }
    case FlopKind::kAttention: {
      // Q [..., Tq, d] K [..., Tk, d] V [..., Tk, dv]: the scores Q K^T and the product P V, 2
      // per multiply-add, plus about 5 per score for the scale, mask and softmax; a causal
      // block computes the scores on or below the diagonal only.
      const auto& q = shape(g, node.inputs[0]);
      const auto& k = shape(g, node.inputs[1]);
      const auto& v = shape(g, node.inputs[2]);
      if (q.size() >= 2 && k.size() == q.size() && v.size() == q.size()) {
        const double tk = static_cast<double>(k[k.size() - 2]);
        double scores = numel(g, node.inputs[0]) / static_cast<double>(q.back()) * tk;
        if (node.attr_int("causal", 0) != 0) {
          const double tq = static_cast<double>(q[q.size() - 2]);
          scores *= std::min(1.0, (tq + 1) / (2 * tk));
        }
        w.flops = scores * (2.0 * static_cast<double>(q.back() + v.back()) + 5.0);
      }
      break;
    }
    case FlopKind::kPool:
      w.flops = out0 * pool_window(node);
      break;
    case FlopKind::kPerOutput:
      // Transcendental ops cost more than one arithmetic operation, but counting conventions
      // (fvcore, DeepSpeed's profiler) use small constants; ops.def follows them.
      w.flops = info->flops.per_element * out0;
      break;
    case FlopKind::kPerInput:
      w.flops = info->flops.per_element * numel(g, node.inputs[0]);
      break;
    case FlopKind::kNone:
      break;
  }
  return w;
}

}  // namespace stagecraft::cost
