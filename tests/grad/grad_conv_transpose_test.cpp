// Finite-difference checks of ConvTransposeGrad (runtime/cpu/conv_transpose.cpp): dX, dW and dB
// over the attributes exporters write (strides, pads, output_padding, output_shape, auto_pad,
// dilations, groups) in 1-D, 2-D and 3-D.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;

struct Attributes {
  std::vector<int64_t> strides{}, pads{}, dilations{}, output_padding{}, output_shape{};
  std::string auto_pad{};
  int64_t group = 1;
};

// X [N, C, ...], W [C, M / group, kernel...]; a bias of M values unless `bias` is false.
void conv_transpose(const Shape& x, const Shape& w, const Attributes& at, bool bias = true) {
  CAPTURE(rt::shape_string(x));
  CAPTURE(rt::shape_string(w));
  CAPTURE(at.auto_pad);
  CAPTURE(at.group);
  GradCase c;
  c.op = "ConvTranspose";
  c.inputs = {random_tensor(x, -1, 1, 1), random_tensor(w, -1, 1, 2)};
  c.check = {true, true};
  if (bias) {
    c.inputs.push_back(random_tensor({w[1] * at.group}, -1, 1, 3));
    c.check.push_back(true);
  }
  c.attrs = [=](onnx::NodeProto& n) {
    auto ints = [&](const char* name, const std::vector<int64_t>& v) {
      if (!v.empty()) set_ints(n, name, v);
    };
    ints("strides", at.strides);
    ints("pads", at.pads);
    ints("dilations", at.dilations);
    ints("output_padding", at.output_padding);
    ints("output_shape", at.output_shape);
    if (!at.auto_pad.empty()) set_string(n, "auto_pad", at.auto_pad);
    if (at.group != 1) set_int(n, "group", at.group);
  };
  gradcheck(c);
}

}  // namespace

TEST_CASE("grad ConvTranspose 2-D") {
  conv_transpose({2, 3, 4, 4}, {3, 2, 3, 3}, {});
  conv_transpose({2, 3, 4, 4}, {3, 2, 3, 3}, {}, false);
  conv_transpose({1, 2, 3, 4}, {2, 3, 3, 2}, {.strides = {2, 1}, .pads = {1, 0, 0, 1}});
  conv_transpose({1, 2, 3, 3}, {2, 2, 3, 3}, {.strides = {2, 2}, .dilations = {2, 1}});
  // U-Net's up-sampling: kernel 2, stride 2.
  conv_transpose({2, 4, 3, 3}, {4, 2, 2, 2}, {.strides = {2, 2}});
}

TEST_CASE("grad ConvTranspose output_padding and output_shape") {
  conv_transpose({1, 2, 3, 3}, {2, 2, 3, 3},
                 {.strides = {3, 2}, .pads = {1, 1, 1, 1}, .output_padding = {2, 1}});
  // Past the full result by one position (as ONNX's test_convtranspose_output_shape).
  conv_transpose({1, 1, 3, 3}, {1, 2, 3, 3}, {.strides = {3, 2}, .output_shape = {10, 8}});
  conv_transpose({1, 2, 3, 3}, {2, 1, 3, 3}, {.strides = {2, 2}, .output_shape = {5, 6}});
}

TEST_CASE("grad ConvTranspose auto_pad and groups") {
  for (const char* pad : {"SAME_UPPER", "SAME_LOWER", "VALID"})
    conv_transpose({1, 2, 3, 4}, {2, 2, 3, 2}, {.strides = {2, 1}, .auto_pad = pad});
  conv_transpose({2, 4, 3, 3}, {4, 3, 3, 3}, {.strides = {2, 2}, .pads = {1, 1, 1, 1}, .group = 2});
  conv_transpose({1, 4, 3, 3}, {4, 1, 3, 3}, {.strides = {2, 2}, .group = 4});  // depthwise
}

TEST_CASE("grad ConvTranspose 1-D and 3-D") {
  conv_transpose({2, 3, 5}, {3, 2, 3}, {.strides = {2}, .pads = {1, 2}, .dilations = {2}});
  conv_transpose({1, 2, 2, 3, 2}, {2, 2, 2, 3, 2},
                 {.strides = {1, 2, 2}, .pads = {0, 1, 1, 1, 0, 0}, .output_padding = {0, 1, 0}});
}

}  // namespace stagecraft::testing
