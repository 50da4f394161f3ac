// Finite-difference checks of the matmul family's gradient kernels (runtime/cpu/grad_matmul.cpp)
// and of the losses' (SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss: runtime/cpu/loss.cpp).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;
using rt::Tensor;

void matmul(const Shape& a, const Shape& b) {
  CAPTURE(rt::shape_string(a));
  CAPTURE(rt::shape_string(b));
  GradCase c;
  c.op = "MatMul";
  c.inputs = {random_tensor(a, -1, 1, 1), random_tensor(b, -1, 1, 2)};
  c.check = {true, true};
  gradcheck(c);
}

void gemm(const Shape& a, const Shape& b, const Shape& cshape, int trans_a, int trans_b,
          float alpha, float beta) {
  CAPTURE(trans_a);
  CAPTURE(trans_b);
  CAPTURE(rt::shape_string(cshape));
  GradCase c;
  c.op = "Gemm";
  c.inputs = {random_tensor(a, -1, 1, 1), random_tensor(b, -1, 1, 2)};
  c.check = {true, true};
  c.attrs = [=](onnx::NodeProto& n) {
    if (trans_a) set_int(n, "transA", 1);
    if (trans_b) set_int(n, "transB", 1);
    if (alpha != 1.0f) set_float(n, "alpha", alpha);
    if (beta != 1.0f) set_float(n, "beta", beta);
  };
  gradcheck(c);
  c.inputs.push_back(random_tensor(cshape, -1, 1, 3));
  c.check.push_back(true);
  gradcheck(c);
}

}  // namespace

TEST_CASE("grad MatMul 2-D") {
  matmul({3, 4}, {4, 5});
  matmul({1, 4}, {4, 1});
}

TEST_CASE("grad MatMul batched and broadcast") {
  matmul({2, 3, 4}, {2, 4, 5});        // same batch
  matmul({2, 3, 4}, {4, 5});           // B without batch (a layer's weights)
  matmul({3, 4}, {2, 4, 5});           // A without batch
  matmul({2, 1, 3, 4}, {1, 3, 4, 2});  // both broadcast
  matmul({1, 3, 4}, {2, 4, 5});        // unit batch dim on A
  matmul({2, 3, 4}, {1, 4, 5});        // unit batch dim on B
}

TEST_CASE("grad MatMul 1-D operands") {
  matmul({4}, {4, 5});
  matmul({3, 4}, {4});
  matmul({4}, {4});
  matmul({4}, {2, 4, 5});
  matmul({2, 3, 4}, {4});
}

TEST_CASE("grad Gemm") {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const Shape a = ta ? Shape{4, 3} : Shape{3, 4};
      const Shape b = tb ? Shape{5, 4} : Shape{4, 5};
      gemm(a, b, {3, 5}, ta, tb, 1.0f, 1.0f);
    }
}

TEST_CASE("grad Gemm alpha beta and C broadcast") {
  const Shape a{3, 4}, b{4, 5};
  for (const Shape& cs :
       {Shape{5}, Shape{1, 5}, Shape{3, 1}, Shape{1}, Shape{}, Shape{1, 1}, Shape{3, 5}})
    gemm(a, b, cs, 0, 0, 0.5f, 2.0f);
  gemm({4, 3}, {5, 4}, {5}, 1, 1, -1.5f, 0.25f);
  gemm(a, b, {3, 5}, 0, 0, 1.0f, 0.0f);  // beta 0: C's gradient is zeros
}

namespace {

void loss(const std::string& op, const Shape& scores, const std::vector<int64_t>& labels,
          bool weights, const std::string& reduction, int outputs, bool ignore = false,
          int64_t ignore_index = 0) {
  CAPTURE(op);
  CAPTURE(reduction);
  CAPTURE(outputs);
  CAPTURE(rt::shape_string(scores));
  GradCase c;
  c.op = op;
  c.opset = 13;
  Shape label_shape{scores[0]};
  label_shape.insert(label_shape.end(), scores.begin() + 2, scores.end());
  c.inputs = {random_tensor(scores, -2, 2, 5), int64_tensor(label_shape, labels)};
  if (weights) c.inputs.push_back(random_tensor({scores[1]}, 0.2f, 1.5f, 6));
  c.check = {true, false, false};
  c.outputs = outputs;
  c.attrs = [=](onnx::NodeProto& n) {
    set_string(n, "reduction", reduction);
    if (ignore) set_int(n, "ignore_index", ignore_index);
  };
  gradcheck(c);
}

void sce(const Shape& scores, const std::vector<int64_t>& labels, bool weights,
         const std::string& reduction, int outputs, bool ignore = false, int64_t ignore_index = 0) {
  loss("SoftmaxCrossEntropyLoss", scores, labels, weights, reduction, outputs, ignore,
       ignore_index);
}

}  // namespace

TEST_CASE("grad NegativeLogLikelihoodLoss") {
  for (const char* r : {"mean", "sum", "none"}) {
    const std::string nll = "NegativeLogLikelihoodLoss";
    loss(nll, {4, 5}, {0, 3, 4, 1}, false, r, 1);
    loss(nll, {4, 5}, {0, 3, 4, 1}, true, r, 1);
    loss(nll, {2, 3, 4}, {0, 1, 2, 2, 1, 0, 0, 2}, true, r, 1);
    loss(nll, {2, 3, 2, 2}, {0, 1, 2, 2, 1, 0, 0, 2}, false, r, 1);
    loss(nll, {4, 5}, {0, -1, 4, 1}, true, r, 1, true, -1);
    loss(nll, {2, 3, 4}, {0, 1, 7, 2, 7, 0, 0, 2}, false, r, 1, true, 7);
  }
}

TEST_CASE("grad SoftmaxCrossEntropyLoss") {
  for (const char* r : {"mean", "sum", "none"}) {
    sce({4, 5}, {0, 3, 4, 1}, false, r, 1);
    sce({4, 5}, {0, 3, 4, 1}, true, r, 1);
    sce({2, 3, 4}, {0, 1, 2, 2, 1, 0, 0, 2}, true, r, 1);
    sce({2, 3, 2, 2}, {0, 1, 2, 2, 1, 0, 0, 2}, false, r, 2);
    sce({4, 5}, {0, -1, 4, 1}, true, r, 2, true, -1);
    sce({2, 3, 4}, {0, 1, 7, 2, 7, 0, 0, 2}, false, r, 1, true, 7);
  }
}

TEST_CASE("grad SoftmaxCrossEntropyLoss large") {
  std::vector<int64_t> labels(512 * 4);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 37) % 20);
  sce({512, 20, 4}, labels, true, "mean", 2);
  sce({512, 20, 4}, labels, false, "none", 1);
}

}  // namespace stagecraft::testing
