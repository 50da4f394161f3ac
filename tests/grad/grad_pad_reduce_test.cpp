// Finite-difference checks of the Pad and reduction gradient kernels (runtime/cpu/pad.cpp,
// runtime/cpu/reduce.cpp).
#include <doctest/doctest.h>

#include <cmath>

#include "runtime/core/backend.h"
#include "runtime/format/grad_ops.h"
#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Tensor;

GradCase make_case(const std::string& op, std::vector<Tensor> inputs, std::vector<bool> check,
                   std::function<void(onnx::NodeProto&)> attrs = {}, int opset = 17) {
  GradCase c;
  c.op = op;
  c.inputs = std::move(inputs);
  c.check = std::move(check);
  c.attrs = std::move(attrs);
  c.opset = opset;
  c.int64_as_constants = true;  // pads and axes: shape inference reads their values
  return c;
}

std::function<void(onnx::NodeProto&)> mode(const std::string& m) {
  return [m](onnx::NodeProto& n) { set_string(n, "mode", m); };
}

}  // namespace

TEST_CASE("grad Pad") {
  const Tensor x = random_tensor({2, 3, 4, 5});
  SUBCASE("constant, as torch pads before AveragePool") {
    gradcheck(make_case("Pad", {x, int64_tensor({8}, {0, 0, 1, 2, 0, 0, 2, 1})}, {true, false},
                        mode("constant")));
  }
  SUBCASE("constant of zero width") {
    gradcheck(make_case("Pad", {x, int64_tensor({8}, {0, 0, 0, 0, 0, 0, 0, 0})}, {true, false}));
  }
  SUBCASE("constant with a constant_value input and negative pads (crops)") {
    gradcheck(make_case("Pad",
                        {x, int64_tensor({8}, {1, -1, 0, 2, 0, -2, 3, -1}), random_tensor({})},
                        {true, false, false}, mode("constant")));
  }
  SUBCASE("reflect: each padded position adds into the mirrored input") {
    gradcheck(make_case("Pad", {x, int64_tensor({8}, {0, 1, 2, 3, 1, 2, 3, 4})}, {true, false},
                        mode("reflect")));
  }
  SUBCASE("reflect past the dim's length repeats the mirror") {
    gradcheck(make_case("Pad", {random_tensor({3, 2}), int64_tensor({4}, {4, 3, 2, 5})},
                        {true, false}, mode("reflect")));
  }
  SUBCASE("edge: the border element gathers every replica") {
    gradcheck(make_case("Pad", {x, int64_tensor({8}, {1, 0, 3, 0, 0, 2, 1, 4})}, {true, false},
                        mode("edge")));
  }
  SUBCASE("attribute form (opset 10)") {
    gradcheck(make_case(
        "Pad", {random_tensor({3, 4})}, {true},
        [](onnx::NodeProto& n) {
          set_string(n, "mode", "edge");
          set_ints(n, "pads", {1, 2, 2, 1});
        },
        10));
  }
}

TEST_CASE("grad Pad: large (threaded paths)") {
  GradCase c = make_case(
      "Pad", {random_tensor({4, 16, 24, 24}), int64_tensor({8}, {0, 0, 2, 3, 0, 0, 3, 2})},
      {true, false}, mode("reflect"));
  c.samples = 12;
  gradcheck(c);
}

// `x` with every element at least 0.05 from 0.
Tensor avoid_zero(Tensor x) {
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::fabs(x.as<float>()[i]) < 0.05f) x.as<float>()[i] = 0.05f;
  return x;
}

// A reduction with `axes` as an attribute (every opset <= 17 of Max, Min, Prod, L2).
GradCase reduction(const std::string& op, Tensor x, std::vector<int64_t> axes, int64_t keepdims) {
  return make_case(op, {std::move(x)}, {true}, [axes, keepdims](onnx::NodeProto& n) {
    if (!axes.empty()) set_ints(n, "axes", axes);
    set_int(n, "keepdims", keepdims);
  });
}

TEST_CASE("grad ReduceSum") {
  const Tensor x = random_tensor({2, 3, 4});
  SUBCASE("axes as an input (opset 13)") {
    gradcheck(make_case("ReduceSum", {x, int64_tensor({1}, {1})}, {true, false}));
    gradcheck(make_case("ReduceSum", {x, int64_tensor({2}, {0, -1})}, {true, false},
                        [](onnx::NodeProto& n) { set_int(n, "keepdims", 0); }));
  }
  SUBCASE("no axes: every dim, or none with noop_with_empty_axes") {
    gradcheck(make_case("ReduceSum", {x}, {true}));
    gradcheck(make_case("ReduceSum", {x, int64_tensor({0}, {})}, {true, false},
                        [](onnx::NodeProto& n) { set_int(n, "noop_with_empty_axes", 1); }));
  }
  SUBCASE("axes as an attribute (opset 11)") {
    GradCase c = reduction("ReduceSum", x, {2}, 0);
    c.opset = 11;
    gradcheck(c);
  }
}

TEST_CASE("grad ReduceMax and ReduceMin") {
  // Values 0.03 apart: the extremum is unique and stays so under the finite differences.
  Tensor x = random_tensor({3, 4, 5});
  for (int64_t i = 0; i < 60; ++i)
    x.as<float>()[i] = static_cast<float>((i * 37) % 60) * 0.03f - 0.9f;
  for (const char* op : {"ReduceMax", "ReduceMin"}) {
    CAPTURE(op);
    gradcheck(reduction(op, x, {1}, 1));
    gradcheck(reduction(op, x, {0, 2}, 0));
    gradcheck(reduction(op, x, {}, 0));
  }
}

TEST_CASE("ReduceMax's gradient splits dy evenly between tied maxima, as PyTorch's amax") {
  // x = [[1, 3, 3, 2], [5, 5, 5, 5]], ReduceMax over axis 1: y = [3, 5], dy = [1, 2].
  Tensor x = random_tensor({2, 4}), y = random_tensor({2}), dy = random_tensor({2});
  const float xs[] = {1, 3, 3, 2, 5, 5, 5, 5};
  std::copy(std::begin(xs), std::end(xs), x.as<float>());
  y.as<float>()[0] = 3, y.as<float>()[1] = 5, dy.as<float>()[0] = 1, dy.as<float>()[1] = 2;
  Tensor dx = random_tensor({2, 4});
  onnx::NodeProto node;
  set_ints(node, "axes", {1});
  set_int(node, "keepdims", 0);
  set_int(node, std::string(grad::kForwardInputsAttr), 1);
  const rt::Attrs attrs(node);
  const Tensor* in[] = {&x, &y, &dy};
  Tensor* out[] = {&dx};
  auto device = rt::cpu_backend().make_device(0, 1);
  rt::cpu_backend().kernel("ReduceMaxGrad")({"max_grad", "ReduceMaxGrad", attrs, in, out, *device});
  const std::vector<float> got(dx.as<float>(), dx.as<float>() + 8);
  CHECK(got == std::vector<float>{0, 0.5f, 0.5f, 0, 0.5f, 0.5f, 0.5f, 0.5f});
}

TEST_CASE("grad ReduceProd") {
  gradcheck(reduction("ReduceProd", random_tensor({3, 4, 2}, 0.5f, 1.5f), {1}, 1));
  gradcheck(reduction("ReduceProd", random_tensor({3, 4, 2}, -1.5f, 1.5f, 3), {0, 2}, 0));
  // A zero in the product: the gradient at it is the product of the others (no division).
  Tensor x = random_tensor({2, 3}, 0.5f, 1.5f);
  x.as<float>()[1] = 0.0f;
  gradcheck(reduction("ReduceProd", x, {1}, 0));
}

TEST_CASE("grad ReduceL2") {
  gradcheck(reduction("ReduceL2", random_tensor({3, 4, 5}), {2}, 1));
  gradcheck(reduction("ReduceL2", random_tensor({3, 4, 5}), {}, 0));
}

TEST_CASE("grad ReduceL1, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp") {
  // L1 away from its kink at 0; LogSum on positive values.
  gradcheck(reduction("ReduceL1", avoid_zero(random_tensor({3, 4, 5})), {1}, 1));
  gradcheck(reduction("ReduceSumSquare", random_tensor({3, 4, 5}), {0, 2}, 0));
  gradcheck(reduction("ReduceLogSum", random_tensor({3, 4, 5}, 0.5f, 2.0f), {2}, 1));
  gradcheck(reduction("ReduceLogSumExp", random_tensor({3, 4, 5}, -3, 3), {1}, 0));
  gradcheck(reduction("ReduceLogSumExp", random_tensor({3, 4, 5}, -3, 3), {}, 1));
}

TEST_CASE("grad reductions: large (threaded paths)") {
  for (const char* op : {"ReduceSum", "ReduceMax", "ReduceL2"}) {
    CAPTURE(op);
    GradCase c = reduction(op, random_tensor({30, 40, 60}, -1, 1, 5), {1}, 0);
    c.opset = 11;
    c.samples = 12;
    gradcheck(c);
  }
}

}  // namespace stagecraft::testing
