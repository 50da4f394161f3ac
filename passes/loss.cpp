#include "passes/loss.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/format/error.h"

namespace stagecraft::passes {

namespace {

onnx::AttributeProto int_attr(const std::string& name, int64_t v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}

onnx::AttributeProto string_attr(const std::string& name, const std::string& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::STRING);
  a.set_s(v);
  return a;
}

ir::ValueId new_value(ir::Graph& g, const std::string& name, DType dtype,
                      std::vector<int64_t> shape) {
  if (g.find_value(name))
    fail(ErrorKind::kModel, "the model already has a value named '{}'; the loss needs that name",
         name);
  ir::Value v;
  v.name = name;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.shape_known = true;
  return g.add_value(std::move(v));
}

ir::ValueId add(ir::Graph& g, const std::string& op, std::vector<ir::ValueId> inputs,
                ir::ValueId output, std::vector<onnx::AttributeProto> attrs = {}) {
  ir::Node n;
  n.name = "loss/" + op;
  n.op_type = op;
  n.inputs = std::move(inputs);
  n.outputs = {output};
  n.attributes = std::move(attrs);
  g.add_node(std::move(n));
  return output;
}

// The labels input: the model's own input of that name (checked) or a new one.
ir::ValueId labels_input(ir::Graph& g, const std::string& name, DType dtype,
                         const std::vector<int64_t>& shape, const std::string& kind) {
  if (auto id = g.find_value(name)) {
    const ir::Value& v = g.value(*id);
    if (!v.is_graph_input)
      fail(ErrorKind::kModel,
           "--labels {}: the model has a value of that name, but it is not a graph input", name);
    if (v.dtype != dtype || v.shape != shape)
      fail(ErrorKind::kShape, "--labels {}: the model's input is {}[{}] but --loss {} needs {}[{}]",
           name, dtype_name(v.dtype), fmt::join(v.shape, ","), kind, dtype_name(dtype),
           fmt::join(shape, ","));
    return *id;
  }
  ir::ValueId id = new_value(g, name, dtype, shape);
  g.value(id).is_graph_input = true;
  g.inputs.push_back(id);
  return id;
}

}  // namespace

std::optional<ir::ValueId> scalar_output(const ir::Graph& g) {
  for (ir::ValueId v : g.outputs) {
    const ir::Value& out = g.value(v);
    if (out.dtype == DType::kFloat32 && out.shape_known && out.shape.empty()) return v;
  }
  return std::nullopt;
}

ir::ValueId append_loss(ir::Graph& g, const LossOptions& o) {
  if (o.kind != "" && o.kind != "mse" && o.kind != "cross-entropy")
    fail(ErrorKind::kUsage, "--loss '{}' is not a loss (valid: mse, cross-entropy)", o.kind);
  std::vector<std::string> names;
  for (ir::ValueId v : g.outputs) names.push_back(g.value(v).name);
  if (o.kind.empty()) {
    if (std::optional<ir::ValueId> v = scalar_output(g)) {
      g.outputs = {*v};
      return *v;
    }
    fail(ErrorKind::kModel,
         "training needs a loss: the model has no scalar float32 output (outputs: {}); give --loss "
         "mse|cross-entropy "
         "--labels NAME",
         fmt::join(names, ", "));
  }
  if (g.outputs.size() != 1)
    fail(ErrorKind::kModel, "--loss {} needs a model with one output; this one has {} ({})", o.kind,
         g.outputs.size(), fmt::join(names, ", "));
  const ir::ValueId y = g.outputs.front();
  const ir::Value yv = g.value(y);
  if (yv.dtype != DType::kFloat32)
    fail(ErrorKind::kModel, "--loss {}: the model's output '{}' is {}, not float32", o.kind,
         yv.name, dtype_name(yv.dtype));
  g.value(y).is_graph_output = false;
  ir::ValueId loss = new_value(g, "loss", DType::kFloat32, {});
  if (o.kind == "mse") {
    ir::ValueId labels = labels_input(g, o.labels, DType::kFloat32, yv.shape, o.kind);
    ir::ValueId diff =
        add(g, "Sub", {y, labels}, new_value(g, "loss/diff", DType::kFloat32, yv.shape));
    ir::ValueId sq =
        add(g, "Mul", {diff, diff}, new_value(g, "loss/squared", DType::kFloat32, yv.shape));
    add(g, "ReduceMean", {sq}, loss, {int_attr("keepdims", 0)});
  } else {
    if (yv.shape.size() < 2)
      fail(ErrorKind::kShape,
           "--loss cross-entropy: the model's output '{}' is [{}]; it needs scores [N, C, ...]",
           yv.name, fmt::join(yv.shape, ","));
    std::vector<int64_t> label_shape = yv.shape;
    label_shape.erase(label_shape.begin() + 1);
    ir::ValueId labels = labels_input(g, o.labels, DType::kInt64, label_shape, o.kind);
    add(g, "SoftmaxCrossEntropyLoss", {y, labels}, loss, {string_attr("reduction", "mean")});
  }
  g.value(loss).is_graph_output = true;
  g.outputs = {loss};
  return loss;
}

}  // namespace stagecraft::passes
