// Reverse-mode autodiff for one stage: the backward program as gradient ops (grad_ops.h).
#include "passes/autodiff.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "compiler/ir/ops.h"
#include "passes/attributes.h"
#include "passes/host_tensor.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/format/grad_reads.h"

namespace stagecraft::passes {
namespace {

/// A known op (ops.def): of the default domain, or one of ours a pass wrote (Attention).
bool known_op(const ir::Node& node) {
  return (node.domain.empty() || node.domain == "ai.onnx" || node.domain == grad::kGradDomain) &&
         op_family(node.op_type).has_value();
}

std::string node_label(const ir::Graph& graph, const ir::Node& node) {
  if (!node.name.empty()) return node.name;
  for (ir::ValueId out : node.outputs) {
    if (out != ir::kNoId) return node.op_type + "(" + graph.value(out).name + ")";
  }
  return node.op_type;
}

void write_type(onnx::ValueInfoProto* info, const std::string& name, const ir::Value& like) {
  info->set_name(name);
  auto* tt = info->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(like.dtype));
  auto* shape = tt->mutable_shape();
  for (int64_t d : like.shape) shape->add_dim()->set_dim_value(d);
}

void require_static(const ir::Value& v) {
  if (!v.shape_known || v.dtype == DType::kUndefined)
    fail(ErrorKind::kShape, "value '{}' has no static shape; autodiff needs every shape", v.name);
}

/// Builds the backward model of one stage; one instance per call.
class BackwardBuilder {
 public:
  BackwardBuilder(const ir::Graph& graph, const BackwardSpec& spec) : graph_(graph), spec_(spec) {}

  onnx::ModelProto build(std::vector<ir::ValueId>* no_gradient);

 private:
  /// Input k of `node` lies on a gradient path: a float value at a differentiable position. An
  /// unknown op counts every float input so that a path through it is reported, not dropped.
  bool path_input(const ir::Node& node, std::size_t k) const {
    return on_gradient_path(graph_, node, k);
  }
  bool float_value(ir::ValueId v) const {
    return v != ir::kNoId && is_floating(graph_.value(v).dtype);
  }

  /// For a Gather along axis 0 of a table with padding rows (ir::Value::padding_rows, found
  /// through a Cast a 16-bit plan puts between), those rows; else null.
  const std::vector<int64_t>* padding_rows(const ir::Node& node) const {
    if (node.op_type != "Gather" || node.inputs.empty() || node.attr_int("axis", 0) != 0)
      return nullptr;
    ir::ValueId table = node.inputs[0];
    if (const ir::Node* cast = graph_.value(table).producer == ir::kNoId
                                   ? nullptr
                                   : &graph_.node(graph_.value(table).producer);
        cast != nullptr && cast->op_type == "Cast" && !cast->inputs.empty())
      table = cast->inputs[0];
    const std::vector<int64_t>& rows = graph_.value(table).padding_rows;
    return rows.empty() ? nullptr : &rows;
  }
  void check_spec();
  void reachability();
  void count_contributions();
  /// A fresh tensor name based on `base` (base itself when free).
  std::string fresh(const std::string& base);
  /// The name of V's total gradient, emitting the Adds that sum its partials on first call.
  const std::string& total(ir::ValueId v);
  /// The name the next partial gradient of v gets.
  std::string partial_name(ir::ValueId v);
  void emit_gradient(ir::NodeId n);
  /// Records a forward value read by a gradient node (a backward input or constant).
  void use_forward(ir::ValueId v);
  onnx::NodeProto* add_node(const std::string& name, const std::string& op,
                            const std::string& domain);
  /// A value_info entry for a gradient tensor that has v's type.
  void declare(const std::string& name, ir::ValueId v) { declared_.emplace_back(name, v); }

  const ir::Graph& graph_;
  const BackwardSpec& spec_;
  std::vector<int> position_;            // node id -> index in spec.nodes, -1 outside
  std::vector<char> needs_, has_, act_;  // per value: downstream of wanted / upstream of
                                         // seeds / downstream of a wanted activation
  std::vector<char> seeded_, wanted_;
  std::vector<int> count_;  // per value: number of gradient contributions
  std::vector<std::vector<std::string>> partials_;
  std::vector<std::optional<std::string>> total_;
  std::unordered_set<std::string> names_;  // every tensor name in use
  std::vector<onnx::NodeProto> nodes_;
  std::vector<std::pair<std::string, ir::ValueId>> declared_;
  std::vector<ir::ValueId> forward_reads_;  // forward values read, first-use order
  std::vector<char> forward_read_;
};

void BackwardBuilder::check_spec() {
  const std::size_t values = graph_.num_values();
  position_.assign(graph_.num_nodes(), -1);
  for (std::size_t i = 0; i < spec_.nodes.size(); ++i) {
    ir::NodeId n = spec_.nodes[i];
    if (n < 0 || static_cast<std::size_t>(n) >= graph_.num_nodes() || graph_.node(n).dead)
      fail(ErrorKind::kInternal, "autodiff: stage node #{} is not a live node of the graph", n);
    if (position_[n] >= 0)
      fail(ErrorKind::kInternal, "autodiff: {} is listed twice in the stage",
           graph_.node(n).describe(graph_));
    position_[n] = static_cast<int>(i);
  }
  for (std::size_t i = 0; i < spec_.nodes.size(); ++i) {
    const ir::Node& node = graph_.node(spec_.nodes[i]);
    for (ir::ValueId in : node.inputs) {
      if (in == ir::kNoId) continue;
      ir::NodeId p = graph_.value(in).producer;
      if (p != ir::kNoId && position_[p] >= static_cast<int>(i))
        fail(ErrorKind::kInternal,
             "autodiff: {} reads '{}' before {} writes it (stage nodes out of order)",
             node.describe(graph_), graph_.value(in).name, graph_.node(p).describe(graph_));
    }
  }
  auto check_value = [&](ir::ValueId v, const char* role) {
    if (v < 0 || static_cast<std::size_t>(v) >= values)
      fail(ErrorKind::kInternal, "autodiff: {} #{} is not a value of the graph", role, v);
    const ir::Value& val = graph_.value(v);
    if (!is_floating(val.dtype))
      fail(ErrorKind::kInternal, "autodiff: {} '{}' is {}, not floating point", role, val.name,
           dtype_name(val.dtype));
    require_static(val);
  };
  seeded_.assign(values, 0);
  wanted_.assign(values, 0);
  if (spec_.loss) {
    check_value(*spec_.loss, "the loss");
    const ir::Value& loss = graph_.value(*spec_.loss);
    if (loss.dtype != DType::kFloat32 || !loss.shape.empty())
      fail(ErrorKind::kInternal, "autodiff: the loss '{}' is {}{}, not a float32 scalar []",
           loss.name, dtype_name(loss.dtype), ir::shape_string(loss.shape));
    seeded_[*spec_.loss] = 1;
  }
  for (ir::ValueId v : spec_.output_grads) {
    check_value(v, "output gradient");
    if (seeded_[v])
      fail(ErrorKind::kInternal, "autodiff: '{}' is seeded twice", graph_.value(v).name);
    seeded_[v] = 1;
  }
  std::vector<char> read(values, 0);
  for (ir::NodeId n : spec_.nodes) {
    for (ir::ValueId in : graph_.node(n).inputs) {
      if (in != ir::kNoId) read[in] = 1;
    }
  }
  for (ir::ValueId v : spec_.wanted) {
    check_value(v, "wanted value");
    const ir::Value& val = graph_.value(v);
    if (wanted_[v])
      fail(ErrorKind::kInternal, "autodiff: wanted value '{}' is listed twice", val.name);
    if (seeded_[v])
      fail(ErrorKind::kInternal, "autodiff: '{}' is both seeded and wanted", val.name);
    if (!read[v])
      fail(ErrorKind::kInternal, "autodiff: wanted value '{}' is read by no node of the stage",
           val.name);
    wanted_[v] = 1;
  }
}

void BackwardBuilder::reachability() {
  const std::size_t values = graph_.num_values();
  needs_.assign(values, 0);
  act_.assign(values, 0);
  has_.assign(values, 0);
  for (ir::ValueId v : spec_.wanted) {
    needs_[v] = 1;
    act_[v] = !graph_.value(v).is_initializer();
  }
  for (ir::NodeId n : spec_.nodes) {
    const ir::Node& node = graph_.node(n);
    bool needs = false, act = false;
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      if (!path_input(node, k)) continue;
      needs |= needs_[node.inputs[k]] != 0;
      act |= act_[node.inputs[k]] != 0;
    }
    for (ir::ValueId out : node.outputs) {
      if (!float_value(out)) continue;
      needs_[out] |= needs;
      act_[out] |= act;
    }
  }
  for (std::size_t v = 0; v < values; ++v) has_[v] = seeded_[v];
  for (auto it = spec_.nodes.rbegin(); it != spec_.nodes.rend(); ++it) {
    const ir::Node& node = graph_.node(*it);
    bool has = false;
    for (ir::ValueId out : node.outputs) has |= float_value(out) && has_[out];
    if (!has) continue;
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      if (path_input(node, k)) has_[node.inputs[k]] = 1;
    }
  }
}

void BackwardBuilder::count_contributions() {
  count_.assign(graph_.num_values(), 0);
  for (std::size_t v = 0; v < count_.size(); ++v) count_[v] = seeded_[v];
  for (ir::NodeId n : spec_.nodes) {
    const ir::Node& node = graph_.node(n);
    bool receives = false;
    for (ir::ValueId out : node.outputs) receives |= float_value(out) && has_[out] && needs_[out];
    if (!receives) continue;
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      if (path_input(node, k) && needs_[node.inputs[k]]) ++count_[node.inputs[k]];
    }
  }
}

std::string BackwardBuilder::fresh(const std::string& base) {
  std::string name = base;
  for (int i = 1; names_.count(name); ++i) name = base + "." + std::to_string(i);
  names_.insert(name);
  return name;
}

std::string BackwardBuilder::partial_name(ir::ValueId v) {
  const std::string grad = grad::grad_name(graph_.value(v).name);
  // A sole contribution is the total gradient itself.
  if (count_[v] == 1) return fresh(grad);
  return fresh(grad + "." + std::to_string(partials_[v].size()));
}

const std::string& BackwardBuilder::total(ir::ValueId v) {
  if (total_[v]) return *total_[v];
  const ir::Value& val = graph_.value(v);
  const auto& parts = partials_[v];
  if (parts.empty() || static_cast<int>(parts.size()) != count_[v])
    fail(ErrorKind::kInternal,
         "autodiff: gradient of '{}' has {} of {} contributions when it is needed", val.name,
         parts.size(), count_[v]);
  if (parts.size() == 1) {
    total_[v] = parts[0];
    return *total_[v];
  }
  const std::string grad = grad::grad_name(val.name);
  std::string acc = parts[0];
  for (std::size_t i = 1; i < parts.size(); ++i) {
    // The last sum is the total: "V@grad" unless a seed input already has that name.
    std::string out = i + 1 < parts.size() ? fresh(grad + ".sum" + std::to_string(i)) : fresh(grad);
    auto* add = add_node(grad + "/Add" + (parts.size() > 2 ? std::to_string(i) : ""), "Add", "");
    add->add_input(acc);
    add->add_input(parts[i]);
    add->add_output(out);
    declare(out, v);
    acc = out;
  }
  total_[v] = acc;
  return *total_[v];
}

void BackwardBuilder::use_forward(ir::ValueId v) {
  if (forward_read_[v]) return;
  forward_read_[v] = 1;
  require_static(graph_.value(v));
  forward_reads_.push_back(v);
}

onnx::NodeProto* BackwardBuilder::add_node(const std::string& name, const std::string& op,
                                           const std::string& domain) {
  onnx::NodeProto& node = nodes_.emplace_back();
  node.set_name(name);
  node.set_op_type(op);
  if (!domain.empty()) node.set_domain(domain);
  return &node;
}

void BackwardBuilder::emit_gradient(ir::NodeId n) {
  const ir::Node& node = graph_.node(n);
  // dy: the total gradient of each output that receives one.
  std::vector<std::string> dy(node.outputs.size());
  bool receives = false;
  for (std::size_t j = 0; j < node.outputs.size(); ++j) {
    ir::ValueId out = node.outputs[j];
    if (!float_value(out) || !has_[out] || !needs_[out]) continue;
    dy[j] = total(out);
    receives = true;
  }
  if (!receives) return;
  // dx: the inputs on a path from a wanted value, split into activation and weight sides.
  std::vector<std::size_t> act_inputs, weight_inputs;
  for (std::size_t k = 0; k < node.inputs.size(); ++k) {
    if (!path_input(node, k) || !needs_[node.inputs[k]]) continue;
    (act_[node.inputs[k]] ? act_inputs : weight_inputs).push_back(k);
  }
  if (act_inputs.empty() && weight_inputs.empty()) return;
  // An Add input of the output's shape and type has dy itself as its gradient: dy is that
  // input's partial, with no node (AddGrad would copy it; a residual Add's two copies and a
  // bias Add's activation side per layer). A wanted value keeps its node: its gradient is a
  // program output under its own name.
  if (node.op_type == "Add" && (node.domain.empty() || node.domain == "ai.onnx") &&
      node.outputs.size() == 1 && !dy[0].empty()) {
    const ir::Value& y = graph_.value(node.outputs[0]);
    auto passes_dy = [&](std::size_t k) {
      const ir::ValueId v = node.inputs[k];
      const ir::Value& x = graph_.value(v);
      if (wanted_[v] || !x.shape_known || !y.shape_known || x.shape != y.shape ||
          x.dtype != y.dtype)
        return false;
      partials_[v].push_back(dy[0]);
      return true;
    };
    std::erase_if(act_inputs, passes_dy);
    std::erase_if(weight_inputs, passes_dy);
    if (act_inputs.empty() && weight_inputs.empty()) return;
  }
  if (!known_op(node) || !has_gradient(node.op_type))
    fail(ErrorKind::kUnsupported,
         "autodiff: {} lies on a gradient path (between a wanted value and the loss or a stage "
         "output) "
         "but has no gradient op",
         node.describe(graph_));
  const std::string label = node_label(graph_, node);
  auto emit = [&](const std::vector<std::size_t>& named, bool weight_side) {
    auto* g =
        add_node(label + (weight_side ? "@grad_w" : "@grad"),
                 node.op_type + std::string(grad::kGradSuffix), std::string(grad::kGradDomain));
    for (ir::ValueId in : node.inputs) {
      if (in != ir::kNoId) use_forward(in);
      g->add_input(in == ir::kNoId ? "" : graph_.value(in).name);
    }
    for (ir::ValueId out : node.outputs) {
      if (out != ir::kNoId) use_forward(out);
      g->add_input(out == ir::kNoId ? "" : graph_.value(out).name);
    }
    for (const std::string& d : dy) g->add_input(d);
    std::vector<std::string> dx(node.inputs.size());
    for (std::size_t k : named) {
      ir::ValueId v = node.inputs[k];
      dx[k] = partial_name(v);
      partials_[v].push_back(dx[k]);
      declare(dx[k], v);
    }
    for (const std::string& d : dx) g->add_output(d);
    for (const auto& a : node.attributes) *g->add_attribute() = a;
    if (const std::vector<int64_t>* rows = padding_rows(node); rows != nullptr)
      *g->add_attribute() = ints_attribute(grad::kPaddingRowsAttr, *rows);
    *g->add_attribute() =
        int_attribute(grad::kForwardInputsAttr, static_cast<int64_t>(node.inputs.size()));
    if (weight_side) *g->add_attribute() = int_attribute(grad::kWeightGradAttr, 1);
  };
  if (!act_inputs.empty()) emit(act_inputs, false);
  if (!weight_inputs.empty()) emit(weight_inputs, true);
}

onnx::ModelProto BackwardBuilder::build(std::vector<ir::ValueId>* no_gradient) {
  check_spec();
  reachability();
  count_contributions();
  const std::size_t values = graph_.num_values();
  partials_.assign(values, {});
  total_.assign(values, std::nullopt);
  forward_read_.assign(values, 0);
  for (const ir::Value& v : graph_.values()) names_.insert(v.name);

  // Seeds: the backward inputs that carry gradients in.
  std::vector<std::pair<std::string, ir::ValueId>> seed_inputs;
  auto seed = [&](ir::ValueId v, const std::string& name) {
    if (names_.count(name))
      fail(ErrorKind::kModel,
           "autodiff: the model already has a value called '{}', the name of a gradient", name);
    names_.insert(name);
    seed_inputs.emplace_back(name, v);
    if (needs_[v]) partials_[v].push_back(name);
  };
  if (spec_.loss) seed(*spec_.loss, std::string(grad::kLossGradName));
  for (ir::ValueId v : spec_.output_grads) seed(v, grad::grad_name(graph_.value(v).name));
  // Wanted gradients keep their contract names: reserve them so no partial takes one.
  for (ir::ValueId v : spec_.wanted) {
    const std::string name = grad::grad_name(graph_.value(v).name);
    if (names_.count(name))
      fail(ErrorKind::kModel,
           "autodiff: the model already has a value called '{}', the name of a gradient", name);
  }
  // Seeds that lead to no wanted value contribute nothing.
  for (std::size_t v = 0; v < values; ++v) {
    if (seeded_[v] && !needs_[v]) count_[v] = 0;
  }

  for (auto it = spec_.nodes.rbegin(); it != spec_.nodes.rend(); ++it) emit_gradient(*it);

  std::vector<std::pair<std::string, ir::ValueId>> outputs;
  for (ir::ValueId v : spec_.wanted) {
    if (count_[v] == 0) {
      if (no_gradient) no_gradient->push_back(v);
      continue;
    }
    const std::string& name = total(v);
    if (name != grad::grad_name(graph_.value(v).name))
      fail(ErrorKind::kInternal, "autodiff: the gradient of '{}' came out as '{}'",
           graph_.value(v).name, name);
    outputs.emplace_back(name, v);
  }

  onnx::ModelProto model;
  model.set_ir_version(std::max<int64_t>(graph_.ir_version, 8));
  model.set_producer_name(graph_.producer_name.empty() ? "stagecraft" : graph_.producer_name);
  std::map<std::string, int64_t> imports = graph_.opset_imports;
  if (!imports.count("")) imports[""] = graph_.opset;
  imports[std::string(grad::kGradDomain)] = grad::kGradDomainVersion;
  for (const auto& [domain, version] : imports) {
    auto* imp = model.add_opset_import();
    imp->set_domain(domain);
    imp->set_version(version);
  }
  auto* proto = model.mutable_graph();
  proto->set_name((graph_.name.empty() ? std::string("stagecraft") : graph_.name) + "_backward");
  for (const auto& [name, v] : seed_inputs) write_type(proto->add_input(), name, graph_.value(v));
  for (ir::ValueId v : forward_reads_) {
    const ir::Value& val = graph_.value(v);
    if (val.is_initializer() && !val.is_weight) {
      // A folded constant (shape, indices, mask): embedded, as in the forward stage file.
      auto* t = proto->add_initializer();
      t->set_name(val.name);
      t->set_data_type(static_cast<int32_t>(val.dtype));
      for (int64_t d : val.shape) t->add_dims(d);
      auto bytes = val.initializer->bytes();
      t->set_raw_data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    } else {
      write_type(proto->add_input(), val.name, val);
    }
  }
  for (const auto& [name, v] : outputs) write_type(proto->add_output(), name, graph_.value(v));
  std::unordered_set<std::string> output_names;
  for (const auto& [name, v] : outputs) output_names.insert(name);
  for (auto& node : nodes_) *proto->add_node() = std::move(node);
  for (const auto& [name, v] : declared_) {
    if (!output_names.count(name)) write_type(proto->add_value_info(), name, graph_.value(v));
  }
  return model;
}

}  // namespace

bool has_gradient(std::string_view op_type) {
  const OpInfo* info = op_info(op_type);
  return info != nullptr && info->has_gradient();
}

bool backward_reads_bytes(const ir::Graph& graph, ir::ValueId v) {
  auto reads = [](const ir::Node& node, std::size_t position) {
    return has_gradient(node.op_type) &&
           grad::reads_bytes(node.op_type, node.inputs.size(), position);
  };
  const ir::Value& value = graph.value(v);
  if (value.producer != ir::kNoId) {
    const ir::Node& node = graph.node(value.producer);
    for (std::size_t j = 0; j < node.outputs.size(); ++j)
      if (node.outputs[j] == v && reads(node, node.inputs.size() + j)) return true;
  }
  for (ir::NodeId c : value.consumers) {
    const ir::Node& node = graph.node(c);
    for (std::size_t k = 0; k < node.inputs.size(); ++k)
      if (node.inputs[k] == v && reads(node, k)) return true;
  }
  return false;
}

bool on_gradient_path(const ir::Graph& graph, const ir::Node& node, std::size_t k) {
  ir::ValueId v = node.inputs[k];
  if (v == ir::kNoId || !is_floating(graph.value(v).dtype)) return false;
  return known_op(node) ? differentiable_at(node, k) : true;
}

std::vector<char> reaches_loss(const ir::Graph& graph, ir::ValueId loss,
                               const std::vector<ir::NodeId>& order) {
  std::vector<char> reaches(graph.num_values(), 0);
  reaches[loss] = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const ir::Node& node = graph.node(*it);
    bool any = false;
    for (ir::ValueId out : node.outputs)
      any |= out != ir::kNoId && is_floating(graph.value(out).dtype) && reaches[out];
    if (!any) continue;
    for (std::size_t k = 0; k < node.inputs.size(); ++k)
      if (on_gradient_path(graph, node, k)) reaches[node.inputs[k]] = 1;
  }
  return reaches;
}

bool passes_gradient(const ir::Graph& graph, const ir::Node& node, std::size_t k,
                     const std::vector<char>& reaches) {
  if (!on_gradient_path(graph, node, k)) return false;
  for (ir::ValueId out : node.outputs)
    if (out != ir::kNoId && is_floating(graph.value(out).dtype) && reaches[out]) return true;
  return false;
}

std::string untrainable_reason(const ir::Graph& g, const ir::Value& v) {
  constexpr int64_t kScanElements = int64_t{1} << 20;
  // Bytes a sparse file never wrote are zeros: nothing to read (a dry run's weight file).
  if (v.shape_known && v.numel() <= kScanElements && v.initializer != nullptr &&
      !v.initializer->unwritten()) {
    const std::span<const std::byte> bytes = v.initializer->bytes();
    const auto* f = reinterpret_cast<const float*>(bytes.data());
    const int64_t n = static_cast<int64_t>(bytes.size() / sizeof(float));
    int64_t bad = 0, negative = 0;
    for (int64_t i = 0; i < n; ++i) {
      bad += std::isfinite(f[i]) ? 0 : 1;
      negative += f[i] < 0.0f ? 1 : 0;
    }
    if (bad > 0)
      return fmt::format("{} non-finite entr{} (-inf or NaN, as a mask holds)", bad,
                         bad == 1 ? "y" : "ies");
    // A mask takes from the scores; one with nothing below zero (a learned attention bias
    // initialised to zeros) masks nothing: trained.
    if (negative == 0) return "";
  }
  // A vector added before a Softmax is a Linear's bias (a router's, a gate's, an attention
  // pooling's scores): PyTorch trains it. A mask spans queries and keys (rank 2 or more).
  if (v.consumers.empty() || !v.shape_known || v.shape.size() < 2) return "";
  for (ir::NodeId reader : v.consumers) {
    const ir::Node& add = g.node(reader);
    if (add.op_type != "Add" || !add.domain.empty() || add.outputs.empty()) return "";
    // Added to a product with a trained weight (x W + b): a Linear's bias, whatever its rank.
    for (ir::ValueId operand : add.inputs) {
      if (operand == ir::kNoId || &g.value(operand) == &v) continue;
      const ir::NodeId producer = g.value(operand).producer;
      if (producer == ir::kNoId) continue;
      const ir::Node& p = g.node(producer);
      if ((p.op_type == "MatMul" || p.op_type == "Gemm") && p.inputs.size() > 1 &&
          p.inputs[1] != ir::kNoId && g.value(p.inputs[1]).is_weight)
        return "";
    }
    const ir::Value& sum = g.value(add.outputs[0]);
    if (sum.consumers.empty()) return "";
    for (ir::NodeId next : sum.consumers)
      if (g.node(next).op_type != "Softmax") return "";
  }
  return "an additive attention mask (read only by Adds that feed a Softmax)";
}

bool differentiable_input(std::string_view op_type, std::size_t index) {
  const OpInfo* info = op_info(op_type);
  return info != nullptr && info->differentiable_input(index);
}

bool differentiable_at(const ir::Node& node, std::size_t index) {
  if (index == 3 && node.op_type == "Attention" && node.domain == grad::kGradDomain)
    return node.attr_int("mask_gradient", 0) != 0;
  return differentiable_input(node.op_type, index);
}

std::vector<ir::ValueId> trainable_weights(const ir::Graph& graph,
                                           const std::vector<ir::NodeId>& nodes) {
  std::vector<ir::ValueId> out;
  std::unordered_set<ir::ValueId> seen;
  for (ir::NodeId n : nodes) {
    const ir::Node& node = graph.node(n);
    if (!known_op(node)) continue;
    for (std::size_t k = 0; k < node.inputs.size(); ++k) {
      ir::ValueId v = node.inputs[k];
      if (v == ir::kNoId) continue;
      const ir::Value& val = graph.value(v);
      if (!val.is_initializer() || !val.is_weight || val.frozen || val.dtype != DType::kFloat32)
        continue;
      if (!differentiable_at(node, k)) continue;
      if (seen.insert(v).second) out.push_back(v);
    }
  }
  return out;
}

onnx::ModelProto build_backward(const ir::Graph& graph, const BackwardSpec& spec,
                                std::vector<ir::ValueId>* no_gradient) {
  return BackwardBuilder(graph, spec).build(no_gradient);
}

int keep_dropout_masks(ir::Graph& graph) {
  int added = 0;
  for (std::size_t i = 0; i < graph.num_nodes(); ++i) {
    const auto id = static_cast<ir::NodeId>(i);
    const ir::Node& node = graph.node(id);
    if (node.dead || node.op_type != "Dropout" || !node.domain.empty()) continue;
    if (node.inputs.size() < 3 || node.inputs[2] == ir::kNoId || node.outputs.empty()) continue;
    if (node.outputs.size() > 1 && node.outputs[1] != ir::kNoId) continue;
    if (auto mode = HostTensor::from_value(graph.value(node.inputs[2]));
        mode && mode->numel() == 1 && (mode->is_real() ? mode->real_at(0) : mode->int_at(0)) == 0)
      continue;  // inference mode, always
    const ir::Value& y = graph.value(node.outputs[0]);
    ir::Value mask;
    mask.name = y.name + ".mask";
    for (int n = 1; graph.find_value(mask.name); ++n)
      mask.name = fmt::format("{}.mask{}", y.name, n);
    mask.dtype = DType::kBool;
    mask.shape = y.shape;
    mask.shape_known = y.shape_known;
    mask.producer = id;
    const ir::ValueId v = graph.add_value(std::move(mask));
    ir::Node& writer = graph.node(id);
    writer.outputs.resize(2, ir::kNoId);
    writer.outputs[1] = v;
    ++added;
  }
  return added;
}

}  // namespace stagecraft::passes
