// Finite-difference checks of the Pad gradient kernel (runtime/cpu/pad.cpp).
#include <doctest/doctest.h>

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

}  // namespace stagecraft::testing
