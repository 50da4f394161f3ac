// fuse-gelu: each GELU as exporters spell it becomes one node `Gelu` of domain ai.stagecraft
// (runtime/ops/gelu_element.h) with attribute approximate = "none" or "tanh", as ONNX opset 20's
// Gelu. The backward then keeps only the GELU's input, not the four [.., 4d] intermediates of
// the unfused ops. Recognised, operands of Add and Mul in either order:
//   erf:  e = Erf(Div(x, sqrt 2)) or Erf(Mul(x, 1 / sqrt 2)); a = Add(e, 1); then
//         Mul(Mul(x, a), 0.5), Mul(x, Mul(a, 0.5)) or Mul(Mul(x, 0.5), a)   (torch's nn.GELU,
//         HF's gelu, BERT);
//   tanh: c = x^3 as Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x);
//         a = Add(Tanh(Mul(sqrt(2 / pi), Add(x, Mul(0.044715, c)))), 1); then the same three
//         products (torch's GELU(approximate='tanh'), HF GPT-2's gelu_new).
// Constants are scalars matched within 1e-6 relative; every intermediate must be read by the
// block alone (not by another node, not a graph output); x and y float32 of one shape.
// A stage file's Gelu function (compiler/plan/gelu_function.h) has one body per file under
// ONNX 1.12, so a graph holding both forms fuses only the more frequent one (ties: erf) and
// counts the others as "fuse-gelu: not fused (other form)".
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "passes/attributes.h"
#include "passes/fusion_match.h"
#include "passes/passes.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/gelu_element.h"

namespace stagecraft::passes {
namespace {

using ir::kNoId;
using ir::NodeId;
using ir::ValueId;

using fusion::producer;
using fusion::private_value;
using fusion::scalar_constant;

bool is_op(const ir::Node* n, std::string_view op) {
  return n != nullptr && !n->dead && n->op_type == op && n->domain.empty() &&
         n->inputs.size() == (op == "Erf" || op == "Tanh" ? 1u : 2u) && n->outputs.size() == 1;
}

/// The node reading `v`, when it is its only reader.
const ir::Node* sole_reader(const ir::Graph& g, ValueId v) {
  return private_value(g, v) ? &g.node(g.value(v).consumers[0]) : nullptr;
}

/// Whether `v` is a scalar constant within 1e-6 relative of `expected`.
bool constant_near(const ir::Graph& g, ValueId v, double expected) {
  const auto c = scalar_constant(g, v);
  return c && std::abs(*c - expected) <= 1e-6 * std::abs(expected);
}

/// The operand of binary node `n` other than `v`, or kNoId when `v` is neither.
ValueId other(const ir::Node& n, ValueId v) {
  if (n.inputs[0] == v) return n.inputs[1];
  if (n.inputs[1] == v) return n.inputs[0];
  return kNoId;
}

/// For a binary node with a constant near `expected` on one side: the other operand.
ValueId beside_constant(const ir::Graph& g, const ir::Node* n, double expected) {
  if (n == nullptr) return kNoId;
  if (constant_near(g, n->inputs[1], expected)) return n->inputs[0];
  if (constant_near(g, n->inputs[0], expected)) return n->inputs[1];
  return kNoId;
}

/// A matched GELU: its input, output, the nodes it replaces and its form.
struct Gelu {
  ValueId x = kNoId, y = kNoId;
  std::vector<NodeId> nodes;
  bool tanh = false;
};

/// From a = 1 + Erf(..) or 1 + Tanh(..) (private) to y = 0.5 * x * a; false when not so.
bool match_products(const ir::Graph& g, ValueId a, Gelu& m) {
  const ir::Node* m1 = sole_reader(g, a);
  if (!is_op(m1, "Mul")) return false;
  m.nodes.push_back(g.value(a).consumers[0]);
  const ValueId o1 = other(*m1, a);
  const ValueId p = m1->outputs[0];
  if (o1 == m.x) {  // Mul(Mul(x, a), 0.5)
    const ir::Node* m2 = sole_reader(g, p);
    if (!is_op(m2, "Mul") || beside_constant(g, m2, 0.5) != p) return false;
    m.nodes.push_back(g.value(p).consumers[0]);
    m.y = m2->outputs[0];
    return true;
  }
  if (constant_near(g, o1, 0.5)) {  // Mul(x, Mul(a, 0.5))
    const ir::Node* m2 = sole_reader(g, p);
    if (!is_op(m2, "Mul") || other(*m2, p) != m.x) return false;
    m.nodes.push_back(g.value(p).consumers[0]);
    m.y = m2->outputs[0];
    return true;
  }
  // Mul(Mul(x, 0.5), a): the half of x is read by this product alone.
  const ir::Node* half = producer(g, o1);
  if (!is_op(half, "Mul") || !private_value(g, o1) || beside_constant(g, half, 0.5) != m.x)
    return false;
  m.nodes.push_back(g.value(o1).producer);
  m.y = p;
  return true;
}

/// From the output `t` of an Erf or Tanh to a = Add(t, 1) (private), or kNoId.
ValueId plus_one(const ir::Graph& g, ValueId t, Gelu& m) {
  const ir::Node* add = sole_reader(g, t);
  if (!is_op(add, "Add") || beside_constant(g, add, 1.0) != t) return kNoId;
  m.nodes.push_back(g.value(t).consumers[0]);
  return add->outputs[0];
}

/// The erf form around the Erf node `erf`.
bool match_erf(const ir::Graph& g, NodeId erf, Gelu& m) {
  const ir::Node& e = g.node(erf);
  const ValueId scaled = e.inputs[0];
  const ir::Node* s = producer(g, scaled);
  if (s == nullptr || !private_value(g, scaled)) return false;
  if (is_op(s, "Div") && constant_near(g, s->inputs[1], std::sqrt(2.0)))
    m.x = s->inputs[0];
  else if (is_op(s, "Mul"))
    m.x = beside_constant(g, s, rt::ops::kGeluSqrtHalf);
  if (m.x == kNoId) return false;
  m.nodes = {g.value(scaled).producer, erf};
  const ValueId a = plus_one(g, e.outputs[0], m);
  return a != kNoId && private_value(g, a) && match_products(g, a, m);
}

/// Whether `c` (private) is x^3 of some x; sets `x` and records the nodes.
bool match_cube(const ir::Graph& g, ValueId c, ValueId& x, Gelu& m) {
  const ir::Node* n = producer(g, c);
  if (n == nullptr || !private_value(g, c)) return false;
  if (is_op(n, "Pow") && constant_near(g, n->inputs[1], 3.0)) {
    x = n->inputs[0];
    m.nodes.push_back(g.value(c).producer);
    return true;
  }
  if (!is_op(n, "Mul")) return false;
  // Mul(x, Mul(x, x)) or Mul(Mul(x, x), x): one operand is a private square of the other.
  for (int side = 0; side < 2; ++side) {
    const ValueId sq = n->inputs[side], base = n->inputs[1 - side];
    const ir::Node* s = producer(g, sq);
    if (is_op(s, "Mul") && private_value(g, sq) && s->inputs[0] == base && s->inputs[1] == base) {
      x = base;
      m.nodes.push_back(g.value(c).producer);
      m.nodes.push_back(g.value(sq).producer);
      return true;
    }
  }
  return false;
}

/// The tanh form around the Tanh node `tanh`.
bool match_tanh(const ir::Graph& g, NodeId tanh, Gelu& m) {
  const ir::Node& t = g.node(tanh);
  const ValueId inner = t.inputs[0];
  const ir::Node* scale = producer(g, inner);
  if (!is_op(scale, "Mul") || !private_value(g, inner)) return false;
  const ValueId sum = beside_constant(g, scale, rt::ops::kGeluSqrt2OverPi);
  const ir::Node* add = producer(g, sum);
  if (sum == kNoId || !is_op(add, "Add") || !private_value(g, sum)) return false;
  m.nodes = {g.value(inner).producer, g.value(sum).producer};
  // Add(x, Mul(0.044715, x^3)): the side whose producer scales a cube by kappa.
  for (int side = 0; side < 2; ++side) {
    const ValueId term = add->inputs[side];
    const ir::Node* k = producer(g, term);
    if (!is_op(k, "Mul") || !private_value(g, term)) continue;
    const ValueId cube = beside_constant(g, k, rt::ops::kGeluKappa);
    ValueId x = kNoId;
    Gelu trial = m;
    trial.nodes.push_back(g.value(term).producer);
    if (cube == kNoId || !match_cube(g, cube, x, trial) || x != add->inputs[1 - side]) continue;
    m = std::move(trial);
    m.x = x;
    m.nodes.push_back(tanh);
    m.tanh = true;
    const ValueId a = plus_one(g, t.outputs[0], m);
    return a != kNoId && private_value(g, a) && match_products(g, a, m);
  }
  return false;
}

/// x and y float32 of one static shape.
bool types_fit(const ir::Graph& g, const Gelu& m) {
  const ir::Value &x = g.value(m.x), &y = g.value(m.y);
  return x.dtype == DType::kFloat32 && y.dtype == DType::kFloat32 && x.shape_known &&
         y.shape_known && x.shape == y.shape;
}

void fuse(ir::Graph& g, const Gelu& m) {
  const ir::Node& last = g.node(g.value(m.y).producer);
  // "/h.0/mlp/act/Mul_1" -> "/h.0/mlp/act/Gelu": the block's scope, as the exporter named it.
  const std::string& last_name = last.name.empty() ? g.value(m.y).name : last.name;
  const size_t slash = last_name.rfind('/');
  const std::string base =
      (slash == std::string::npos ? last_name + "/" : last_name.substr(0, slash + 1)) + "Gelu";
  for (NodeId id : m.nodes) g.remove_node(id);
  ir::Node n;
  n.name = g.fresh_node_name(base);
  n.op_type = "Gelu";
  n.domain = std::string(grad::kGradDomain);
  n.inputs = {m.x};
  n.outputs = {m.y};
  n.attributes = {string_attribute("approximate", m.tanh ? "tanh" : "none")};
  g.add_node(std::move(n));
}

}  // namespace

bool FuseGelu::run(ir::Graph& graph, PassContext& context) const {
  std::vector<Gelu> erf, tanh;
  for (NodeId id : graph.topological_order()) {
    const ir::Node& node = graph.node(id);
    Gelu m;
    if (is_op(&node, "Erf") && match_erf(graph, id, m) && types_fit(graph, m))
      erf.push_back(std::move(m));
    else if (is_op(&node, "Tanh") && match_tanh(graph, id, m) && types_fit(graph, m))
      tanh.push_back(std::move(m));
  }
  const bool use_tanh = tanh.size() > erf.size();
  const std::vector<Gelu>& chosen = use_tanh ? tanh : erf;
  if (const size_t left = use_tanh ? erf.size() : tanh.size(); left > 0 && !chosen.empty())
    context.counters["fuse-gelu: not fused (other form)"] += static_cast<int64_t>(left);
  if (chosen.empty()) return false;
  for (const Gelu& m : chosen) fuse(graph, m);
  graph.opset_imports[std::string(grad::kGradDomain)] = grad::kGradDomainVersion;
  context.counters[std::string(name())] += static_cast<int64_t>(chosen.size());
  graph.compact();
  return true;
}

}  // namespace stagecraft::passes
