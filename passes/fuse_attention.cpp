// fuse-attention: each attention block as exporters spell it (MatMul of Q and K^T, a scale, a
// mask, Softmax over the last axis, MatMul with V) becomes one node `Attention` of domain
// ai.stagecraft (runtime/ops/attention_shape.h: Q, K, V, an optional additive mask; attributes
// scale and causal; outputs O and each row's log-sum-exp for the backward), so no [Tq, Tk]
// scores or probabilities are kept between the forward and the backward. Recognised:
//   scores = MatMul(Q, K^T), or MatMul(Mul(Q, a), Mul(K^T, b)) (torch 2.x's SDPA export);
//   then optionally Div or Mul by a scalar constant;
//   then optionally a mask: Where(C, scores, fill) or Where(C, fill, scores) with C a constant
//   bool tensor and fill a scalar constant (HF GPT-2, nanoGPT's masked_fill), or Add(scores, M)
//   or Add(M, scores) with M any tensor broadcastable to the scores (not both a Where and an
//   Add; in a training import, an M a trainable weight's gradient flows through (a learned
//   position bias) makes the node's mask_gradient = 1: its backward gives M a gradient);
//   Softmax over the last axis; optionally a Dropout that does nothing (no ratio, ratio 0 or
//   not in training mode); MatMul(probabilities, V).
// A constant mask that keeps exactly the keys j <= i of query i becomes causal = 1 (no mask
// tensor); any other Where mask becomes an additive float32 constant (0 where the score is kept,
// the fill elsewhere: the same softmax, while C leaves every query a key); an Add mask stays an
// input. K comes from K^T by swapping the last two dims of the Transpose that made it (or a new
// Transpose). A Softmax over the last axis fed by a MatMul that is not fused is reported with
// the reason (PassContext::not_fused).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "compiler/ir/graph.h"
#include "passes/attributes.h"
#include "passes/autodiff.h"
#include "passes/fusion_match.h"
#include "passes/host_tensor.h"
#include "passes/passes.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::passes {
namespace {

using ir::kNoId;
using ir::NodeId;
using ir::ValueId;

using fusion::private_value;
using fusion::producer;
using fusion::scalar_constant;

bool is_op(const ir::Node* n, std::string_view op) {
  return n != nullptr && !n->dead && n->op_type == op && n->domain.empty();
}

/// Whether a MatMul writes `v` or a value at most `hops` producers above it.
bool fed_by_matmul(const ir::Graph& g, ValueId v, int hops) {
  const ir::Node* n = v == kNoId ? nullptr : producer(g, v);
  if (n == nullptr) return false;
  if (is_op(n, "MatMul")) return true;
  if (hops == 0) return false;
  for (ValueId in : n->inputs)
    if (fed_by_matmul(g, in, hops - 1)) return true;
  return false;
}

/// A matched block; `nodes` are the ones the Attention node replaces.
struct Block {
  ValueId q = kNoId, kt = kNoId, v = kNoId, mask = kNoId, out = kNoId;
  double scale = 1.0;
  bool causal = false;
  /// The added mask is one a trainable weight's gradient flows through (a learned position
  /// bias): the node gets mask_gradient = 1, so the backward gives the mask its gradient.
  bool mask_gradient = false;
  std::vector<NodeId> nodes;
  // A Where mask to turn into an additive constant: the condition, the fill, and whether the
  // scores are kept where the condition holds.
  ValueId where_cond = kNoId;
  std::shared_ptr<const std::vector<uint8_t>> cond;  ///< Its values, row-major, and its shape.
  std::vector<int64_t> cond_shape;
  double fill = 0;
  bool kept_where_true = true;
};

/// The values of a bool tensor known at compile time: a constant, or a node that folding left
/// only because its output is large (HF GPT-2's causal buffer sliced to the sequence: 1024 x 1024
/// at GPT-2's length), evaluated here by folding's own host evaluator without that limit.
std::optional<std::vector<uint8_t>> bool_constant(const ir::Graph& g, ValueId v) {
  const ir::Value& value = g.value(v);
  if (value.dtype != DType::kBool || !value.shape_known) return std::nullopt;
  if (value.is_initializer()) {  // bools are a byte each: no decoding
    const auto bytes = value.initializer->bytes();
    if (static_cast<int64_t>(bytes.size()) != value.numel()) return std::nullopt;
    std::vector<uint8_t> out(bytes.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = bytes[i] != std::byte{0};
    return out;
  }
  const ir::Node* n = producer(g, v);
  if (n == nullptr) return std::nullopt;
  auto constant = [&](ValueId in) {
    return in == kNoId || !g.value(in).is_initializer() ? std::nullopt
                                                        : HostTensor::from_value(g.value(in));
  };
  // A slice of a mask buffer (every GPT export's): the buffer's bytes straight to the mask.
  if (n->op_type == "Slice" && !n->inputs.empty() && n->inputs[0] != kNoId &&
      g.value(n->inputs[0]).is_initializer()) {
    const ir::Value& data = g.value(n->inputs[0]);
    std::vector<std::optional<HostTensor>> rest;
    for (std::size_t i = 1; i < n->inputs.size(); ++i) rest.push_back(constant(n->inputs[i]));
    auto sliced = bool_slice_on_host(*n, data.shape, data.initializer->bytes(), rest, g.opset);
    if (sliced && static_cast<int64_t>(sliced->size()) == value.numel()) return sliced;
  }
  std::vector<std::optional<HostTensor>> inputs;
  for (ValueId in : n->inputs) inputs.push_back(constant(in));
  auto outputs = evaluate_on_host(*n, inputs, {}, g.opset, value.numel());
  if (!outputs || outputs->empty() || outputs->front().numel() != value.numel())
    return std::nullopt;
  const HostTensor& host = outputs->front();
  std::vector<uint8_t> out(static_cast<size_t>(host.numel()));
  if (host.is_real()) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(host.reals[i]) != 0;
  } else {
    for (size_t i = 0; i < out.size(); ++i) out[i] = host.ints[i] != 0;
  }
  return out;
}

/// The masks of one run of the pass by what makes them. Every layer of a GPT export slices the
/// same causal buffer with the same bounds (the 175B shape: 96 slices of a 2048 x 2048 buffer),
/// so each distinct mask is evaluated and checked for causality once, not once per layer.
class MaskCache {
 public:
  /// bool_constant(g, v), shared with every earlier mask made the same way.
  std::shared_ptr<const std::vector<uint8_t>> values(const ir::Graph& g, ValueId v) {
    const std::string k = key(g, v);
    if (k.empty()) return make(g, v);  // no producer: not a constant (nullptr)
    auto [it, added] = values_.try_emplace(k);
    if (added) it->second = make(g, v);
    return it->second;
  }

  /// `check()` once per mask (by the address of values() the cache holds), scores' shape and
  /// kept value; `tq` -1 for a check that does not depend on the shape.
  bool memo(const std::vector<uint8_t>* mask, int64_t tq, int64_t tk, bool keep,
            const std::function<bool()>& check) {
    auto [it, added] = causal_.try_emplace(std::make_tuple(mask, tq, tk, keep), false);
    if (added) it->second = check();
    return it->second;
  }

 private:
  static std::shared_ptr<const std::vector<uint8_t>> make(const ir::Graph& g, ValueId v) {
    auto values = bool_constant(g, v);
    return values ? std::make_shared<const std::vector<uint8_t>>(std::move(*values)) : nullptr;
  }

  /// What makes `v`: the initializer itself, or the producing node's op, attributes and inputs
  /// (small constants by their bytes, so equal bounds in separate constants match; anything
  /// else by its id). "" when `v` has no producer.
  static std::string key(const ir::Graph& g, ValueId v) {
    const ir::Value& value = g.value(v);
    if (value.is_initializer()) return fmt::format("v{}", v);
    const ir::Node* n = producer(g, v);
    if (n == nullptr) return "";
    std::string k =
        fmt::format("{}:{}:{}:{}", n->domain, n->op_type, value.numel(), n->inputs.size());
    for (const onnx::AttributeProto& a : n->attributes) k += "|a" + a.SerializeAsString();
    for (ValueId in : n->inputs) {
      if (in == kNoId) {
        k += "|-";
        continue;
      }
      const ir::Value& input = g.value(in);
      if (input.is_initializer() && input.initializer->bytes().size() <= 64) {
        const auto bytes = input.initializer->bytes();
        k += fmt::format("|c{}:", static_cast<int>(input.dtype));
        k.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      } else {
        k += fmt::format("|v{}", in);
      }
    }
    return k;
  }

  std::map<std::string, std::shared_ptr<const std::vector<uint8_t>>> values_;
  std::map<std::tuple<const std::vector<uint8_t>*, int64_t, int64_t, bool>, bool> causal_;
};

/// Whether the bool mask `cond` of `shape`, broadcast to [..., tq, tk], keeps (== keep_value)
/// exactly the keys j <= i of each query i: a causal mask.
bool is_causal(const std::vector<uint8_t>& cond, const std::vector<int64_t>& shape, int64_t tq,
               int64_t tk, bool keep_value) {
  if (shape.size() < 2 || shape[shape.size() - 2] != tq || shape.back() != tk) return false;
  const int64_t planes = static_cast<int64_t>(cond.size()) / (tq * tk);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < tq; ++i)
      for (int64_t j = 0; j < tk; ++j) {
        const bool keep = (cond[static_cast<size_t>((p * tq + i) * tk + j)] != 0) == keep_value;
        if (keep != (j <= i)) return false;
      }
  return true;
}

/// Whether `v` is attention scores: a MatMul's product, through at most a Where (its data
/// operands) and a scale (Div or Mul by a scalar constant). An additive mask is not: Hugging
/// Face's (1 - attention_mask) * min is a Mul by a scalar of a Sub.
bool scores_like(const ir::Graph& g, ValueId v, int hops = 2) {
  const ir::Node* n = v == kNoId ? nullptr : producer(g, v);
  if (n == nullptr) return false;
  if (is_op(n, "MatMul")) return true;
  if (hops == 0) return false;
  if ((is_op(n, "Div") || is_op(n, "Mul")) && scalar_constant(g, n->inputs[1]))
    return scores_like(g, n->inputs[0], hops - 1);
  if (is_op(n, "Where"))
    return scores_like(g, n->inputs[1], hops - 1) || scores_like(g, n->inputs[2], hops - 1);
  return false;
}

/// A trainable weight (a float32 initializer marked as a weight, not frozen, one PyTorch would
/// train: passes::untrainable_reason) whose gradient flows through `v`, reached upstream along
/// gradient paths (passes/autodiff.h); kNoId when there is none.
ValueId weight_behind(const ir::Graph& g, ValueId v) {
  std::vector<ValueId> stack{v};
  std::unordered_set<ValueId> seen;
  while (!stack.empty()) {
    const ValueId at = stack.back();
    stack.pop_back();
    if (!seen.insert(at).second) continue;
    const ir::Value& value = g.value(at);
    if (value.is_initializer()) {
      // A mask buffer (-inf entries, or read only by Adds into a Softmax) the planner freezes.
      if (value.is_weight && !value.frozen && value.dtype == DType::kFloat32 &&
          untrainable_reason(g, value).empty())
        return at;
      continue;
    }
    const ir::Node* n = producer(g, at);
    if (n == nullptr) continue;
    for (std::size_t k = 0; k < n->inputs.size(); ++k)
      if (on_gradient_path(g, *n, k)) stack.push_back(n->inputs[k]);
  }
  return kNoId;
}

/// Whether the bool mask `cond` of `shape` keeps (== keep_value) at least one key (last dim) of
/// every row: so does every row it broadcasts to.
bool every_row_keeps(const std::vector<uint8_t>& cond, const std::vector<int64_t>& shape,
                     bool keep_value) {
  const int64_t keys = shape.empty() ? 1 : shape.back();
  if (keys <= 0) return false;
  for (size_t row = 0; row < cond.size(); row += static_cast<size_t>(keys)) {
    bool kept = false;
    for (int64_t j = 0; j < keys && !kept; ++j)
      kept = (cond[row + static_cast<size_t>(j)] != 0) == keep_value;
    if (!kept) return false;
  }
  return true;
}

/// The reason the Softmax `softmax` and its neighbours are not one attention block, or "" with
/// `block` filled. `training`: the graph is imported to be trained.
std::string match(const ir::Graph& g, NodeId softmax, Block& block, MaskCache& masks,
                  bool training) {
  const ir::Node& sm = g.node(softmax);
  const ValueId probs = sm.outputs[0];
  const ir::Value& x = g.value(sm.inputs[0]);
  const auto rank = static_cast<int64_t>(x.shape.size());
  const int64_t axis = sm.attr_int("axis", g.opset < 13 ? 1 : -1);
  if (rank < 3 || (axis != -1 && axis != rank - 1)) return "the Softmax is not over the last axis";
  block.nodes.push_back(softmax);
  // Forward: [Dropout that does nothing] then MatMul(probabilities, V).
  if (!private_value(g, probs))
    return "the probabilities are read elsewhere (another node or a graph output)";
  ValueId p = probs;
  const ir::Node* next = &g.node(g.value(p).consumers[0]);
  if (is_op(next, "Dropout")) {
    const auto ratio = next->inputs.size() > 1 ? scalar_constant(g, next->inputs[1]) : 0.0;
    // training_mode (input 2) absent or a constant false: the Dropout passes its input through.
    bool training = next->inputs.size() > 2 && next->inputs[2] != kNoId;
    if (training && g.value(next->inputs[2]).is_initializer()) {
      const auto bytes = g.value(next->inputs[2]).initializer->bytes();
      training = !bytes.empty() && bytes[0] != std::byte{0};
    }
    if (training && ratio.value_or(1.0) != 0.0)
      return "dropout on the probabilities in training mode";
    if (next->outputs.size() > 1 && next->outputs[1] != kNoId &&
        !g.value(next->outputs[1]).consumers.empty())
      return "the Dropout's mask is read";
    block.nodes.push_back(g.value(p).consumers[0]);
    p = next->outputs[0];
    if (!private_value(g, p))
      return "the probabilities are read elsewhere (another node or a graph output)";
    next = &g.node(g.value(p).consumers[0]);
  }
  if (!is_op(next, "MatMul") || next->inputs[0] != p)
    return "the probabilities do not feed a MatMul with V";
  block.nodes.push_back(g.value(p).consumers[0]);
  block.v = next->inputs[1];
  block.out = next->outputs[0];
  // Backward from the Softmax: [mask] [scale] MatMul(Q, K^T). The mask: a Where with a
  // constant condition or an Add.
  ValueId s = sm.inputs[0];
  const ir::Node* n = producer(g, s);
  if (is_op(n, "Where") && private_value(g, s)) {
    const ValueId cond = n->inputs[0];
    const auto fill1 = scalar_constant(g, n->inputs[1]), fill2 = scalar_constant(g, n->inputs[2]);
    block.cond = masks.values(g, cond);
    if (!block.cond) return "the Where's condition is not known at compile time";
    block.cond_shape = g.value(cond).shape;
    // A Slice that cut the condition from a buffer goes with the block.
    if (!g.value(cond).is_initializer() && private_value(g, cond))
      block.nodes.push_back(g.value(cond).producer);
    if (!fill1 && !fill2) return "the Where picks between two tensors, not a score and a fill";
    block.where_cond = cond;
    block.kept_where_true = !fill2.has_value() ? false : true;
    block.fill = fill2 ? *fill2 : *fill1;
    if (!(block.fill <= -1e30))
      return fmt::format("the Where's fill {} is not -inf or the float minimum", block.fill);
    block.nodes.push_back(g.value(s).producer);
    s = n->inputs[block.kept_where_true ? 1 : 2];
    n = producer(g, s);
  } else if (is_op(n, "Add") && private_value(g, s)) {
    // The scores are the operand that leads to the product; the other is the mask.
    const bool first = scores_like(g, n->inputs[0]), second = scores_like(g, n->inputs[1]);
    if (first == second)
      return first ? "both operands of the mask's Add are products of the scores' form"
                   : "neither operand of the mask's Add is the scores";
    block.mask = n->inputs[first ? 1 : 0];
    block.nodes.push_back(g.value(s).producer);
    s = n->inputs[first ? 0 : 1];
    n = producer(g, s);
  }
  // Both, in either order (HF GPT-2 given an attention_mask: Add(Where(causal, scores, fill),
  // mask)): the Where cuts the gradient of the scores it removes, the Add does not, and an added
  // mask made at run time (padding) can leave a query only keys the Where removed (a left-padded
  // row): one additive mask (or causal = 1) would train such rows otherwise than the graph.
  if ((block.where_cond != kNoId || block.mask != kNoId) &&
      is_op(n, block.where_cond != kNoId ? "Add" : "Where") && private_value(g, s))
    return "a Where mask and an added mask together (the fused op has one additive mask: a "
           "query left with no key would get other gradients)";
  if ((is_op(n, "Div") || is_op(n, "Mul")) && private_value(g, s)) {
    const auto c = scalar_constant(g, n->inputs[1]);
    if (!c || *c == 0) return fmt::format("the scores are scaled by a tensor, not a constant");
    block.scale = n->op_type == "Div" ? 1.0 / *c : *c;
    block.nodes.push_back(g.value(s).producer);
    s = n->inputs[0];
    n = producer(g, s);
  }
  if (!is_op(n, "MatMul") || !private_value(g, s)) return "the scores are not a MatMul's";
  block.nodes.push_back(g.value(s).producer);
  block.q = n->inputs[0];
  block.kt = n->inputs[1];
  // torch 2.x: sqrt(scale) on Q and on K^T before the product.
  const ir::Node* mq = producer(g, block.q);
  const ir::Node* mk = producer(g, block.kt);
  if (is_op(mq, "Mul") && is_op(mk, "Mul") && private_value(g, block.q) &&
      private_value(g, block.kt)) {
    const auto a = scalar_constant(g, mq->inputs[1]), b = scalar_constant(g, mk->inputs[1]);
    if (a && b) {
      block.scale *= *a * *b;
      block.nodes.push_back(g.value(block.q).producer);
      block.nodes.push_back(g.value(block.kt).producer);
      block.q = mq->inputs[0];
      block.kt = mk->inputs[0];
    }
  }
  // Shapes: Q [..., Tq, d], K^T [..., d, Tk], V [..., Tk, dv], leading dims equal.
  const auto& qs = g.value(block.q).shape;
  const auto& ks = g.value(block.kt).shape;
  const auto& vs = g.value(block.v).shape;
  if (qs.size() != static_cast<size_t>(rank) || ks.size() != qs.size() || vs.size() != qs.size())
    return "Q, K and V do not have the scores' rank (a broadcast product)";
  for (int64_t d = 0; d + 2 < rank; ++d)
    if (qs[d] != ks[d] || qs[d] != vs[d]) return "Q, K and V differ in their leading dims";
  if (qs[rank - 1] != ks[rank - 2] || ks[rank - 1] != vs[rank - 2])
    return "the products' inner dims do not match";
  for (ValueId v : {block.q, block.kt, block.v, block.out})
    if (g.value(v).dtype != DType::kFloat32) return "not float32";
  if (block.where_cond != kNoId) {
    const int64_t tq = qs[rank - 2], tk = ks[rank - 1];
    block.causal = masks.memo(block.cond.get(), tq, tk, block.kept_where_true, [&] {
      return is_causal(*block.cond, block.cond_shape, tq, tk, block.kept_where_true);
    });
    // As an additive constant the fill is added to the score rather than put in its place: the
    // same softmax while a row keeps a key (the fill's exp is 0), but a row the mask removes
    // whole would pass gradients to the scores the Where cut off.
    if (!block.causal && !masks.memo(block.cond.get(), -1, -1, block.kept_where_true, [&] {
          return every_row_keeps(*block.cond, block.cond_shape, block.kept_where_true);
        }))
      return "the Where's condition removes every key of some query";
  }
  if (block.mask != kNoId) {
    const auto& ms = g.value(block.mask).shape;
    if (g.value(block.mask).dtype != DType::kFloat32) return "the added mask is not float32";
    if (ms.size() > static_cast<size_t>(rank)) return "the added mask has a higher rank";
    // A mask a weight's gradient flows through (Swin's and T5's learned relative position
    // bias) takes its gradient from the fused node (mask_gradient); a constant or frozen one
    // takes none, so its producers wait for nothing.
    block.mask_gradient = training && weight_behind(g, block.mask) != kNoId;
  }
  return "";
}

/// A float32 initializer `name` of `shape` holding `values`.
ValueId add_constant(ir::Graph& g, const std::string& name, const std::vector<int64_t>& shape,
                     const std::vector<float>& values) {
  ir::Value v;
  v.name = name;
  v.dtype = DType::kFloat32;
  v.shape = shape;
  v.shape_known = true;
  v.initializer = ir::WeightData::owned(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  return g.add_value(std::move(v));
}

/// A name for a new value or node, not yet taken.
std::string fresh(const ir::Graph& g, const std::string& base) {
  std::string name = base;
  for (int k = 1; g.find_value(name); ++k) name = fmt::format("{}_{}", base, k);
  return name;
}

/// K from K^T: the Transpose that made K^T with its last two dims swapped, or a new Transpose.
ValueId untranspose(ir::Graph& g, ValueId kt, const std::string& prefix) {
  const ir::Value& value = g.value(kt);
  const auto rank = static_cast<int64_t>(value.shape.size());
  std::vector<int64_t> perm(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) perm[d] = d;
  ValueId source = kt;
  // The block's nodes are gone: K^T is the Transpose's alone when nothing else reads it now.
  if (const ir::Node* t = producer(g, kt);
      is_op(t, "Transpose") && value.consumers.empty() && !value.is_graph_output) {
    perm = t->attr_ints("perm");
    if (perm.empty())
      for (int64_t d = 0; d < rank; ++d) perm.push_back(rank - 1 - d);
    source = t->inputs[0];
    g.remove_node(value.producer);
  }
  std::swap(perm[rank - 2], perm[rank - 1]);
  bool identity = true;
  for (int64_t d = 0; d < rank; ++d) identity = identity && perm[d] == d;
  if (identity) return source;
  ir::Value k;
  k.name = fresh(g, prefix + "/K");
  k.dtype = value.dtype;
  k.shape = value.shape;
  std::swap(k.shape[rank - 2], k.shape[rank - 1]);
  k.shape_known = true;
  const ValueId id = g.add_value(std::move(k));
  ir::Node n;
  n.name = g.fresh_node_name(g.value(id).name);
  n.op_type = "Transpose";
  n.inputs = {source};
  n.outputs = {id};
  n.attributes = {ints_attribute("perm", perm)};
  g.add_node(std::move(n));
  return id;
}

/// The additive constants the blocks of one run share: every layer of a model reads the same
/// Where mask, so its additive form is made once, not once per layer.
using SharedMasks = std::map<std::tuple<const std::vector<uint8_t>*, bool, double>, ValueId>;

/// The mask the Attention node reads: the added one, or the Where's as an additive constant (0
/// where the score is kept, the fill elsewhere: the same softmax).
ValueId block_mask(ir::Graph& g, const Block& b, const std::string& prefix, SharedMasks& shared) {
  if (b.where_cond == kNoId || b.causal) return b.mask;
  auto [at, added] = shared.try_emplace({b.cond.get(), b.kept_where_true, b.fill}, kNoId);
  if (added) {
    const std::vector<uint8_t>& cond = *b.cond;
    std::vector<float> values(cond.size());
    for (size_t i = 0; i < cond.size(); ++i)
      values[i] = ((cond[i] != 0) == b.kept_where_true) ? 0.0f : static_cast<float>(b.fill);
    at->second = add_constant(g, fresh(g, prefix + "/additive_mask"), b.cond_shape, values);
  }
  return at->second;
}

/// Replaces the matched block by one Attention node.
void fuse(ir::Graph& g, const ir::Node& softmax, const Block& b, SharedMasks& shared) {
  const std::string prefix = softmax.name.empty() ? g.value(b.out).name : softmax.name;
  const ValueId mask = block_mask(g, b, prefix, shared);
  std::vector<NodeId> gone = b.nodes;
  for (NodeId id : gone) g.remove_node(id);
  const ValueId k = untranspose(g, b.kt, prefix);
  ir::Value lse;
  lse.name = fresh(g, prefix + "/lse");
  lse.dtype = DType::kFloat32;
  lse.shape = g.value(b.q).shape;
  lse.shape.pop_back();
  lse.shape_known = true;
  const ValueId lse_id = g.add_value(std::move(lse));
  ir::Node n;
  n.name = g.fresh_node_name(prefix + "/Attention");
  n.op_type = "Attention";
  n.domain = std::string(grad::kGradDomain);
  n.inputs = {b.q, k, b.v};
  if (mask != kNoId) n.inputs.push_back(mask);
  n.outputs = {b.out, lse_id};
  n.attributes = {float_attribute("scale", static_cast<float>(b.scale)),
                  int_attribute("causal", b.causal ? 1 : 0)};
  if (b.mask_gradient) n.attributes.push_back(int_attribute("mask_gradient", 1));
  g.add_node(std::move(n));
}

}  // namespace

bool FuseAttention::run(ir::Graph& graph, PassContext& context) const {
  bool changed = false;
  const std::vector<NodeId> order = graph.topological_order();
  MaskCache masks;
  SharedMasks shared;
  for (NodeId id : order) {
    const ir::Node& node = graph.node(id);
    if (node.dead || node.op_type != "Softmax" || !node.domain.empty()) continue;
    // Only a Softmax fed by a product (through a scale and a mask) looks like attention.
    if (!fed_by_matmul(graph, node.inputs[0], 3)) continue;
    Block block;
    const std::string why = match(graph, id, block, masks, context.training);
    if (!why.empty()) {
      context.not_fused.push_back(fmt::format("{}: {}", node.describe(graph), why));
      continue;
    }
    fuse(graph, node, block, shared);
    graph.opset_imports[std::string(grad::kGradDomain)] = grad::kGradDomainVersion;
    ++context.counters[std::string(name())];
    changed = true;
  }
  if (changed) graph.compact();
  return changed;
}

}  // namespace stagecraft::passes
