// Finite-difference checks of the norm family's gradient kernels (runtime/cpu/grad_norm.cpp).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;
using rt::Tensor;

void batch_norm(const Shape& x, bool training, int outputs, int samples = 24) {
  CAPTURE(rt::shape_string(x));
  CAPTURE(training);
  CAPTURE(outputs);
  const int64_t c = x[1];
  GradCase g;
  g.op = "BatchNormalization";
  g.opset = 15;
  g.inputs = {random_tensor(x, -1, 1, 1), random_tensor({c}, 0.5f, 1.5f, 2),
              random_tensor({c}, -1, 1, 3), random_tensor({c}, -0.3f, 0.3f, 4),
              random_tensor({c}, 0.5f, 1.5f, 5)};
  g.check = {true, true, true, true, true};
  g.outputs = outputs;
  g.samples = samples;
  g.attrs = [=](onnx::NodeProto& n) {
    if (training) set_int(n, "training_mode", 1);
    set_float(n, "epsilon", 1e-3f);
    if (training) set_float(n, "momentum", 0.8f);
  };
  gradcheck(g);
}

void layer_norm(const Shape& x, int64_t axis, bool bias, int outputs) {
  CAPTURE(rt::shape_string(x));
  CAPTURE(axis);
  CAPTURE(outputs);
  Shape normalized(x.begin() + (axis < 0 ? axis + static_cast<int64_t>(x.size()) : axis), x.end());
  GradCase g;
  g.op = "LayerNormalization";
  g.inputs = {random_tensor(x, -1, 1, 1), random_tensor(normalized, 0.5f, 1.5f, 2)};
  g.check = {true, true};
  if (bias) {
    g.inputs.push_back(random_tensor(normalized, -1, 1, 3));
    g.check.push_back(true);
  }
  g.outputs = outputs;
  g.attrs = [=](onnx::NodeProto& n) {
    set_int(n, "axis", axis);
    set_float(n, "epsilon", 1e-3f);
  };
  gradcheck(g);
}

void instance_norm(const Shape& x, float epsilon, int samples = 24) {
  CAPTURE(rt::shape_string(x));
  const int64_t c = x[1];
  GradCase g;
  g.op = "InstanceNormalization";
  g.inputs = {random_tensor(x, -1, 1, 1), random_tensor({c}, 0.5f, 1.5f, 2),
              random_tensor({c}, -1, 1, 3)};
  g.check = {true, true, true};
  g.samples = samples;
  g.attrs = [=](onnx::NodeProto& n) { set_float(n, "epsilon", epsilon); };
  gradcheck(g);
}

}  // namespace

TEST_CASE("grad InstanceNormalization") {
  instance_norm({2, 3, 4, 4}, 1e-3f);
  instance_norm({3, 2, 7}, 1e-2f);
  instance_norm({1, 4, 2, 3, 2}, 1e-5f);
  instance_norm({2, 3, 1}, 1e-2f);  // planes of one element: Y is B, dX is 0
}

TEST_CASE("grad BatchNormalization inference") {
  batch_norm({2, 3, 4, 4}, false, 1);
  batch_norm({4, 3}, false, 1);
  batch_norm({2, 2, 5}, false, 1);
}

TEST_CASE("grad BatchNormalization training") {
  batch_norm({3, 3, 4, 4}, true, 3);
  batch_norm({6, 3}, true, 3);
  batch_norm({2, 2, 5}, true, 3);
}

TEST_CASE("grad LayerNormalization") {
  layer_norm({4, 6}, -1, true, 1);
  layer_norm({2, 3, 5}, -1, false, 1);
  layer_norm({2, 3, 4}, 1, true, 1);
  layer_norm({2, 3, 4}, -2, true, 3);
  layer_norm({3, 8}, 0, true, 2);
}

TEST_CASE("grad Softmax") {
  for (int64_t axis : {-1, 0, 1}) {
    CAPTURE(axis);
    GradCase g;
    g.op = "Softmax";
    g.inputs = {random_tensor({3, 4, 5}, -2, 2, 1)};
    g.check = {true};
    g.attrs = [=](onnx::NodeProto& n) { set_int(n, "axis", axis); };
    gradcheck(g);
  }
  GradCase g;
  g.op = "Softmax";
  g.inputs = {random_tensor({4, 7}, -2, 2, 2)};
  g.check = {true};
  gradcheck(g);
}

}  // namespace stagecraft::testing

namespace stagecraft::testing {

// Large enough that the kernels split their loops among threads.
TEST_CASE("grad LayerNormalization large") { layer_norm({256, 160}, -1, true, 1); }

TEST_CASE("grad InstanceNormalization large") { instance_norm({4, 8, 32, 40}, 1e-3f, 8); }

TEST_CASE("grad BatchNormalization training large") { batch_norm({9, 8, 16, 32}, true, 3, 8); }

TEST_CASE("grad BatchNormalization inference large") { batch_norm({9, 8, 16, 32}, false, 1, 8); }

TEST_CASE("grad LogSoftmax") {
  for (int64_t axis : {-1, 0, 1}) {
    CAPTURE(axis);
    GradCase g;
    g.op = "LogSoftmax";
    g.inputs = {random_tensor({3, 4, 5}, -2, 2, 3)};
    g.check = {true};
    g.attrs = [=](onnx::NodeProto& n) { set_int(n, "axis", axis); };
    gradcheck(g);
  }
}

TEST_CASE("grad LogSoftmax large") {
  GradCase g;
  g.op = "LogSoftmax";
  g.inputs = {random_tensor({64, 40, 16}, -2, 2, 4)};
  g.check = {true};
  g.attrs = [](onnx::NodeProto& n) { set_int(n, "axis", 1); };
  gradcheck(g);
}

TEST_CASE("grad Softmax large") {
  GradCase g;
  g.op = "Softmax";
  g.inputs = {random_tensor({64, 40, 16}, -2, 2, 1)};
  g.check = {true};
  g.attrs = [](onnx::NodeProto& n) { set_int(n, "axis", 1); };
  gradcheck(g);
}

}  // namespace stagecraft::testing
