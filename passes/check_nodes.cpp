// Import-time checks of what ONNX's shape inference lets through but no kernel can run
// (pipeline.h: check_node_shapes). Every refusal is one line naming the node and the numbers.
#include <fmt/format.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "passes/host_tensor.h"
#include "passes/pipeline.h"
#include "runtime/core/backend.h"
#include "runtime/format/error.h"
#include "runtime/ops/conv_transpose_shape.h"
#include "runtime/ops/indexing_shape.h"
#include "runtime/ops/rearrange_shape.h"
#include "runtime/ops/rnn_core.h"

namespace stagecraft::passes {
namespace {

/// Constant integer inputs larger than this are not read here (they are not shape arithmetic;
/// the kernel checks them as it runs).
constexpr int64_t kMaxCheckedConstant = int64_t{1} << 20;

const ir::Value* input(const ir::Graph& graph, const ir::Node& node, std::size_t k) {
  if (k >= node.inputs.size() || node.inputs[k] == ir::kNoId) return nullptr;
  return &graph.value(node.inputs[k]);
}

const ir::Value* output(const ir::Graph& graph, const ir::Node& node, std::size_t k) {
  if (k >= node.outputs.size() || node.outputs[k] == ir::kNoId) return nullptr;
  return &graph.value(node.outputs[k]);
}

/// The values of a constant integer input, or nullopt when it is not constant, not an integer
/// tensor, or too large to be worth reading here.
std::optional<HostTensor> constant_ints(const ir::Value* v) {
  if (v == nullptr || !v->is_initializer() || !v->shape_known) return std::nullopt;
  if (v->dtype != DType::kInt64 && v->dtype != DType::kInt32) return std::nullopt;
  if (v->numel() > kMaxCheckedConstant) return std::nullopt;
  return HostTensor::from_value(*v);
}

/// Refuses `axis` outside [-rank, rank - 1 + extra] (`extra` is 1 where an axis may name the
/// end, as Flatten's and Unsqueeze's do through the output rank).
void check_axis(const ir::Graph& graph, const ir::Node& node, std::string_view what, int64_t axis,
                int64_t rank, const ir::Value& of, int64_t extra = 0) {
  if (axis >= -rank && axis < rank + extra) return;
  fail(ErrorKind::kModel, "{}: {} {} is out of range for {} of rank {} {}; it must be in [{}, {}]",
       node.describe(graph), what, axis, of.name.empty() ? "its input" : "'" + of.name + "'", rank,
       ir::shape_string(of.shape), -rank, rank - 1 + extra);
}

/// Conv: the group must divide the input channels and the filters, and W's channel dim times
/// the group must be the input's channels (oneDNN and cuDNN would refuse, or read past W).
void check_conv(const ir::Graph& graph, const ir::Node& node) {
  const ir::Value* x = input(graph, node, 0);
  const ir::Value* w = input(graph, node, 1);
  if (x == nullptr || w == nullptr || x->shape.size() < 3 || w->shape.size() != x->shape.size())
    return;  // ONNX's inference refuses ranks that do not match
  const int64_t group = node.attr_int("group", 1);
  const int64_t channels = x->shape[1];
  const int64_t filters = w->shape[0];
  if (group < 1 || channels % group != 0) {
    fail(ErrorKind::kModel,
         "{}: group {} does not divide the {} input channels of '{}' {}", node.describe(graph),
         group, channels, x->name, ir::shape_string(x->shape));
  }
  if (w->shape[1] * group != channels) {
    fail(ErrorKind::kModel,
         "{}: weight '{}' {} has {} channels per group; with group {} the input '{}' {} needs {}",
         node.describe(graph), w->name, ir::shape_string(w->shape), w->shape[1], group, x->name,
         ir::shape_string(x->shape), channels / group);
  }
  if (filters % group != 0) {
    fail(ErrorKind::kModel, "{}: group {} does not divide the {} filters of weight '{}' {}",
         node.describe(graph), group, filters, w->name, ir::shape_string(w->shape));
  }
  if (const ir::Value* b = input(graph, node, 2); b != nullptr && b->numel() != filters) {
    fail(ErrorKind::kModel, "{}: bias '{}' {} has {} elements for {} filters",
         node.describe(graph), b->name, ir::shape_string(b->shape), b->numel(), filters);
  }
}

/// Reshape (and the other views): the element count cannot change.
void check_same_count(const ir::Graph& graph, const ir::Node& node) {
  const ir::Value* in = input(graph, node, 0);
  const ir::Value* out = output(graph, node, 0);
  if (in == nullptr || out == nullptr || in->numel() == out->numel()) return;
  fail(ErrorKind::kModel, "{}: '{}' {} holds {} elements but its output '{}' {} holds {}",
       node.describe(graph), in->name, ir::shape_string(in->shape), in->numel(), out->name,
       ir::shape_string(out->shape), out->numel());
}

/// Gather: the axis in range, and constant indices inside the gathered dim.
void check_gather(const ir::Graph& graph, const ir::Node& node) {
  const ir::Value* data = input(graph, node, 0);
  if (data == nullptr) return;
  const auto rank = static_cast<int64_t>(data->shape.size());
  const int64_t axis = node.attr_int("axis", 0);
  check_axis(graph, node, "axis", axis, rank, *data);
  const int64_t dim = data->shape[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)];
  std::optional<HostTensor> indices = constant_ints(input(graph, node, 1));
  if (!indices) return;
  for (int64_t i = 0; i < indices->numel(); ++i) {
    const int64_t index = indices->int_at(i);
    if (index >= -dim && index < dim) continue;
    fail(ErrorKind::kModel,
         "{}: index {} (entry {} of '{}') is out of range for axis {} of '{}' {}, of size {}; "
         "indices must be in [{}, {}]",
         node.describe(graph), index, i, graph.value(node.inputs[1]).name, axis, data->name,
         ir::shape_string(data->shape), dim, -dim, dim - 1);
  }
}

/// An `axis` attribute over input 0 (`extra` as in check_axis).
void check_axis_attribute(const ir::Graph& graph, const ir::Node& node, int64_t fallback,
                          int64_t extra = 0) {
  const ir::Value* data = input(graph, node, 0);
  if (data == nullptr) return;
  check_axis(graph, node, "axis", node.attr_int("axis", fallback),
             static_cast<int64_t>(data->shape.size()), *data, extra);
}

/// `axes` as an attribute or (newer opsets) a constant input `position`; each in range for
/// `rank` and listed once.
void check_axes(const ir::Graph& graph, const ir::Node& node, std::size_t position,
                const ir::Value& of, int64_t rank) {
  std::vector<int64_t> axes = node.attr_ints("axes");
  if (axes.empty()) {
    std::optional<HostTensor> given = constant_ints(input(graph, node, position));
    if (!given) return;
    for (int64_t i = 0; i < given->numel(); ++i) axes.push_back(given->int_at(i));
  }
  std::vector<int64_t> seen;
  for (int64_t axis : axes) {
    check_axis(graph, node, "axis", axis, rank, of);
    const int64_t normal = axis < 0 ? axis + rank : axis;
    if (std::find(seen.begin(), seen.end(), normal) != seen.end()) {
      fail(ErrorKind::kModel, "{}: axis {} is listed twice in axes", node.describe(graph), axis);
    }
    seen.push_back(normal);
  }
}

/// A read-only tensor over a constant input's bytes, for the kernels' own rules.
std::optional<rt::Tensor> constant_tensor(const ir::Value* v) {
  if (v == nullptr || !v->is_initializer() || !v->shape_known) return std::nullopt;
  if (v->numel() > kMaxCheckedConstant) return std::nullopt;
  const std::span<const std::byte> bytes = v->initializer->bytes();
  return rt::Tensor::view(v->dtype, v->shape, const_cast<std::byte*>(bytes.data()));
}

/// Tile, CumSum, GatherElements and ScatterND read their repeats, axis or indices as they run;
/// where those are constants (as exporters write them), the kernels' own rules
/// (runtime/ops/indexing_shape.h) run on them here, so a bad repeat, axis or index is refused at
/// import with the kernel's line.
void check_indexing(const ir::Graph& graph, const ir::Node& node) {
  const ir::Value* x = input(graph, node, 0);
  const std::optional<rt::Tensor> operand = constant_tensor(input(graph, node, 1));
  if (x == nullptr || !operand) return;
  onnx::NodeProto proto;
  for (const onnx::AttributeProto& a : node.attributes) *proto.add_attribute() = a;
  const rt::Attrs attrs(proto);
  thread_local const std::unique_ptr<rt::DeviceContext> device =
      rt::cpu_backend().make_device(0, 1);
  const rt::KernelArgs args{node.name, node.op_type, attrs, {}, {}, *device};
  if (node.op_type == "Tile") {
    rt::ops::tile_shape(args, x->shape, *operand);
  } else if (node.op_type == "CumSum") {
    rt::ops::scan_shape(args, x->shape, *operand);
  } else if (node.op_type == "GatherElements") {
    rt::ops::gather_elements_plan(args, x->shape, *operand);
  } else if (const ir::Value* updates = input(graph, node, 2); updates != nullptr) {
    rt::ops::scatter_plan(args, x->shape, *operand, updates->shape);
  }
}

/// DepthToSpace, SpaceToDepth and TopK: the kernels' rules (runtime/ops/rearrange_shape.h) on
/// X's shape, the attributes and a constant K, so a bad blocksize, mode, axis or K is refused at
/// import with the kernel's line; and the output ONNX's shape inference gave against the
/// kernels'.
void check_rearrange(const ir::Graph& graph, const ir::Node& node) {
  const ir::Value* x = input(graph, node, 0);
  if (x == nullptr || !x->shape_known) return;
  onnx::NodeProto proto;
  for (const onnx::AttributeProto& a : node.attributes) *proto.add_attribute() = a;
  const rt::Attrs attrs(proto);
  thread_local const std::unique_ptr<rt::DeviceContext> device =
      rt::cpu_backend().make_device(0, 1);
  const std::string name = node.name.empty() ? node.describe(graph) : node.name;
  const rt::KernelArgs args{name, node.op_type, attrs, {}, {}, *device};
  rt::Shape expected;
  if (node.op_type == "TopK") {
    const ir::Value* k = input(graph, node, 1);
    const std::optional<rt::Tensor> operand = constant_tensor(k);
    if (k != nullptr && !operand) return;
    const rt::ops::TopKShape s = rt::ops::topk_shape(args, x->shape, operand ? &*operand : nullptr);
    expected = rt::ops::topk_output_shape(x->shape, s);
  } else {
    const bool to_space = node.op_type == "DepthToSpace";
    const rt::ops::SpaceDepthShape s = rt::ops::space_depth_shape(args, x->shape, to_space);
    expected = to_space ? rt::ops::space_shape(s) : rt::ops::deep_shape(s);
  }
  const ir::Value* y = output(graph, node, 0);
  if (y != nullptr && y->shape_known && y->shape != expected) {
    fail(ErrorKind::kModel,
         "{}: ONNX's shape inference gives output '{}' the shape {}, the kernels compute {}",
         node.describe(graph), y->name, ir::shape_string(y->shape), ir::shape_string(expected));
  }
}

/// ConvTranspose: the kernels' geometry (runtime/ops/conv_transpose_shape.h) on the node's
/// shapes and attributes, the bias against its M filters, and the output ONNX's shape inference
/// gave against the one the kernels compute.
void check_conv_transpose(const ir::Graph& graph, const ir::Node& node) {
  const ir::Value* x = input(graph, node, 0);
  const ir::Value* w = input(graph, node, 1);
  if (x == nullptr || w == nullptr || !x->shape_known || !w->shape_known) return;
  onnx::NodeProto proto;
  for (const onnx::AttributeProto& a : node.attributes) *proto.add_attribute() = a;
  const rt::Attrs attrs(proto);
  thread_local const std::unique_ptr<rt::DeviceContext> device =
      rt::cpu_backend().make_device(0, 1);
  const std::string name = node.name.empty() ? node.describe(graph) : node.name;
  const rt::KernelArgs args{name, node.op_type, attrs, {}, {}, *device};
  const rt::ops::ConvTransposeGeometry g =
      rt::ops::conv_transpose_geometry(args, x->shape, w->shape);
  const int64_t filters = g.y[1];
  if (const ir::Value* b = input(graph, node, 2); b != nullptr && b->numel() != filters) {
    fail(ErrorKind::kModel, "{}: bias '{}' {} has {} elements for {} output channels",
         node.describe(graph), b->name, ir::shape_string(b->shape), b->numel(), filters);
  }
  const ir::Value* y = output(graph, node, 0);
  if (y != nullptr && y->shape_known && y->shape != g.y) {
    fail(ErrorKind::kModel,
         "{}: ONNX's shape inference gives output '{}' the shape {}, the kernels compute {}",
         node.describe(graph), y->name, ir::shape_string(y->shape), ir::shape_string(g.y));
  }
}

/// LSTM, GRU and RNN: the kernels' attributes and geometry (runtime/ops/rnn_core.h) on the
/// node's shapes, and constant sequence lengths against T.
void check_rnn(const ir::Graph& graph, const ir::Node& node) {
  onnx::NodeProto proto;
  for (const onnx::AttributeProto& a : node.attributes) *proto.add_attribute() = a;
  const rt::Attrs attrs(proto);
  if (std::string why = rt::ops::rnn_attribute_error(node.op_type, attrs); !why.empty())
    fail(ErrorKind::kUnsupported, "{}: {}", node.describe(graph), why);
  for (std::size_t k = 0; k < node.inputs.size(); ++k) {
    const ir::Value* v = input(graph, node, k);
    if (v != nullptr && !v->shape_known) return;
  }
  thread_local const std::unique_ptr<rt::DeviceContext> device =
      rt::cpu_backend().make_device(0, 1);
  const std::string name = node.name.empty() ? node.describe(graph) : node.name;
  const rt::KernelArgs args{name, node.op_type, attrs, {}, {}, *device};
  const rt::ops::RnnGeometry g = rt::ops::rnn_geometry(args, [&](std::size_t k) {
    const ir::Value* v = input(graph, node, k);
    return v == nullptr ? nullptr : &v->shape;
  });
  if (const ir::Value* lens = input(graph, node, 4);
      lens != nullptr && lens->is_initializer() && lens->numel() <= kMaxCheckedConstant) {
    if (const std::optional<HostTensor> t = HostTensor::from_value(*lens)) {
      std::vector<int64_t> values;
      for (int64_t i = 0; i < t->numel(); ++i) values.push_back(t->int_at(i));
      rt::ops::check_sequence_lens(args, g, values);
    }
  }
}

void check_node(const ir::Graph& graph, const ir::Node& node) {
  if (!node.domain.empty() && node.domain != "ai.onnx") return;
  const std::string& op = node.op_type;
  const ir::Value* in0 = input(graph, node, 0);
  const auto rank0 = in0 == nullptr ? int64_t{0} : static_cast<int64_t>(in0->shape.size());
  if (op == "Conv") {
    check_conv(graph, node);
  } else if (op == "ConvTranspose") {
    check_conv_transpose(graph, node);
  } else if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze") {
    if (op == "Flatten") check_axis_attribute(graph, node, 1, /*extra=*/1);
    if (op == "Squeeze" && in0 != nullptr) check_axes(graph, node, 1, *in0, rank0);
    if (op == "Unsqueeze") {
      if (const ir::Value* out = output(graph, node, 0))
        check_axes(graph, node, 1, *out, static_cast<int64_t>(out->shape.size()));
    }
    check_same_count(graph, node);
  } else if (op == "Gather") {
    check_gather(graph, node);
  } else if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") {
    check_axis_attribute(graph, node, graph.opset >= 13 ? -1 : 1);
  } else if (op == "Concat" || op == "Split") {
    check_axis_attribute(graph, node, 0);
  } else if (op == "LayerNormalization") {
    check_axis_attribute(graph, node, -1);
  } else if (op.starts_with("Reduce") && in0 != nullptr) {
    check_axes(graph, node, 1, *in0, rank0);
  } else if (op == "LSTM" || op == "GRU" || op == "RNN") {
    check_rnn(graph, node);
  } else if (op == "Tile" || op == "CumSum" || op == "GatherElements" || op == "ScatterND") {
    if (op == "GatherElements") check_axis_attribute(graph, node, 0);
    check_indexing(graph, node);
  } else if (op == "DepthToSpace" || op == "SpaceToDepth" || op == "TopK") {
    check_rearrange(graph, node);
  }
}

}  // namespace

void check_node_shapes(const ir::Graph& graph) {
  for (ir::NodeId id : graph.topological_order()) check_node(graph, graph.node(id));
}

}  // namespace stagecraft::passes
