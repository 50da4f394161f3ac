#pragma once
/// \file
/// The loss ops' host-side rules both backends read a node with (runtime/cpu/loss.cpp,
/// runtime/cuda/loss.cpp), so they resolve and refuse alike.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/reductions.h"

namespace stagecraft::rt::ops {

/// The node's `reduction` attribute (default "mean"); `Error(kModel)` naming op `op` and the
/// value otherwise.
inline LossReduction loss_reduction_of(const Attrs& attrs, std::string_view op) {
  const std::string r = attrs.s("reduction", "mean");
  if (r == "mean") return LossReduction::kMean;
  if (r == "sum") return LossReduction::kSum;
  if (r == "none") return LossReduction::kNone;
  fail(ErrorKind::kModel, "{} reduction '{}' is not one of mean, sum, none", op, r);
}

/// One SoftmaxCrossEntropyLoss node resolved on the host: scores [N, C, D...] as N x C x D, the
/// reduction, every position's label and weight (0 where ignored: ignore_index) and the mean's
/// divisor (the weights' sum).
struct SceProblem {
  int64_t n = 0, c = 0, d = 0;
  LossReduction reduction = LossReduction::kMean;
  std::vector<int64_t> labels;  ///< [N * D]
  std::vector<float> weights;   ///< [N * D]: 0 where ignored
  double weight_sum = 0;
};

/// Node `a`'s sizes and reduction from its scores, labels and optional class weights, their
/// shapes and the labels' dtype (int32, int64) checked; `labels` and `weights` left empty
/// (`sce_weights` fills them). `Error(kShape)` / `Error(kUnsupported)` naming the op.
inline SceProblem sce_shape(const KernelArgs& a, const Tensor& scores, const Tensor& labels,
                            const Tensor* weights) {
  SceProblem p;
  p.reduction = loss_reduction_of(a.attrs, a.op_type);
  if (scores.rank() < 2)
    fail(ErrorKind::kShape, "{}: scores {} must be [N, C, ...]", a.op_type, scores.describe());
  p.n = scores.shape[0];
  p.c = scores.shape[1];
  p.d = 1;
  for (int64_t i = 2; i < scores.rank(); ++i) p.d *= scores.shape[i];
  Shape want_labels{scores.shape[0]};
  want_labels.insert(want_labels.end(), scores.shape.begin() + 2, scores.shape.end());
  if (labels.shape != want_labels)
    fail(ErrorKind::kShape, "{}: labels {} do not match scores {} (expected {})", a.op_type,
         labels.describe(), scores.describe(), shape_string(want_labels));
  if (weights && weights->shape != Shape{p.c})
    fail(ErrorKind::kShape, "{}: weights {} should be [{}]", a.op_type, weights->describe(), p.c);
  if (labels.dtype != DType::kInt64 && labels.dtype != DType::kInt32)
    fail(ErrorKind::kUnsupported, "{}: labels of {} are not supported (int32, int64)", a.op_type,
         dtype_name(labels.dtype));
  return p;
}

/// Fills `p`'s labels (`labels`: every position's, read to the host) and weights from the class
/// weights (`class_weights`: the weights input read to the host; empty when absent), with
/// ignore_index. `Error(kModel)` for a label outside [0, C) that is not ignored.
inline void sce_weights(const KernelArgs& a, SceProblem& p, std::vector<int64_t> labels,
                        const std::vector<float>& class_weights) {
  const bool has_ignore = a.attrs.has("ignore_index");
  const int64_t ignore = a.attrs.i("ignore_index", 0);
  p.labels = std::move(labels);
  p.weights.assign(p.labels.size(), 0.0f);
  p.weight_sum = 0;
  for (size_t i = 0; i < p.labels.size(); ++i) {
    const int64_t t = p.labels[i];
    if (has_ignore && t == ignore) continue;
    if (t < 0 || t >= p.c)
      fail(ErrorKind::kModel, "{}: label {} at position {} is outside [0, {})", a.op_type, t, i,
           p.c);
    p.weights[i] = class_weights.empty() ? 1.0f : class_weights[static_cast<size_t>(t)];
    p.weight_sum += p.weights[i];
  }
}

/// The loss output's shape: the labels' with reduction "none", else a scalar.
inline Shape sce_loss_shape(const SceProblem& p, const Tensor& labels) {
  return p.reduction == LossReduction::kNone ? labels.shape : Shape{};
}

/// A loss gradient's dloss (null when omitted: no gradient) checked against the loss of `p` and
/// `labels`; its values, or null.
inline const float* loss_gradient(const KernelArgs& a, const SceProblem& p, const Tensor& labels,
                                  const Tensor* dloss) {
  if (dloss == nullptr) return nullptr;
  const Shape ls = sce_loss_shape(p, labels);
  if (shape_numel(dloss->shape) != shape_numel(ls))
    fail(ErrorKind::kShape, "{}: the loss gradient {} should be {}", a.op_type, dloss->describe(),
         shape_string(ls));
  return dloss->as<float>();
}

/// Position i's factor g of a loss gradient (`dl`, null: none): dl[i] for reduction none, dl[0]
/// for sum, dl[0] / the weights' sum for mean (0 when that is 0).
inline float loss_gradient_factor(const SceProblem& p, const float* dl, int64_t i) {
  if (dl == nullptr) return 0.0f;
  if (p.reduction == LossReduction::kNone) return dl[i];
  if (p.reduction == LossReduction::kSum) return dl[0];
  return p.weight_sum != 0 ? static_cast<float>(dl[0] / p.weight_sum) : 0.0f;
}

/// SoftmaxCrossEntropyLossGrad's operand counts: scores, labels, [weights]; loss, [log_prob].
inline constexpr GradArity kSceGradArity{.n_min = 2, .n_max = 3, .m_min = 1, .m_max = 2};

/// NegativeLogLikelihoodLossGrad's operand counts: input, labels, [weights]; loss.
inline constexpr GradArity kNllGradArity{.n_min = 2, .n_max = 3, .m_min = 1, .m_max = 1};

/// Both backends' check of the losses and their gradients (`arity`: the gradient's operand
/// counts): scores of float32, or of bfloat16 and float16 where `sixteen_bit_scores`
/// (SoftmaxCrossEntropyLoss's, a mixed plan's loss; NegativeLogLikelihoodLoss runs 16-bit inputs
/// widened), int32 or int64 labels, float32 class weights and other inputs, float32 outputs but
/// a gradient's dscores (of the scores' type), no gradient of the labels or the weights, a known
/// reduction.
inline std::string check_loss(const OpSignature& s, const GradArity& arity,
                              bool sixteen_bit_scores) {
  const bool grad = s.op_type.ends_with(grad::kGradSuffix);
  if (grad)
    if (std::string why = grad_arity_error(s, arity); !why.empty()) return why;
  if (s.inputs.size() < 2) return fmt::format("{} needs scores and labels", s.op_type);
  if (s.inputs[0] != DType::kFloat32 && !(sixteen_bit_scores && is_16bit_float(s.inputs[0])))
    return fmt::format("{} on {} scores is not supported ({})", s.op_type, dtype_name(s.inputs[0]),
                       sixteen_bit_scores ? "float32, bfloat16 or float16" : "float32");
  if (s.inputs[1] != DType::kInt64 && s.inputs[1] != DType::kInt32)
    return fmt::format("{} with {} labels is not supported (int32 and int64 only)", s.op_type,
                       dtype_name(s.inputs[1]));
  for (size_t k = 2; k < s.inputs.size(); ++k)
    if (s.inputs[k] != DType::kUndefined && s.inputs[k] != DType::kFloat32)
      return fmt::format("{} input {} of {} is not supported (float32 only)", s.op_type, k,
                         dtype_name(s.inputs[k]));
  if (grad && s.outputs.size() > 1 && s.outputs[1] != DType::kUndefined)
    return "labels have no gradient";
  if (grad && s.outputs.size() > 2 && s.outputs[2] != DType::kUndefined)
    return fmt::format("the gradient of {}'s class weights is not supported", s.op_type);
  for (size_t k = 0; k < s.outputs.size(); ++k) {
    const DType wanted = grad && k == 0 ? s.inputs[0] : DType::kFloat32;
    if (s.outputs[k] != DType::kUndefined && s.outputs[k] != wanted)
      return fmt::format("{} output {} of {} is not supported ({} only)", s.op_type, k,
                         dtype_name(s.outputs[k]), dtype_name(wanted));
  }
  const std::string r = s.attrs.s("reduction", "mean");
  if (r != "mean" && r != "sum" && r != "none")
    return fmt::format("{} reduction '{}' is not one of mean, sum, none", s.op_type, r);
  return "";
}

inline std::string check_nll(const OpSignature& s) { return check_loss(s, kNllGradArity, false); }

/// Whether the gradient node wants dscores; a wanted gradient of the labels or of the class
/// weights is refused (neither has one here).
inline bool sce_grad_wanted(const KernelArgs& a, const GradIo& io) {
  if (io.wants(1)) fail(ErrorKind::kUnsupported, "{}: labels have no gradient", a.op_type);
  if (io.wants(2))
    fail(ErrorKind::kUnsupported, "{}: the gradient of the class weights is not supported",
         a.op_type);
  return io.wants(0);
}

}  // namespace stagecraft::rt::ops
