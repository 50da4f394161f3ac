#pragma once
/// \file
/// The fused Attention op (domain ai.stagecraft) and its gradient, read by one set of rules for
/// the CPU kernels (runtime/cpu/attention.cpp) and the CUDA ones (runtime/cuda/attention.cpp).
///
/// Attention(Q [..., Tq, d], K [..., Tk, d], V [..., Tk, dv], mask?) -> O [..., Tq, dv], lse?
/// [..., Tq]: O = softmax(scale * Q K^T + mask) V over the keys, lse each query's log-sum-exp of
/// those scores. Q, K and V have the same leading dims (rank 3 or more, no broadcasting among
/// them); the optional float32 mask is added to the scores and broadcasts to [..., Tq, Tk] by
/// numpy's rules. Attributes: `scale` (default 1/sqrt(d)) and `causal` (default 0; 1: query i
/// sees keys j <= i only, top-left aligned as torch's scaled_dot_product_attention(is_causal=
/// True)). A query that sees no key (its every score -inf) gets O = 0 and lse = -inf.
///
/// AttentionGrad follows runtime/format/grad_ops.h: inputs Q, K, V, mask, O, lse, dO, dlse;
/// outputs dQ, dK, dV, dmask. An absent lse (or O) is recomputed, an absent dO or dlse is
/// zeros. dmask, where asked for (a learned position bias: the forward node's mask_gradient =
/// 1, passes/fuse_attention.cpp), is dS = P * (dP - D) summed over the dims the mask broadcasts
/// along, in the mask's shape. A refusal is one line naming the op, the node and the shapes.

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <string_view>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/attention_element.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::ops {

/// AttentionGrad's operand counts: Q, K, V and the optional mask; O and the optional lse.
inline constexpr GradArity kAttentionGradArity{.n_min = 3, .n_max = 4, .m_min = 1, .m_max = 2};

/// "" when the node's attributes are ones the kernels take (causal 0 or 1), else why not.
inline std::string attention_attribute_error(std::string_view op, const Attrs& attrs) {
  const int64_t causal = attrs.i("causal", 0);
  if (causal != 0 && causal != 1) return fmt::format("{} with causal={} (0 or 1)", op, causal);
  return "";
}

/// "" when an Attention signature has the operands the kernels take: Q, K, V and an optional
/// mask; O and an optional lse. The backends add their dtype rules.
inline std::string attention_signature_error(const OpSignature& s) {
  if (s.inputs.size() < 3 || s.inputs.size() > 4 || s.inputs[0] == DType::kUndefined ||
      s.inputs[1] == DType::kUndefined || s.inputs[2] == DType::kUndefined)
    return fmt::format("{} with {} inputs: expected Q, K, V and an optional mask", s.op_type,
                       s.inputs.size());
  if (s.outputs.empty() || s.outputs.size() > 2 || s.outputs[0] == DType::kUndefined)
    return fmt::format("{} with {} outputs: expected O and an optional lse", s.op_type,
                       s.outputs.size());
  return attention_attribute_error(s.op_type, s.attrs);
}

/// "" when an AttentionGrad signature keeps the contract with Attention's operands.
inline std::string attention_grad_signature_error(const OpSignature& s) {
  if (std::string why = grad_arity_error(s, kAttentionGradArity); !why.empty()) return why;
  return attention_attribute_error(s.op_type, s.attrs);
}

namespace detail {

/// The mask's strides broadcast to `scores` ([lead..., Tq, Tk]) into `s`; throws when it does
/// not broadcast.
inline void attention_mask_strides(const KernelArgs& a, const Tensor& mask, const Shape& scores,
                                   AttentionDims& s) {
  const size_t rank = scores.size();
  bool fits = mask.shape.size() <= rank;
  int64_t stride = 1;
  Shape strides(rank, 0);
  for (size_t k = 0; fits && k < mask.shape.size(); ++k) {
    const size_t from_end = k + 1;  // mask dim rank_m - from_end meets scores dim rank - from_end
    const int64_t dim = mask.shape[mask.shape.size() - from_end];
    if (dim != 1 && dim != scores[rank - from_end]) fits = false;
    if (dim != 1) strides[rank - from_end] = stride;
    stride *= dim;
  }
  if (!fits)
    fail(ErrorKind::kShape, "{} '{}': the mask {} does not broadcast to the scores' shape {}",
         a.op_type, a.name, mask.describe(), shape_string(scores));
  s.has_mask = true;
  for (int32_t k = 0; k < s.lead_rank; ++k) s.mask_lead_strides[k] = strides[k];
  s.mask_row_stride = strides[rank - 2];
  s.mask_col_stride = strides[rank - 1];
}

}  // namespace detail

/// The geometry of node `a` from its operands (the mask may be null), checked: ranks, equal
/// leading dims, K and V's key count, Q and K's depth, the mask's broadcast, the attributes.
inline AttentionDims attention_dims(const KernelArgs& a, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor* mask) {
  const int64_t rank = q.rank();
  if (rank < 3 || rank > kMaxAttentionLeadDims + 2 || k.rank() != rank || v.rank() != rank)
    fail(ErrorKind::kShape,
         "{} '{}': Q {}, K {} and V {} must have one rank from 3 to {} ([..., T, d])", a.op_type,
         a.name, q.describe(), k.describe(), v.describe(), kMaxAttentionLeadDims + 2);
  const Shape lead(q.shape.begin(), q.shape.end() - 2);
  if (Shape(k.shape.begin(), k.shape.end() - 2) != lead ||
      Shape(v.shape.begin(), v.shape.end() - 2) != lead || k.shape[rank - 2] != v.shape[rank - 2] ||
      k.shape[rank - 1] != q.shape[rank - 1])
    fail(ErrorKind::kShape,
         "{} '{}': Q {}, K {} and V {} do not fit Q [..., Tq, d], K [..., Tk, d], V [..., Tk, dv] "
         "with the same leading dims",
         a.op_type, a.name, q.describe(), k.describe(), v.describe());
  if (std::string why = attention_attribute_error(a.op_type, a.attrs); !why.empty())
    fail(ErrorKind::kModel, "{} '{}': {}", a.op_type, a.name, why);
  AttentionDims s;
  s.batch = shape_numel(lead);
  s.tq = q.shape[rank - 2];
  s.tk = k.shape[rank - 2];
  s.d = q.shape[rank - 1];
  s.dv = v.shape[rank - 1];
  s.scale = a.attrs.f("scale", s.d > 0 ? 1.0f / std::sqrt(static_cast<float>(s.d)) : 1.0f);
  s.causal = a.attrs.i("causal", 0) != 0;
  s.lead_rank = static_cast<int32_t>(lead.size());
  for (int32_t i = 0; i < s.lead_rank; ++i) s.lead_dims[i] = lead[i];
  if (mask != nullptr) {
    Shape scores = lead;
    scores.push_back(s.tq);
    scores.push_back(s.tk);
    detail::attention_mask_strides(a, *mask, scores, s);
  }
  return s;
}

/// O's shape [..., Tq, dv] and lse's [..., Tq] for Q and V.
inline Shape attention_output_shape(const Tensor& q, const Tensor& v) {
  Shape o = q.shape;
  o.back() = v.shape.back();
  return o;
}
inline Shape attention_lse_shape(const Tensor& q) {
  return Shape(q.shape.begin(), q.shape.end() - 1);
}

/// An Attention node's operands, its outputs' shapes checked.
struct AttentionOperands {
  AttentionDims dims;
  const Tensor* q = nullptr;
  const Tensor* k = nullptr;
  const Tensor* v = nullptr;
  const Tensor* mask = nullptr;  ///< Null without a mask.
  Tensor* o = nullptr;
  Tensor* lse = nullptr;  ///< Null where not asked for.
};

inline AttentionOperands attention_operands(const KernelArgs& a) {
  AttentionOperands p;
  p.q = &a.input(0);
  p.k = &a.input(1);
  p.v = &a.input(2);
  p.mask = a.has_input(3) ? a.in[3] : nullptr;
  p.dims = attention_dims(a, *p.q, *p.k, *p.v, p.mask);
  p.o = a.out[0];
  expect_shape(a, 0, attention_output_shape(*p.q, *p.v));
  p.lse = a.out.size() > 1 ? a.out[1] : nullptr;
  if (p.lse) expect_shape(a, 1, attention_lse_shape(*p.q));
  return p;
}

/// An AttentionGrad node's operands: the forward's, their gradients' shapes checked.
struct AttentionGradOperands {
  AttentionOperands forward;  ///< o and lse: the forward outputs given (null where absent).
  const Tensor* o = nullptr;
  const Tensor* lse = nullptr;
  const Tensor* d_o = nullptr;   ///< Null: zeros.
  const Tensor* dlse = nullptr;  ///< Null: zeros.
  Tensor* dq = nullptr;          ///< The gradients asked for; null where not.
  Tensor* dk = nullptr;
  Tensor* dv = nullptr;
  Tensor* dmask = nullptr;  ///< The mask's shape.

  /// Whether there is nothing to compute: no gradient asked for, or every one zeros (no dO and
  /// no dlse, or no score at all). The kernel then zero-fills its outputs and is done.
  bool all_zero() const {
    const AttentionDims& s = forward.dims;
    return (dq == nullptr && dk == nullptr && dv == nullptr && dmask == nullptr) ||
           (d_o == nullptr && dlse == nullptr) || s.batch * s.tq * s.tk == 0;
  }
  /// Whether the forward must run again for O or lse, which the node does not pass.
  bool recomputes_forward() const { return o == nullptr || lse == nullptr; }
};

/// The operands of AttentionGrad node `a`, read through ops::GradIo with Attention's arity.
inline AttentionGradOperands attention_grad_operands(const KernelArgs& a) {
  const GradIo io(a, kAttentionGradArity);
  AttentionGradOperands g;
  AttentionOperands& f = g.forward;
  f.q = &io.need_x(0);
  f.k = &io.need_x(1);
  f.v = &io.need_x(2);
  f.mask = io.x(3);
  f.dims = attention_dims(a, *f.q, *f.k, *f.v, f.mask);
  const Shape o_shape = attention_output_shape(*f.q, *f.v);
  const Shape lse_shape = attention_lse_shape(*f.q);
  auto operand = [&](const Tensor* t, const Shape& shape, const char* what) {
    if (t != nullptr && t->shape != shape)
      fail(ErrorKind::kShape, "{} '{}': {} is {}, expected {}", a.op_type, a.name, what,
           t->describe(), shape_string(shape));
    return t;
  };
  g.o = operand(io.y(0), o_shape, "O");
  g.lse = operand(io.y(1), lse_shape, "lse");
  g.d_o = operand(io.dy(0), o_shape, "dO");
  g.dlse = operand(io.dy(1), lse_shape, "dlse");
  g.dq = io.dx(0);
  g.dk = io.dx(1);
  g.dv = io.dx(2);
  g.dmask = io.dx(3);
  if (g.dmask != nullptr && f.mask == nullptr)
    fail(ErrorKind::kModel, "{} '{}': the mask's gradient (output 3) is asked for without a mask",
         a.op_type, a.name);
  for (size_t k = 0; k < 4; ++k)
    if (io.wants(k)) expect_shape(a, k, a.in[k]->shape);
  return g;
}

}  // namespace stagecraft::rt::ops
