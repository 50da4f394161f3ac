#include "compiler/import_opset.h"

#include <onnx/defs/schema.h>
#include <onnx/defs/tensor_proto_util.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "compiler/ir/ops.h"
#include "runtime/format/error.h"

namespace stagecraft {
namespace {

/// ONNX 1.12's IR version, the newest its checker reads.
constexpr int64_t kIrVersion = 8;

bool default_domain(const onnx::NodeProto& n) {
  return n.domain().empty() || n.domain() == "ai.onnx";
}

const onnx::AttributeProto* find_attr(const onnx::NodeProto& n, std::string_view name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

void drop_attr(onnx::NodeProto& n, std::string_view name) {
  auto* attrs = n.mutable_attribute();
  for (int i = attrs->size() - 1; i >= 0; --i)
    if (attrs->Get(i).name() == name) attrs->DeleteSubrange(i, 1);
}

bool is_reduce_with_axes_input(std::string_view op) {
  static constexpr std::string_view kOps[] = {"ReduceL1",        "ReduceL2",   "ReduceLogSum",
                                              "ReduceLogSumExp", "ReduceMax",  "ReduceMean",
                                              "ReduceMin",       "ReduceProd", "ReduceSumSquare"};
  return std::find(std::begin(kOps), std::end(kOps), op) != std::end(kOps);
}

class Lowering {
 public:
  Lowering(onnx::ModelProto& model, int64_t opset) : model_(model), opset_(opset) {
    for (const auto& t : model.graph().initializer()) constants_[t.name()] = &t;
    for (const auto& n : model.graph().node())
      if (n.op_type() == "Constant" && default_domain(n) && n.output_size() == 1)
        constant_nodes_[n.output(0)] = &n;
  }

  int64_t run() {
    google::protobuf::RepeatedPtrField<onnx::NodeProto> out;
    int64_t rewritten = 0;
    const auto& nodes = model_.graph().node();
    for (int k = 0; k < nodes.size(); ++k) {
      onnx::NodeProto n = nodes.Get(k);
      label_ = ir::node_name_or_default(n, k);
      if (!default_domain(n)) {
        *out.Add() = std::move(n);
        continue;
      }
      const std::string op = n.op_type();
      if (op == "Gelu") {
        gelu(n, out);
        ++rewritten;
        continue;
      }
      if (op == "Mish") {
        mish(n, out);
        ++rewritten;
        continue;
      }
      if (op == "GroupNormalization") {
        group_norm(n, out);
        ++rewritten;
        continue;
      }
      if (onnx::OpSchemaRegistry::Schema(op, kMaxOpset, "") == nullptr)
        check_supported_op(op, n.domain(), label_, opset_);  // throws: not an op opset 17 has
      if (lower_node(n)) ++rewritten;
      *out.Add() = std::move(n);
    }
    model_.mutable_graph()->mutable_node()->Swap(&out);
    for (auto& t : extra_) *model_.mutable_graph()->add_initializer() = std::move(t);
    for (auto& imp : *model_.mutable_opset_import())
      if (imp.domain().empty() || imp.domain() == "ai.onnx") imp.set_version(kMaxOpset);
    if (model_.ir_version() > kIrVersion) model_.set_ir_version(kIrVersion);
    return rewritten;
  }

 private:
  [[noreturn]] void refuse(std::string_view op, const std::string& why) const {
    fail(ErrorKind::kUnsupported, "node '{}' ({}, opset {}): {}; stagecraft reads opset {} as {}",
         label_, op, opset_, why, opset_, kMaxOpset);
  }

  /// The int64 values of `name` where it is an initializer or a Constant node's output.
  std::optional<std::vector<int64_t>> constant_ints(const std::string& name) const {
    const onnx::TensorProto* t = nullptr;
    if (auto it = constants_.find(name); it != constants_.end()) t = it->second;
    if (auto it = constant_nodes_.find(name); t == nullptr && it != constant_nodes_.end()) {
      if (const auto* v = find_attr(*it->second, "value"); v && v->has_t()) t = &v->t();
      if (const auto* v = find_attr(*it->second, "value_ints"))
        return std::vector<int64_t>(v->ints().begin(), v->ints().end());
    }
    if (t == nullptr || t->data_type() != onnx::TensorProto::INT64 ||
        t->data_location() == onnx::TensorProto::EXTERNAL)
      return std::nullopt;
    return onnx::ParseData<int64_t>(t);
  }

  /// Rewrites `n` in place into its opset-17 form; whether anything changed.
  bool lower_node(onnx::NodeProto& n) const {
    const std::string& op = n.op_type();
    if (is_reduce_with_axes_input(op)) return reduce(n);
    bool changed = false;
    auto drop_if = [&](std::string_view attr, auto is_default, const char* why) {
      const onnx::AttributeProto* a = find_attr(n, attr);
      if (a == nullptr) return;
      if (!is_default(*a)) refuse(op, why);
      drop_attr(n, attr);
      changed = true;
    };
    auto never = [](const onnx::AttributeProto&) { return false; };
    if (op == "Split") {
      if (const auto* a = find_attr(n, "num_outputs"); a && a->i() != n.output_size())
        refuse(op, fmt::format("num_outputs {} is not its {} outputs", a->i(), n.output_size()));
      drop_if(
          "num_outputs", [](const auto&) { return true; }, "");
    } else if (op == "Pad") {
      if (n.input_size() > 3 && !n.input(3).empty())
        refuse(op, "an axes input (pads for some axes only) has no opset-17 form here");
      if (const auto* a = find_attr(n, "mode"); a && a->s() == "wrap")
        refuse(op, "mode 'wrap' is not supported");
    } else if (op == "Resize") {
      drop_if(
          "antialias", [](const auto& a) { return a.i() == 0; }, "antialias is not supported");
      drop_if("axes", never, "an axes attribute (sizes for some axes only) is not supported");
      drop_if(
          "keep_aspect_ratio_policy", [](const auto& a) { return a.s() == "stretch"; },
          "keep_aspect_ratio_policy other than 'stretch' is not supported");
      if (const auto* a = find_attr(n, "coordinate_transformation_mode");
          a && a->s() == "half_pixel_symmetric")
        refuse(op, "coordinate_transformation_mode 'half_pixel_symmetric' is not supported");
    } else if (op == "Cast" || op == "CastLike") {
      drop_if(
          "saturate", [](const auto&) { return true; }, "");
    } else if (op == "AveragePool") {
      drop_if(
          "dilations",
          [](const auto& a) {
            return std::all_of(a.ints().begin(), a.ints().end(), [](int64_t d) { return d == 1; });
          },
          "dilations other than 1 are not supported");
    }
    return changed;
  }

  /// A Reduce op's axes input (18) as the attribute opset 17 has.
  bool reduce(onnx::NodeProto& n) const {
    const onnx::AttributeProto* noop = find_attr(n, "noop_with_empty_axes");
    const bool noop_empty = noop != nullptr && noop->i() != 0;
    std::vector<int64_t> axes;
    const bool has_axes = n.input_size() > 1 && !n.input(1).empty();
    if (has_axes) {
      auto values = constant_ints(n.input(1));
      if (!values)
        refuse(n.op_type(), fmt::format("its axes input '{}' is not a constant int64 tensor; "
                                        "opset 17 takes the axes as an attribute",
                                        n.input(1)));
      axes = *values;
    }
    const bool changed = has_axes || noop != nullptr || n.input_size() > 1;
    drop_attr(n, "noop_with_empty_axes");
    while (n.input_size() > 1) n.mutable_input()->RemoveLast();
    if (axes.empty() && noop_empty) {  // the identity, as opset 18 says
      n.set_op_type("Identity");
      n.clear_attribute();
      return true;
    }
    if (!axes.empty()) {
      onnx::AttributeProto* a = n.add_attribute();
      a->set_name("axes");
      a->set_type(onnx::AttributeProto::INTS);
      for (int64_t v : axes) a->add_ints(v);
    }
    return changed;
  }

  /// A float32 scalar initializer of `value`, named after the node.
  std::string scalar(const std::string& base, float value) {
    onnx::TensorProto t;
    t.set_name(base + "/lowered_" + std::to_string(fresh_++));
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_float_data(value);
    extra_.push_back(t);
    return t.name();
  }

  /// A float32 initializer of `values`, 1-D.
  std::string floats(const std::string& base, const std::vector<float>& values) {
    onnx::TensorProto t;
    t.set_name(base + "/lowered_" + std::to_string(fresh_++));
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_dims(static_cast<int64_t>(values.size()));
    for (float v : values) t.add_float_data(v);
    extra_.push_back(t);
    return t.name();
  }

  /// An int64 initializer of `values`, 1-D.
  std::string ints(const std::string& base, const std::vector<int64_t>& values) {
    onnx::TensorProto t;
    t.set_name(base + "/lowered_" + std::to_string(fresh_++));
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t.add_int64_data(v);
    extra_.push_back(t);
    return t.name();
  }

  /// Appends op(inputs) -> output (a fresh name, or `output` when given) to `out`, with `attrs`.
  std::string emit(google::protobuf::RepeatedPtrField<onnx::NodeProto>& out,
                   const std::string& base, const std::string& op, std::vector<std::string> inputs,
                   std::string output = "", std::vector<onnx::AttributeProto> attrs = {}) {
    onnx::NodeProto* n = out.Add();
    n->set_op_type(op);
    for (auto& a : attrs) *n->add_attribute() = std::move(a);
    n->set_name(base + "/" + op + "_" + std::to_string(fresh_++));
    for (auto& i : inputs) n->add_input(i);
    if (output.empty()) output = n->name() + "_output";
    n->add_output(output);
    return output;
  }

  /// Gelu (20) as torch 1.13 spells it at opset 17, which fuse-gelu recognises: erf:
  /// x * (1 + Erf(x / sqrt 2)) * 0.5; tanh: x * (1 + Tanh(sqrt(2/pi) (x + 0.044715 x^3))) * 0.5.
  void gelu(const onnx::NodeProto& n, google::protobuf::RepeatedPtrField<onnx::NodeProto>& out) {
    const std::string base = n.name().empty() ? label_ : n.name();
    const std::string& x = n.input(0);
    const auto* approx = find_attr(n, "approximate");
    const std::string mode = approx ? approx->s() : "none";
    std::string a;
    if (mode == "none") {
      const std::string e =
          emit(out, base, "Erf", {emit(out, base, "Div", {x, scalar(base, std::sqrt(2.0f))})});
      a = emit(out, base, "Add", {e, scalar(base, 1.0f)});
    } else if (mode == "tanh") {
      const std::string cube = emit(out, base, "Pow", {x, scalar(base, 3.0f)});
      const std::string inner =
          emit(out, base, "Add", {x, emit(out, base, "Mul", {scalar(base, 0.044715f), cube})});
      const float k = static_cast<float>(std::sqrt(2.0 / 3.14159265358979323846));
      const std::string t =
          emit(out, base, "Tanh", {emit(out, base, "Mul", {scalar(base, k), inner})});
      a = emit(out, base, "Add", {t, scalar(base, 1.0f)});
    } else {
      refuse("Gelu", fmt::format("approximate '{}' is not one of none, tanh", mode));
    }
    emit(out, base, "Mul", {emit(out, base, "Mul", {x, a}), scalar(base, 0.5f)}, n.output(0));
  }

  /// Mish (18): x * Tanh(Softplus(x)).
  void mish(const onnx::NodeProto& n, google::protobuf::RepeatedPtrField<onnx::NodeProto>& out) {
    const std::string base = n.name().empty() ? label_ : n.name();
    const std::string& x = n.input(0);
    const std::string t = emit(out, base, "Tanh", {emit(out, base, "Softplus", {x})});
    emit(out, base, "Mul", {x, t}, n.output(0));
  }

  /// GroupNormalization (18; 21 changed scale and bias from per group to per channel) as torch
  /// writes nn.GroupNorm at opset 17: X reshaped to [N, G, -1], InstanceNormalization (scale 1,
  /// bias 0, the node's epsilon), then the affine: per group on the grouped tensor (18), or per
  /// channel on X reshaped to [N, C, -1] (21); reshaped back to X's shape.
  void group_norm(const onnx::NodeProto& n,
                  google::protobuf::RepeatedPtrField<onnx::NodeProto>& out) {
    const std::string base = n.name().empty() ? label_ : n.name();
    const auto* groups_attr = find_attr(n, "num_groups");
    if (groups_attr == nullptr || groups_attr->i() < 1 || n.input_size() < 3)
      refuse("GroupNormalization", "it needs num_groups >= 1 and scale and bias inputs");
    const int64_t groups = groups_attr->i();
    const auto* eps_attr = find_attr(n, "epsilon");
    onnx::AttributeProto epsilon;
    epsilon.set_name("epsilon");
    epsilon.set_type(onnx::AttributeProto::FLOAT);
    epsilon.set_f(eps_attr ? eps_attr->f() : 1e-5f);
    const std::string& x = n.input(0);
    const std::string shape = emit(out, base, "Shape", {x});
    const std::string grouped = emit(out, base, "Reshape", {x, ints(base, {0, groups, -1})});
    const std::string normed =
        emit(out, base, "InstanceNormalization",
             {grouped, floats(base, std::vector<float>(static_cast<size_t>(groups), 1.0f)),
              floats(base, std::vector<float>(static_cast<size_t>(groups), 0.0f))},
             "", {epsilon});
    auto affine = [&](const std::string& t) {
      const std::string axis = ints(base, {1});
      const std::string scale = emit(out, base, "Unsqueeze", {n.input(1), axis});
      const std::string bias = emit(out, base, "Unsqueeze", {n.input(2), axis});
      return emit(out, base, "Add", {emit(out, base, "Mul", {t, scale}), bias});
    };
    if (opset_ < 21) {
      emit(out, base, "Reshape", {affine(normed), shape}, n.output(0));
      return;
    }
    const std::string channels =
        emit(out, base, "Reshape",
             {emit(out, base, "Reshape", {normed, shape}), ints(base, {0, 0, -1})});
    emit(out, base, "Reshape", {affine(channels), shape}, n.output(0));
  }

  onnx::ModelProto& model_;
  int64_t opset_;
  std::unordered_map<std::string, const onnx::TensorProto*> constants_;
  std::unordered_map<std::string, const onnx::NodeProto*> constant_nodes_;
  std::vector<onnx::TensorProto> extra_;
  std::string label_;
  int fresh_ = 0;
};

}  // namespace

int64_t lower_to_opset17(onnx::ModelProto& model) {
  int64_t opset = 0;
  for (const auto& imp : model.opset_import())
    if (imp.domain().empty() || imp.domain() == "ai.onnx") opset = imp.version();
  if (opset <= kMaxOpset || opset > kNewestReadOpset) return 0;
  return Lowering(model, opset).run();
}

}  // namespace stagecraft
