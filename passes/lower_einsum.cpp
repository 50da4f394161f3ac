// lower-einsum: Einsum rewritten into the ops the backends run. With static shapes, an einsum of
// one or two operands is a ReduceSum of the letters only one operand has and the output does
// not, then Transpose + Reshape of each operand to [batch..., rows, contracted] and
// [batch..., contracted, columns], one MatMul, and Reshape + Transpose to the output's order:
// what the transformer equations ("bhqd,bhkd->bhqk", "bij,bjk->bik", "bid,jd->bij") need, with
// every gradient already there. A letter repeated within one operand (a diagonal), three or more
// operands, or letters whose sizes differ between operands are refused, naming the node.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <numeric>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "passes/attributes.h"
#include "passes/graph_builder.h"
#include "passes/passes.h"
#include "runtime/format/error.h"

namespace stagecraft::passes {
namespace {

/// One operand's (or the output's) letters, one per axis; an ellipsis is replaced by one
/// character per dim it stands for (below 'A', so no letter of the equation can clash).
using Term = std::string;

struct Equation {
  std::vector<Term> inputs;
  Term output;
};

/// Whether `c` stands for a dim of an ellipsis (parse gives them the codes 1, 2, ...).
bool is_ellipsis_dim(char c) { return static_cast<unsigned char>(c) < 32; }

/// Parses `equation` for operands of `ranks`: spaces dropped, each "..." replaced by the dims it
/// covers (the same count in every operand that has one), the implicit output (no "->") made
/// explicit as numpy does: the ellipsis dims, then the letters seen once, in alphabetical order.
Equation parse(const ir::Graph& g, const ir::Node& node, std::string equation,
               const std::vector<int64_t>& ranks) {
  std::erase(equation, ' ');
  const size_t arrow = equation.find("->");
  const std::string left = equation.substr(0, arrow);
  Equation eq;
  for (size_t start = 0;;) {
    const size_t comma = left.find(',', start);
    eq.inputs.push_back(left.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (eq.inputs.size() != ranks.size())
    refuse_rewrite(g, node,
                   fmt::format("the equation '{}' has {} operands but the node has {} inputs",
                               equation, eq.inputs.size(), ranks.size()));
  int64_t ellipsis_dims = -1;
  auto expand = [&](Term& term, int64_t rank, const std::string& what) {
    const size_t dots = term.find("...");
    if (dots == std::string::npos) {
      if (static_cast<int64_t>(term.size()) != rank)
        refuse_rewrite(g, node,
                       fmt::format("{} '{}' names {} axes but its tensor has rank {}", what, term,
                                   term.size(), rank));
      return;
    }
    const int64_t named = static_cast<int64_t>(term.size()) - 3;
    const int64_t covered = rank - named;
    if (covered < 0)
      refuse_rewrite(
          g, node,
          fmt::format("{} '{}' names {} axes but its tensor has rank {}", what, term, named, rank));
    if (ellipsis_dims >= 0 && covered != ellipsis_dims)
      refuse_rewrite(g, node,
                     fmt::format("the ellipsis stands for {} dims in one operand and {} in "
                                 "another; broadcasting between them is not supported",
                                 ellipsis_dims, covered));
    ellipsis_dims = covered;
    std::string dims;
    for (int64_t d = 0; d < covered; ++d) dims.push_back(static_cast<char>(1 + d));
    term.replace(dots, 3, dims);
  };
  for (size_t k = 0; k < eq.inputs.size(); ++k)
    expand(eq.inputs[k], ranks[k], fmt::format("operand {}", k));
  for (const Term& term : eq.inputs)
    for (char c : term)
      if (!is_ellipsis_dim(c) && !std::isalpha(static_cast<unsigned char>(c)))
        refuse_rewrite(
            g, node,
            fmt::format("the equation '{}' holds '{}', which is not a letter", equation, c));
  if (arrow != std::string::npos) {
    eq.output = equation.substr(arrow + 2);
    if (eq.output.find("...") != std::string::npos) {
      std::string dims;
      for (int64_t d = 0; d < std::max<int64_t>(ellipsis_dims, 0); ++d)
        dims.push_back(static_cast<char>(1 + d));
      eq.output.replace(eq.output.find("..."), 3, dims);
    }
  } else {
    std::string once;
    for (const Term& term : eq.inputs)
      for (char c : term) {
        if (is_ellipsis_dim(c)) continue;
        size_t seen = 0;
        for (const Term& t : eq.inputs) seen += static_cast<size_t>(std::count(t.begin(), t.end(), c));
        if (seen == 1) once.push_back(c);
      }
    std::sort(once.begin(), once.end());
    for (int64_t d = 0; d < std::max<int64_t>(ellipsis_dims, 0); ++d)
      eq.output.push_back(static_cast<char>(1 + d));
    eq.output += once;
  }
  return eq;
}

/// The letters of `term` that `keep` says to keep, in `term`'s order.
template <class Keep>
Term select(const Term& term, Keep keep) {
  Term out;
  for (char c : term)
    if (keep(c)) out.push_back(c);
  return out;
}

bool has(const Term& term, char c) { return term.find(c) != std::string::npos; }

/// Adds the nodes of one einsum, the last writing `output` (its value kept: name, graph-output
/// status, readers).
class Lowering {
 public:
  Lowering(ir::Graph& g, const ir::Node& node, ir::ValueId output)
      : g_(g),
        output_(output),
        b_(g, node.name.empty() ? g.value(output).name : node.name, "einsum") {}

  /// `input` (letters `from`) brought to the letters `to` (a permutation of `from`).
  ir::ValueId transpose(ir::ValueId input, const Term& from, const Term& to, bool last) {
    std::vector<int64_t> perm;
    for (char c : to) perm.push_back(static_cast<int64_t>(from.find(c)));
    std::vector<int64_t> identity(perm.size());
    std::iota(identity.begin(), identity.end(), 0);
    if (perm == identity && !last) return input;
    if (perm == identity) return reshape(input, g_.value(input).shape, true);
    std::vector<int64_t> shape;
    for (int64_t p : perm) shape.push_back(g_.value(input).shape[static_cast<size_t>(p)]);
    return add("Transpose", {input}, shape, {ints_attribute("perm", perm)}, last);
  }

  ir::ValueId reshape(ir::ValueId input, const std::vector<int64_t>& shape, bool last) {
    if (g_.value(input).shape == shape && !last) return input;
    ir::ValueId dims = constant(shape);
    return add("Reshape", {input, dims}, shape, {}, last);
  }

  /// ReduceSum of `input` (letters `term`) over the letters `gone`, which leave the result.
  ir::ValueId reduce_sum(ir::ValueId input, const Term& term, const Term& gone, bool last) {
    std::vector<int64_t> axes, shape;
    for (size_t d = 0; d < term.size(); ++d) {
      if (has(gone, term[d]))
        axes.push_back(static_cast<int64_t>(d));
      else
        shape.push_back(g_.value(input).shape[d]);
    }
    // ReduceSum takes its axes as an input from opset 13, as an attribute before.
    if (g_.opset < 13)
      return add("ReduceSum", {input}, shape,
                 {int_attribute("keepdims", 0), ints_attribute("axes", axes)}, last);
    return add("ReduceSum", {input, constant(axes)}, shape, {int_attribute("keepdims", 0)}, last);
  }

  ir::ValueId matmul(ir::ValueId a, ir::ValueId b, const std::vector<int64_t>& shape, bool last) {
    return add("MatMul", {a, b}, shape, {}, last);
  }

 private:
  ir::ValueId constant(const std::vector<int64_t>& values) {
    return b_.int64_constant(values, {static_cast<int64_t>(values.size())});
  }

  ir::ValueId add(const std::string& op, std::vector<ir::ValueId> inputs,
                  const std::vector<int64_t>& shape, std::vector<onnx::AttributeProto> attrs,
                  bool last) {
    const DType dtype = g_.value(inputs[0]).dtype;
    return b_.add(op, std::move(inputs), dtype, shape, std::move(attrs),
                  last ? output_ : ir::kNoId);
  }

  ir::Graph& g_;
  ir::ValueId output_;
  GraphBuilder b_;
};

/// Rewrites the Einsum `id`; false when its shapes are not static yet (a later round will).
bool lower(ir::Graph& g, ir::NodeId id) {
  const ir::Node node = g.node(id);  // a copy: adding nodes moves the node list
  std::vector<const ir::Value*> ins;
  std::vector<int64_t> ranks;
  for (ir::ValueId in : node.inputs) {
    if (in == ir::kNoId) refuse_rewrite(g, node, "an omitted input");
    const ir::Value& v = g.value(in);
    if (!v.shape_known || v.dtype == DType::kUndefined) return false;
    ins.push_back(&v);
    ranks.push_back(static_cast<int64_t>(v.shape.size()));
  }
  if (node.outputs.size() != 1 || node.outputs[0] == ir::kNoId) return false;
  if (ins.empty() || ins.size() > 2)
    refuse_rewrite(g, node,
                   fmt::format("{} operands; one or two are supported (split a longer einsum "
                               "into pairs)",
                               ins.size()));
  const std::string text = node.attr_string("equation", "");
  if (text.empty()) refuse_rewrite(g, node, "no equation attribute");
  const Equation eq = parse(g, node, text, ranks);

  // Sizes: one per letter, the same in every operand; no letter twice in one term.
  std::vector<int64_t> size(256, -1);
  for (size_t k = 0; k < eq.inputs.size(); ++k) {
    const Term& term = eq.inputs[k];
    for (size_t d = 0; d < term.size(); ++d) {
      const auto c = static_cast<unsigned char>(term[d]);
      if (std::count(term.begin(), term.end(), term[d]) > 1)
        refuse_rewrite(
            g, node,
            fmt::format("operand {} repeats '{}' (a diagonal); not supported", k, term[d]));
      const int64_t dim = ins[k]->shape[d];
      if (size[c] >= 0 && size[c] != dim)
        refuse_rewrite(g, node,
                       fmt::format("'{}' is {} in one operand and {} in operand {} (broadcasting "
                                   "between operands is not supported)",
                                   is_ellipsis_dim(term[d]) ? "..." : std::string(1, term[d]),
                                   size[c], dim, k));
      size[c] = dim;
    }
  }
  for (char c : eq.output) {
    if (std::count(eq.output.begin(), eq.output.end(), c) > 1)
      refuse_rewrite(g, node, fmt::format("the output repeats '{}'", c));
    if (size[static_cast<unsigned char>(c)] < 0)
      refuse_rewrite(g, node, fmt::format("the output's '{}' is in no operand", c));
  }
  auto dims = [&](const Term& term) {
    std::vector<int64_t> shape;
    for (char c : term) shape.push_back(size[static_cast<unsigned char>(c)]);
    return shape;
  };
  auto product = [&](const Term& term) {
    return ir::checked_numel(dims(term), fmt::format("Einsum '{}'", node.name));
  };

  const ir::ValueId output = node.outputs[0];
  g.remove_node(id);
  Lowering low(g, node, output);
  if (eq.inputs.size() == 1) {
    Term term = eq.inputs[0];
    ir::ValueId x = node.inputs[0];
    const Term gone = select(term, [&](char c) { return !has(eq.output, c); });
    if (!gone.empty()) {
      const bool last = select(term, [&](char c) { return has(eq.output, c); }) == eq.output;
      x = low.reduce_sum(x, term, gone, last);
      term = select(term, [&](char c) { return has(eq.output, c); });
      if (last) return true;
    }
    low.transpose(x, term, eq.output, true);
    return true;
  }

  Term a = eq.inputs[0], b = eq.inputs[1];
  ir::ValueId x = node.inputs[0], y = node.inputs[1];
  // Letters only one operand has and the output does not: summed out first.
  const Term a_only = select(a, [&](char c) { return !has(b, c) && !has(eq.output, c); });
  const Term b_only = select(b, [&](char c) { return !has(a, c) && !has(eq.output, c); });
  if (!a_only.empty()) {
    x = low.reduce_sum(x, a, a_only, false);
    a = select(a, [&](char c) { return !has(a_only, c); });
  }
  if (!b_only.empty()) {
    y = low.reduce_sum(y, b, b_only, false);
    b = select(b, [&](char c) { return !has(b_only, c); });
  }
  const Term batch = select(eq.output, [&](char c) { return has(a, c) && has(b, c); });
  const Term rows = select(eq.output, [&](char c) { return has(a, c) && !has(b, c); });
  const Term columns = select(eq.output, [&](char c) { return has(b, c) && !has(a, c); });
  const Term contracted = select(a, [&](char c) { return has(b, c) && !has(eq.output, c); });

  std::vector<int64_t> a_shape = dims(batch), b_shape = dims(batch);
  a_shape.push_back(product(rows));
  a_shape.push_back(product(contracted));
  b_shape.push_back(product(contracted));
  b_shape.push_back(product(columns));
  x = low.reshape(low.transpose(x, a, batch + rows + contracted, false), a_shape, false);
  y = low.reshape(low.transpose(y, b, batch + contracted + columns, false), b_shape, false);
  std::vector<int64_t> product_shape = dims(batch);
  product_shape.push_back(product(rows));
  product_shape.push_back(product(columns));
  const Term result = batch + rows + columns;
  const bool in_order = result == eq.output;
  ir::ValueId z = low.matmul(x, y, product_shape, in_order && product_shape == dims(result));
  if (in_order && product_shape == dims(result)) return true;
  z = low.reshape(z, dims(result), in_order);
  if (!in_order) low.transpose(z, result, eq.output, true);
  return true;
}

}  // namespace

bool LowerEinsum::run(ir::Graph& graph, PassContext& context) const {
  bool changed = false;
  for (ir::NodeId id = 0; id < static_cast<ir::NodeId>(graph.num_nodes()); ++id) {
    const ir::Node& node = graph.node(id);
    if (node.dead || node.op_type != "Einsum" || !node.domain.empty()) continue;
    if (lower(graph, id)) {
      changed = true;
      ++context.counters[std::string(name())];
    }
  }
  return changed;
}

}  // namespace stagecraft::passes
