// Losses: SoftmaxCrossEntropyLoss (opset 13 semantics) and NegativeLogLikelihoodLoss, with their
// gradients (contract: runtime/format/grad_ops.h), in plain C++ on float32.
// The scores may be 16-bit (a mixed plan's loss, passes::reads_sixteen_bit_scores): each is
// widened exactly as it is read, the loss and log-probabilities stay float32, and the scores'
// gradient is computed in float32 and rounded once to their type: what a Cast to float32
// before the op and its gradient after give, to the bit.
//
// Scores [N, C, D1, ...] are read as [N, C, D] (D = D1 * ...), labels [N, D1, ...] as [N, D].
// Each position (n, d) has the log-softmax over C, a label t and a weight w: weights[t] (1
// without weights), 0 where t == ignore_index. Its loss is -w * log_prob[n, t, d]; "none"
// returns these, "sum" their sum, "mean" their sum divided by the sum of the weights (the
// number of positions without weights and without ignore_index). A mean over no weight at all
// (every position ignored) is 0 here, with a zero gradient, rather than ONNX's 0/0.
// NegativeLogLikelihoodLoss is the same with its input taken as the log-probabilities
// (F.nll_loss after F.log_softmax): loss -w * input[n, t, d], the same reductions and weights.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/eltwise_common.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/vectorise.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/loss_rules.h"

namespace stagecraft::rt::cpu {
namespace {

using ops::LossReduction;

using eltwise::BFloat16;
using eltwise::convert;
using eltwise::Half;
using ops::SceProblem;

// Reads the node's scores, labels and optional weights (inputs 0, 1, 2 of `in`).
SceProblem sce_problem(const KernelArgs& a, const Tensor& scores, const Tensor& labels,
                       const Tensor* weights) {
  SceProblem p = ops::sce_shape(a, scores, labels, weights);
  std::vector<int64_t> host(static_cast<size_t>(labels.numel()));
  for (size_t i = 0; i < host.size(); ++i)
    host[i] = labels.dtype == DType::kInt64 ? labels.as<int64_t>()[i] : labels.as<int32_t>()[i];
  std::vector<float> class_weights;
  if (weights) class_weights.assign(weights->as<float>(), weights->as<float>() + p.c);
  ops::sce_weights(a, p, std::move(host), class_weights);
  return p;
}

// log(sum(exp(x))) over the C values x[k * stride], computed as max + log(sum(exp(x - max))),
// each score widened as Cast widens it (convert: 16-bit floats exactly).
template <class S>
inline float log_normalizer(const S* x, int64_t c, int64_t stride) {
  float mx = convert<float>(x[0]);
  for (int64_t k = 1; k < c; ++k) mx = std::max(mx, convert<float>(x[k * stride]));
  double s = 0;
  for (int64_t k = 0; k < c; ++k)
    s += std::exp(static_cast<double>(convert<float>(x[k * stride]) - mx));
  return mx + static_cast<float>(std::log(s));
}

// The same for float32 scores of consecutive classes (D = 1, a language model's loss), in
// loops vectorised per vector unit: the exponentials by exp_simd (within an ulp of e^x), the
// sum still in double. glibc's exp, a call per class, was most of a step's loss (GPT-style
// training, 1024 positions of 1024 classes: 3.6 ms forward, 5.6 ms gradient).
STAGECRAFT_CPU_CLONES float log_normalizer_row(const float* x, int64_t c) {
  float mx = x[0];
#pragma omp simd reduction(max : mx)
  for (int64_t k = 1; k < c; ++k) mx = x[k] > mx ? x[k] : mx;
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < c; ++k) s += static_cast<double>(exp_simd(x[k] - mx));
  return mx + static_cast<float>(std::log(s));
}

// row[k] = coef * e^(x[k] - norm) + (dlp ? dlp[k] : 0) over the C classes of one position
// (float32 scores, D = 1): the gradient's softmax term.
STAGECRAFT_CPU_CLONES void softmax_term_row(const float* x, int64_t c, float norm, float coef,
                                            const float* dlp, float* row) {
  if (dlp) {
#pragma omp simd
    for (int64_t k = 0; k < c; ++k) row[k] = coef * exp_simd(x[k] - norm) + dlp[k];
  } else {
#pragma omp simd
    for (int64_t k = 0; k < c; ++k) row[k] = coef * exp_simd(x[k] - norm);
  }
}

// Calls body(S{}) with the scores' element type (float, BFloat16 or Half).
template <class Body>
void with_scores(DType dtype, Body body) {
  if (dtype == DType::kBFloat16) return body(BFloat16{});
  if (dtype == DType::kFloat16) return body(Half{});
  return body(float{});
}

void sce(const KernelArgs& a) {
  const Tensor& scores = a.input(0);
  const Tensor& labels = a.input(1);
  const Tensor* weights = a.has_input(2) ? &a.input(2) : nullptr;
  const SceProblem p = sce_problem(a, scores, labels, weights);
  expect_shape(a, 0, ops::sce_loss_shape(p, labels));
  Tensor* log_prob = a.out.size() > 1 ? a.out[1] : nullptr;
  if (log_prob) expect_shape(a, 1, scores.shape);
  float* loss = a.out[0]->as<float>();
  float* lp = log_prob ? log_prob->as<float>() : nullptr;
  const int64_t positions = p.n * p.d, C = p.c, D = p.d;
  if (C == 0 && positions > 0)
    fail(ErrorKind::kShape, "{}: scores {} have no classes", a.op_type, scores.describe());
  double total = 0;
  with_scores(scores.dtype, [&](auto tag) {
    using S = decltype(tag);
    const S* x = static_cast<const S*>(static_cast<const void*>(scores.data));
#pragma omp parallel for reduction(+ : total) if (positions * C > 32768)
    for (int64_t i = 0; i < positions; ++i) {
      const int64_t n = i / D, d = i % D;
      const S* xi = x + n * C * D + d;
      float norm;
      if constexpr (std::is_same_v<S, float>)
        norm = D == 1 ? log_normalizer_row(xi, C) : log_normalizer(xi, C, D);
      else
        norm = log_normalizer(xi, C, D);
      if (lp)
        for (int64_t k = 0; k < C; ++k)
          lp[n * C * D + k * D + d] = convert<float>(xi[k * D]) - norm;
      float l = 0.0f;
      if (p.weights[i] != 0.0f) l = -p.weights[i] * (convert<float>(xi[p.labels[i] * D]) - norm);
      if (p.reduction == LossReduction::kNone) loss[i] = l;
      total += l;
    }
  });
  if (p.reduction == LossReduction::kSum) loss[0] = static_cast<float>(total);
  if (p.reduction == LossReduction::kMean)
    loss[0] = p.weight_sum != 0 ? static_cast<float>(total / p.weight_sum) : 0.0f;
}

// Gradient: inputs scores, labels, weights ("" when omitted), loss, [log_prob], dloss,
// [dlog_prob]; output dscores (labels and weights get none). With p = softmax(scores):
//   dscores[n, c, d] = g[n, d] * w[n, d] * (p - [c == t]) + dlp - p * sum_c dlp
// where g is dloss (sum), dloss / sum(w) (mean), or dloss[n, d] (none).
// Writes every element of dscores: positions with no gradient get zeros.
void sce_grad(const KernelArgs& a) {
  const ops::GradIo io(a, ops::kSceGradArity);
  if (!ops::sce_grad_wanted(a, io)) return;
  const Tensor& scores = io.need_x(0);
  const Tensor& labels = io.need_x(1);
  const Tensor* weights = io.x(2);
  const SceProblem p = sce_problem(a, scores, labels, weights);
  expect_shape(a, 0, scores.shape);
  const float* dl = ops::loss_gradient(a, p, labels, io.dy(0));
  const Tensor* dlog_prob = io.dy(1);
  if (dlog_prob && dlog_prob->shape != scores.shape)
    fail(ErrorKind::kShape, "{}: the log_prob gradient {} should be {}", a.op_type,
         dlog_prob->describe(), shape_string(scores.shape));
  const float* dlp = dlog_prob ? dlog_prob->as<float>() : nullptr;
  const int64_t positions = p.n * p.d, C = p.c, D = p.d;
  // dscores in the scores' type, each element rounded once from float32.
  with_scores(scores.dtype, [&](auto tag) {
    using S = decltype(tag);
    const S* x = static_cast<const S*>(static_cast<const void*>(scores.data));
    S* dx = static_cast<S*>(static_cast<void*>(io.dx(0)->data));
#pragma omp parallel for if (positions * C > 32768)
    for (int64_t i = 0; i < positions; ++i) {
      const int64_t n = i / D, d = i % D, base = n * C * D + d;
      const S* xi = x + base;
      S* dxi = dx + base;
      const float g = ops::loss_gradient_factor(p, dl, i) * p.weights[i];
      if (g == 0.0f && !dlp) {
        for (int64_t k = 0; k < C; ++k) dxi[k * D] = convert<S>(0.0f);
        continue;
      }
      constexpr bool kFloat = std::is_same_v<S, float>;
      const float norm = kFloat && D == 1
                             ? log_normalizer_row(reinterpret_cast<const float*>(xi), C)
                             : log_normalizer(xi, C, D);
      double dlp_sum = 0;
      if (dlp)
        for (int64_t k = 0; k < C; ++k) dlp_sum += dlp[base + k * D];
      const float coef = g - static_cast<float>(dlp_sum);
      // float32 scores: straight into dx; 16-bit: through the thread's float32 row, rounded
      // once as a whole.
      thread_local std::vector<float> row_buffer;
      float* row = nullptr;
      int64_t step = D;
      if constexpr (std::is_same_v<S, float>) {
        row = dxi;
      } else {
        row_buffer.resize(static_cast<size_t>(C));
        row = row_buffer.data();
        step = 1;
      }
      if (kFloat && D == 1) {
        softmax_term_row(reinterpret_cast<const float*>(xi), C, norm, coef,
                         dlp ? dlp + base : nullptr, row);
      } else {
        for (int64_t k = 0; k < C; ++k) {
          const float prob = std::exp(convert<float>(xi[k * D]) - norm);
          row[k * step] = coef * prob + (dlp ? dlp[base + k * D] : 0.0f);
        }
      }
      if (g != 0.0f) row[p.labels[i] * step] -= g;
      if constexpr (!std::is_same_v<S, float>)
        for (int64_t k = 0; k < C; ++k) dxi[k * D] = convert<S>(row[k]);
    }
  });
}

// NegativeLogLikelihoodLoss: each position's -w * input[n, t, d], reduced as the cross-entropy.
void nll(const KernelArgs& a) {
  const Tensor& input = a.input(0);
  const Tensor& labels = a.input(1);
  const SceProblem p = sce_problem(a, input, labels, a.has_input(2) ? &a.input(2) : nullptr);
  expect_shape(a, 0, ops::sce_loss_shape(p, labels));
  const float* x = input.as<float>();
  float* loss = a.out[0]->as<float>();
  const int64_t positions = p.n * p.d, C = p.c, D = p.d;
  double total = 0;
  for (int64_t i = 0; i < positions; ++i) {
    const int64_t n = i / D, d = i % D;
    const float l = p.weights[i] != 0.0f ? -p.weights[i] * x[(n * C + p.labels[i]) * D + d] : 0.0f;
    if (p.reduction == LossReduction::kNone) loss[i] = l;
    total += l;
  }
  if (p.reduction == LossReduction::kSum) loss[0] = static_cast<float>(total);
  if (p.reduction == LossReduction::kMean)
    loss[0] = p.weight_sum != 0 ? static_cast<float>(total / p.weight_sum) : 0.0f;
}

// Gradient: inputs input, labels, weights ("" when omitted), loss, dloss; output dinput, zero
// but at each position's label: dinput[n, t, d] = -g * w[n, d], g as the cross-entropy's. Reads
// the labels and weights, and the input's shape only.
void nll_grad(const KernelArgs& a) {
  const ops::GradIo io(a, ops::kNllGradArity);
  if (!ops::sce_grad_wanted(a, io)) return;
  const Tensor& input = io.need_x(0);
  const Tensor& labels = io.need_x(1);
  const SceProblem p = sce_problem(a, input, labels, io.x(2));
  expect_shape(a, 0, input.shape);
  Tensor& dx = *io.dx(0);
  ops::zero(dx);
  const float* dl = ops::loss_gradient(a, p, labels, io.dy(0));
  if (dl == nullptr) return;
  float* d = dx.as<float>();
  const int64_t positions = p.n * p.d, C = p.c, D = p.d;
  for (int64_t i = 0; i < positions; ++i) {
    if (p.weights[i] == 0.0f) continue;
    d[(i / D * C + p.labels[i]) * D + i % D] = -ops::loss_gradient_factor(p, dl, i) * p.weights[i];
  }
}

// 16-bit scores with a float32 loss (and log_prob): a mixed plan's loss; the standard op on
// 16-bit scores, whose outputs are 16-bit too, runs widened (check_loss's output check).
std::string check_sce(const OpSignature& s) { return ops::check_loss(s, ops::kSceGradArity, true); }

const KernelEntry kKernels[] = {
    {"SoftmaxCrossEntropyLoss", sce, check_sce},
    {"SoftmaxCrossEntropyLossGrad", sce_grad, check_sce, /*writes_every_output=*/true},
    {"NegativeLogLikelihoodLoss", nll, ops::check_nll},
    {"NegativeLogLikelihoodLossGrad", nll_grad, ops::check_nll, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> loss_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
