// The CUDA backend's loss family (families.h): SoftmaxCrossEntropyLoss (opset 13 semantics),
// NegativeLogLikelihoodLoss and their gradients (contract: runtime/format/grad_ops.h), float32 or
// on 16-bit scores, as the CPU backend's runtime/cpu/loss.cpp computes them. The labels (and the
// class weights) are read to the host, checked as the CPU checks them, and turned into
// per-position weights there, so the mean's divisor is the CPU's exact double sum;
// loss_kernels.cu computes the rest.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/cuda/loss_kernels.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/loss_rules.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::GradArity;
using ops::GradIo;

// One node resolved, with the device arrays its SceArgs point into.
struct SceProblem {
  SceArgs args;
  Tensor labels, weights;  // device int64 [N * D], float32 [N * D]
};

// Reads the node's scores, labels and optional weights by the CPU's rules (ops::sce_shape,
// ops::sce_weights: the labels and class weights read to the host, checked there), the labels
// and per-position weights then uploaded.
SceProblem sce_problem(const KernelArgs& a, const Tensor& scores, const Tensor& labels,
                       const Tensor* weights) {
  CudaContext& ctx = context(a);
  ops::SceProblem q = ops::sce_shape(a, scores, labels, weights);
  std::vector<float> class_weights;
  if (weights) {
    class_weights.resize(static_cast<size_t>(q.c));
    ctx.read(*weights, class_weights.data(), weights->bytes());
  }
  ops::sce_weights(a, q, read_ints(ctx, labels), class_weights);
  SceProblem p;
  SceArgs& s = p.args;
  s.n = q.n;
  s.c = q.c;
  s.d = q.d;
  s.reduction = q.reduction;
  s.weight_sum = q.weight_sum;
  const auto positions = static_cast<int64_t>(q.labels.size());
  p.labels = ctx.new_tensor(DType::kInt64, {positions}, false);
  ctx.write(p.labels, q.labels.data(), p.labels.bytes());
  p.weights = ctx.new_tensor(DType::kFloat32, {positions}, false);
  ctx.write(p.weights, q.weights.data(), p.weights.bytes());
  s.scores = scores.data;
  s.scores_dtype = scores.dtype;
  s.labels = p.labels.as<int64_t>();
  s.weights = p.weights.as<float>();
  return p;
}

Shape loss_shape(const SceArgs& s, const Tensor& labels) {
  return s.reduction == ops::LossReduction::kNone ? labels.shape : Shape{};
}

void sce(const KernelArgs& a) {
  const Tensor& scores = a.input(0);
  const Tensor& labels = a.input(1);
  const Tensor* weights = a.has_input(2) ? &a.input(2) : nullptr;
  const SceProblem p = sce_problem(a, scores, labels, weights);
  const SceArgs& s = p.args;
  expect_shape(a, 0, loss_shape(s, labels));
  Tensor* log_prob = a.out.size() > 1 ? a.out[1] : nullptr;
  if (log_prob) expect_shape(a, 1, scores.shape);
  const int64_t positions = s.n * s.d;
  if (s.c == 0 && positions > 0)
    fail(ErrorKind::kShape, "{}: scores {} have no classes", a.op_type, scores.describe());
  CudaContext& ctx = context(a);
  Tensor scratch;
  if (s.reduction != ops::LossReduction::kNone)
    scratch = ctx.new_tensor(DType::kFloat32, {positions}, false);
  launch_sce(s, a.out[0]->as<float>(), log_prob ? log_prob->as<float>() : nullptr,
             scratch.as<float>(), ctx.stream());
  check_launch(a);
}

// Gradient: inputs scores, labels, weights, loss, [log_prob], dloss, [dlog_prob]; output
// dscores (labels and weights get none). Writes every element of dscores.
void sce_grad(const KernelArgs& a) {
  const GradIo io(a, ops::kSceGradArity);
  if (!ops::sce_grad_wanted(a, io)) return;
  const Tensor& scores = io.need_x(0);
  const Tensor& labels = io.need_x(1);
  const SceProblem p = sce_problem(a, scores, labels, io.x(2));
  const SceArgs& s = p.args;
  expect_shape(a, 0, scores.shape);
  const Tensor* dloss = io.dy(0);
  const Tensor* dlog_prob = io.dy(1);
  const Shape ls = loss_shape(s, labels);
  if (dloss && shape_numel(dloss->shape) != shape_numel(ls))
    fail(ErrorKind::kShape, "{}: the loss gradient {} should be {}", a.op_type, dloss->describe(),
         shape_string(ls));
  if (dlog_prob && dlog_prob->shape != scores.shape)
    fail(ErrorKind::kShape, "{}: the log_prob gradient {} should be {}", a.op_type,
         dlog_prob->describe(), shape_string(scores.shape));
  launch_sce_grad(s, dloss ? dloss->as<float>() : nullptr,
                  dlog_prob ? dlog_prob->as<float>() : nullptr, io.dx(0)->data,
                  context(a).stream());
  check_launch(a);
}

// NegativeLogLikelihoodLoss over float32 log-probabilities, resolved as the cross-entropy.
void nll(const KernelArgs& a) {
  const Tensor& labels = a.input(1);
  const SceProblem p = sce_problem(a, a.input(0), labels, a.has_input(2) ? &a.input(2) : nullptr);
  expect_shape(a, 0, loss_shape(p.args, labels));
  Tensor scratch;
  if (p.args.reduction != ops::LossReduction::kNone)
    scratch = context(a).new_tensor(DType::kFloat32, {p.args.n * p.args.d}, false);
  launch_nll(p.args, a.out[0]->as<float>(), scratch.as<float>(), context(a).stream());
  check_launch(a);
}

// Gradient: inputs input, labels, weights, loss, dloss; output dinput, every element written.
void nll_grad(const KernelArgs& a) {
  const GradIo io(a, ops::kNllGradArity);
  if (!ops::sce_grad_wanted(a, io)) return;
  const Tensor& input = io.need_x(0);
  const Tensor& labels = io.need_x(1);
  const SceProblem p = sce_problem(a, input, labels, io.x(2));
  expect_shape(a, 0, input.shape);
  const Tensor* dloss = io.dy(0);
  const Shape ls = loss_shape(p.args, labels);
  if (dloss && shape_numel(dloss->shape) != shape_numel(ls))
    fail(ErrorKind::kShape, "{}: the loss gradient {} should be {}", a.op_type, dloss->describe(),
         shape_string(ls));
  context(a).fill_zero(*io.dx(0));
  launch_nll_grad(p.args, dloss ? dloss->as<float>() : nullptr, io.dx(0)->as<float>(),
                  context(a).stream());
  check_launch(a);
}

// The checks are the CPU's: float32 or 16-bit scores (a mixed plan's loss: float32 loss and
// log_prob, the gradient in the scores' type), int32 or int64 labels, float32 weights, as here.
const KernelEntry kKernels[] = {
    {"SoftmaxCrossEntropyLoss", sce, same_as_cpu},
    {"SoftmaxCrossEntropyLossGrad", sce_grad, same_as_cpu, /*writes_every_output=*/true},
    {"NegativeLogLikelihoodLoss", nll, same_as_cpu},
    {"NegativeLogLikelihoodLossGrad", nll_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> loss_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
