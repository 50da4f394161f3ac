#include "cost_models/roofline.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string_view>

#include "compiler/ir/ops.h"
#include "cost_models/op_cost.h"
#include "runtime/format/error.h"

namespace stagecraft::cost {
namespace {

/// What a node's input contributes to its backward.
enum class InputRole { kNone, kActivation, kWeight };

InputRole input_role(const ir::Graph& graph, ir::ValueId id) {
  if (id == ir::kNoId) return InputRole::kNone;
  const ir::Value& value = graph.value(id);
  if (!is_floating(value.dtype)) return InputRole::kNone;
  if (value.is_weight) return InputRole::kWeight;
  if (value.is_initializer()) return InputRole::kNone;  // A constant: no gradient.
  // A graph input (the model's data): autodiff writes no gradient of it (the first layer's
  // backward is its weight gradient only).
  if (value.is_graph_input) return InputRole::kNone;
  return InputRole::kActivation;
}

}  // namespace

OpCostModel::~OpCostModel() = default;

RooflineCostModel::RooflineCostModel(DeviceSpec device, Precision precision)
    : device_(std::move(device)), precision_(precision) {
  validate(device_);
}

std::string RooflineCostModel::name() const {
  return fmt::format("roofline({}, {})", device_.name, to_string(precision_));
}

double RooflineCostModel::roofline_seconds(double flops, double bytes, bool tensor_op,
                                           bool sixteen_bit) const {
  double peak = tensor_op && sixteen_bit ? device_.peak_flops_fp16 : device_.peak_flops_fp32;
  double efficiency = tensor_op ? device_.efficiency : 1.0;
  return std::max(flops / (peak * efficiency), bytes / device_.memory_bandwidth);
}

double RooflineCostModel::stored_bytes(const ir::Graph& graph, ir::ValueId id,
                                       bool widened) const {
  if (id == ir::kNoId) return 0;
  const ir::Value& value = graph.value(id);
  double bytes = static_cast<double>(value.bytes());
  if (!is_16bit(precision_) || value.dtype != DType::kFloat32) return bytes;
  return widened ? 2.5 * bytes : bytes / 2;
}

bool RooflineCostModel::runs_16_bit(const ir::Node& node) const {
  const OpInfo* info = op_info(node.op_type);
  if (info->family == OpFamily::kData || info->family == OpFamily::kShape ||
      node.op_type == "Cast")
    return true;
  const bool gpu = device_.kind == DeviceKind::kGpu, bf16 = precision_ == Precision::kMixed;
  if (node.op_type == "MatMul") return gpu || bf16;  // the CPU widens float16
  // The fused Attention and Gelu read and write 16-bit activations natively on CUDA
  // (runtime/cuda/attention.cpp, activations.cpp); the CPU widens them.
  if (node.domain == "ai.stagecraft" && (node.op_type == "Attention" || node.op_type == "Gelu"))
    return gpu;
  // cuDNN runs 16-bit convolutions natively (runtime/cuda/conv_cudnn.cpp): float16 as opset 17
  // has it, bfloat16 as the mixed pass's Conv of our domain. The CPU widens both.
  if (node.op_type == "Conv") return gpu;
  if (node.op_type == "Gemm") return !gpu && bf16;   // oneDNN bf16; CUDA's Gemm is float32
  // CUDA's element-wise arithmetic, activations and norms (forward and gradient; a mixed plan's
  // BatchNormalization from opset 15, whose X and Y alone are 16-bit)
  // read and write 16-bit floats natively (runtime/cuda: same_as_cpu_16bit and the 16-bit
  // checks; tests/gpu/cuda_widened_test.cpp holds this list to the backend's); the CPU widens.
  static constexpr std::string_view kCuda16Bit[] = {"Add",
                                                    "Sub",
                                                    "Mul",
                                                    "Div",
                                                    "Relu",
                                                    "Sigmoid",
                                                    "Tanh",
                                                    "Sqrt",
                                                    "Erf",
                                                    "HardSigmoid",
                                                    "HardSwish",
                                                    "Elu",
                                                    "Selu",
                                                    "Softplus",
                                                    "LeakyRelu",
                                                    "Exp",
                                                    "Log",
                                                    "Reciprocal",
                                                    "Neg",
                                                    "Abs",
                                                    "Ceil",
                                                    "Floor",
                                                    "Sin",
                                                    "Cos",
                                                    "Sign",
                                                    "Round",
                                                    "LayerNormalization",
                                                    "BatchNormalization"};
  if (gpu && node.domain.empty())
    return std::find(std::begin(kCuda16Bit), std::end(kCuda16Bit), node.op_type) !=
           std::end(kCuda16Bit);
  return false;
}

OpTime RooflineCostModel::op_time(const ir::Graph& graph, const ir::Node& node) const {
  const OpInfo* info = op_info(node.op_type);
  if (info == nullptr || !info->supported)
    fail(ErrorKind::kUnsupported, "{}: no cost model for this op", node.describe(graph));
  const OpFamily family = info->family;
  const bool tensor_op = family == OpFamily::kMatMul || family == OpFamily::kConv;
  const bool view = info->view();
  const OpWork work = forward_work(graph, node);
  const bool sixteen_bit = is_16bit(precision_) && runs_16_bit(node);
  const bool widened = is_16bit(precision_) && !sixteen_bit;
  // A widened kernel launches a cast more per floating input and output.
  int casts = 0;
  auto stored = [&](ir::ValueId id) {
    if (widened && id != ir::kNoId && graph.value(id).dtype == DType::kFloat32) ++casts;
    return stored_bytes(graph, id, widened);
  };

  double written = 0;
  bool float_output = false;
  for (ir::ValueId out : node.outputs) {
    written += stored(out);
    float_output = float_output || (out != ir::kNoId && is_floating(graph.value(out).dtype));
  }
  double bytes = 0;
  if (family == OpFamily::kShape) {
    bytes = written;
  } else if (family == OpFamily::kData) {
    bytes = view ? 0 : 2 * written;
    if (node.op_type == "Gather" && node.inputs.size() > 1)
      bytes += stored(node.inputs[1]);
  } else {
    for (ir::ValueId in : node.inputs) bytes += stored(in);
    bytes += written;
  }
  const double launch = device_.launch_overhead_s * (1 + casts);

  OpTime time;
  time.forward_s =
      launch + (view ? 0.0 : roofline_seconds(work.flops, bytes, tensor_op, sixteen_bit));
  if (!float_output) return time;

  if (tensor_op) {
    // One product per differentiable operand (A and B of MatMul/Gemm, X and W of Conv), each
    // as costly as the forward; a bias gradient is a reduction of the output gradient.
    for (std::size_t i = 0; i < std::min<std::size_t>(node.inputs.size(), 2); ++i) {
      InputRole role = input_role(graph, node.inputs[i]);
      if (role == InputRole::kActivation) time.backward_input_s += time.forward_s;
      if (role == InputRole::kWeight) time.backward_weight_s += time.forward_s;
    }
    if (node.inputs.size() > 2 && input_role(graph, node.inputs[2]) == InputRole::kWeight) {
      if (time.backward_weight_s == 0) time.backward_weight_s = launch;
      time.backward_weight_s += written / device_.memory_bandwidth;
    }
    // A fused Attention whose mask takes a gradient (mask_gradient: a learned position bias)
    // computes each tile's scores and dP once more for it: about one forward.
    if (node.op_type == "Attention" && node.attr_int("mask_gradient", 0) != 0 &&
        node.inputs.size() > 3) {
      const InputRole mask = input_role(graph, node.inputs[3]);
      if (mask == InputRole::kActivation) time.backward_input_s += time.forward_s;
      if (mask == InputRole::kWeight) time.backward_weight_s += time.forward_s;
    }
  } else {
    bool has_activation = false, has_weight = false;
    for (ir::ValueId in : node.inputs) {
      InputRole role = input_role(graph, in);
      has_activation = has_activation || role == InputRole::kActivation;
      has_weight = has_weight || role == InputRole::kWeight;
    }
    double gradient =
        launch + (view ? 0.0 : roofline_seconds(2 * work.flops, bytes + written, false, false));
    if (has_activation) {
      time.backward_input_s = gradient;
      if (has_weight)
        time.backward_weight_s = launch + (view ? 0.0 : written / device_.memory_bandwidth);
    } else if (has_weight) {
      time.backward_weight_s = gradient;
    }
  }
  time.backward_s = time.backward_input_s + time.backward_weight_s;
  return time;
}

}  // namespace stagecraft::cost
