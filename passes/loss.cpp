#include "passes/loss.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "passes/attributes.h"
#include "runtime/format/error.h"

namespace stagecraft::passes {

namespace {

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
  n.name = g.fresh_node_name("loss/" + op);
  n.op_type = op;
  n.inputs = std::move(inputs);
  n.outputs = {output};
  n.attributes = std::move(attrs);
  g.add_node(std::move(n));
  return output;
}

// The labels input: the model's own input of that name (checked) or a new one. `loss` says
// which loss wants them, for the message.
ir::ValueId labels_input(ir::Graph& g, const std::string& name, DType dtype,
                         const std::vector<int64_t>& shape, const std::string& loss) {
  if (auto id = g.find_value(name)) {
    const ir::Value& v = g.value(*id);
    if (!v.is_graph_input)
      fail(ErrorKind::kModel,
           "--labels {}: the model has a value of that name, but it is not a graph input", name);
    if (v.dtype != dtype || v.shape != shape)
      fail(ErrorKind::kShape, "--labels {}: the model's input is {}[{}] but --loss {} needs {}[{}]",
           name, dtype_name(v.dtype), fmt::join(v.shape, ","), loss, dtype_name(dtype),
           fmt::join(shape, ","));
    return *id;
  }
  ir::ValueId id = new_value(g, name, dtype, shape);
  g.value(id).is_graph_input = true;
  g.inputs.push_back(id);
  return id;
}

// The model's graph input called `name`, or nullptr (absent, or not a graph input: labels_input
// refuses the latter).
const ir::Value* model_labels(const ir::Graph& g, const std::string& name) {
  std::optional<ir::ValueId> id = g.find_value(name);
  return id && g.value(*id).is_graph_input ? &g.value(*id) : nullptr;
}

std::vector<int64_t> without_axis(std::vector<int64_t> shape, int64_t axis) {
  shape.erase(shape.begin() + axis);
  return shape;
}

// `input` reshaped to `shape` by an ONNX Reshape whose shape operand is a new int64 constant.
ir::ValueId reshape(ir::Graph& g, ir::ValueId input, const std::string& name,
                    const std::vector<int64_t>& shape) {
  ir::ValueId dims =
      new_value(g, name + "/shape", DType::kInt64, {static_cast<int64_t>(shape.size())});
  g.value(dims).initializer = ir::WeightData::owned(
      std::string(reinterpret_cast<const char*>(shape.data()), shape.size() * sizeof(int64_t)));
  ir::ValueId out = new_value(g, name, g.value(input).dtype, shape);
  ir::Node n;
  n.name = g.fresh_node_name("loss/Reshape(" + name + ")");
  n.op_type = "Reshape";
  n.inputs = {input, dims};
  n.outputs = {out};
  g.add_node(std::move(n));
  return out;
}

// SoftmaxCrossEntropyLoss over the classes on axis k of y (ONNX takes them on axis 1 only):
// appended straight for k = 1; after flattening y to [rows, C] and the labels to [rows] for the
// last axis, so each position's scores stay contiguous for the kernel (a Transpose to axis 1
// would leave them strided by the sequence length); after a Transpose to axis 1 otherwise.
void cross_entropy(ir::Graph& g, ir::ValueId y, ir::ValueId labels, int64_t k, int64_t ignore_index,
                   ir::ValueId loss) {
  const std::vector<int64_t> shape = g.value(y).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  ir::ValueId scores = y, targets = labels;
  if (k == rank - 1 && rank > 2) {
    const std::vector<int64_t> label_shape = g.value(labels).shape;
    const int64_t rows = ir::checked_numel(label_shape, "the loss's labels");
    scores = reshape(g, y, "loss/scores", {rows, shape[k]});
    targets = reshape(g, labels, "loss/labels", {rows});
  } else if (k != 1) {
    std::vector<int64_t> perm{0, k}, moved;
    for (int64_t a = 1; a < rank; ++a)
      if (a != k) perm.push_back(a);
    for (int64_t a : perm) moved.push_back(shape[a]);
    scores = add(g, "Transpose", {y}, new_value(g, "loss/scores", DType::kFloat32, moved),
                 {ints_attribute("perm", perm)});
  }
  add(g, "SoftmaxCrossEntropyLoss", {scores, targets}, loss,
      {string_attribute("reduction", "mean"), int_attribute("ignore_index", ignore_index)});
}

}  // namespace

std::optional<ir::ValueId> scalar_output(const ir::Graph& g) {
  for (ir::ValueId v : g.outputs) {
    const ir::Value& out = g.value(v);
    if (out.dtype == DType::kFloat32 && out.shape_known && out.shape.empty()) return v;
  }
  return std::nullopt;
}

int64_t class_axis(const ir::Value& y, const ir::Value* labels, const LossOptions& o,
                   std::string& why) {
  const auto rank = static_cast<int64_t>(y.shape.size());
  if (o.axis) {
    const int64_t k = *o.axis < 0 ? *o.axis + rank : *o.axis;
    if (k < 1 || k >= rank)
      fail(ErrorKind::kUsage,
           "--loss-axis {}: the model's output '{}' is [{}]; its class axis is one of 1..{} or "
           "-{}..-1 (axis 0 is the batch)",
           *o.axis, y.name, fmt::join(y.shape, ","), rank - 1, rank - 1);
    why = "--loss-axis";
    return k;
  }
  if (rank == 2) {
    why = "scores [N, C]";
    return 1;
  }
  const int64_t last = rank - 1;
  if (!labels && rank >= 4) {
    // PyTorch's cross_entropy reads [N, C, d1, ...] (segmentation maps, volumes): see loss.h.
    why = "labels added by stagec: axis 1 of a rank-4+ output, as PyTorch's cross_entropy; "
          "--loss-axis -1 for classes on the last axis";
    return 1;
  }
  if (!labels) {
    // Why the last axis here: see the rule in loss.h.
    why = "labels added by stagec: the last axis of a rank-3 output, a language model's [B, T, "
          "V]; --loss-axis 1 for a sequence classifier's [N, C, L]";
    return last;
  }
  const std::vector<int64_t> by_last = without_axis(y.shape, last),
                             by_one = without_axis(y.shape, 1);
  const bool fits_last = labels->shape_known && labels->shape == by_last;
  const bool fits_one = labels->shape_known && labels->shape == by_one;
  if (fits_last != fits_one) {
    why = fmt::format("the labels' shape fits the {}", fits_last ? "last axis" : "axis 1");
    return fits_last ? last : 1;
  }
  fail(ErrorKind::kShape,
       "--loss cross-entropy: labels '{}' [{}] fit {} classes on the last axis of '{}' [{}] "
       "(labels [{}]) {} on axis 1 (labels [{}]); give --loss-axis {} or --loss-axis 1",
       labels->name, fmt::join(labels->shape, ","), fits_last ? "both" : "neither", y.name,
       fmt::join(y.shape, ","), fmt::join(by_last, ","), fits_last ? "and" : "nor",
       fmt::join(by_one, ","), last);
}

AppendedLoss append_loss(ir::Graph& g, const LossOptions& o) {
  if (o.kind != "" && o.kind != "mse" && o.kind != "cross-entropy")
    fail(ErrorKind::kUsage, "--loss '{}' is not a loss (valid: mse, cross-entropy)", o.kind);
  if (o.kind != "cross-entropy" && (o.axis || o.ignore_index))
    fail(ErrorKind::kUsage, "{} only for --loss cross-entropy ({})",
         o.axis && o.ignore_index ? "--loss-axis and --ignore-index are"
         : o.axis                 ? "--loss-axis is"
                                  : "--ignore-index is",
         o.kind.empty() ? "no --loss given" : "--loss " + o.kind + " given");
  std::vector<std::string> names;
  for (ir::ValueId v : g.outputs) names.push_back(g.value(v).name);
  if (o.kind.empty()) {
    if (std::optional<ir::ValueId> v = scalar_output(g)) {
      g.outputs = {*v};
      return {*v, fmt::format("loss: the model's scalar output '{}'", g.value(*v).name)};
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
  const bool labels_added = model_labels(g, o.labels) == nullptr;
  AppendedLoss out;
  if (o.kind == "mse") {
    g.value(y).is_graph_output = false;
    out.value = new_value(g, "loss", DType::kFloat32, {});
    ir::ValueId labels = labels_input(g, o.labels, DType::kFloat32, yv.shape, o.kind);
    ir::ValueId diff =
        add(g, "Sub", {y, labels}, new_value(g, "loss/diff", DType::kFloat32, yv.shape));
    ir::ValueId sq =
        add(g, "Mul", {diff, diff}, new_value(g, "loss/squared", DType::kFloat32, yv.shape));
    add(g, "ReduceMean", {sq}, out.value, {int_attribute("keepdims", 0)});
    out.summary = fmt::format(
        "loss: mse of '{}' float32[{}] against labels '{}' float32[{}] per microbatch{}", yv.name,
        fmt::join(yv.shape, ","), o.labels, fmt::join(yv.shape, ","),
        labels_added ? " (added)" : "");
  } else {
    if (yv.shape.size() < 2)
      fail(ErrorKind::kShape,
           "--loss cross-entropy: the model's output '{}' is [{}]; it needs scores with a batch "
           "axis and a class axis, e.g. [N, C] or [B, T, V]",
           yv.name, fmt::join(yv.shape, ","));
    std::string why;
    const int64_t k = class_axis(yv, model_labels(g, o.labels), o, why);
    const std::vector<int64_t> label_shape = without_axis(yv.shape, k);
    g.value(y).is_graph_output = false;
    out.value = new_value(g, "loss", DType::kFloat32, {});
    ir::ValueId labels =
        labels_input(g, o.labels, DType::kInt64, label_shape,
                     fmt::format("cross-entropy with classes on axis {} ({})", k, why));
    const int64_t ignore = o.ignore_index.value_or(kDefaultIgnoreIndex);
    cross_entropy(g, y, labels, k, ignore, out.value);
    out.summary = fmt::format(
        "loss: cross-entropy over axis {} of '{}' float32[{}] ({} classes; {}), labels '{}' "
        "int64[{}] per microbatch{}, ignore index {}",
        k, yv.name, fmt::join(yv.shape, ","), yv.shape[k], why, o.labels,
        fmt::join(label_shape, ","), labels_added ? " (added)" : "", ignore);
  }
  g.value(out.value).is_graph_output = true;
  g.outputs = {out.value};
  return out;
}

}  // namespace stagecraft::passes
