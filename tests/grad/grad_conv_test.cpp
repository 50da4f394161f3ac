// Finite-difference checks of the conv family's gradient kernels (runtime/cpu/grad_conv.cpp).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;
using rt::Tensor;

// Window attributes left empty are not written (the op's defaults apply).
void set_ints_if_any(onnx::NodeProto& n, const std::string& name, const std::vector<int64_t>& v) {
  if (!v.empty()) set_ints(n, name, v);
}

struct Window {
  std::vector<int64_t> strides{}, pads{}, dilations{};
  std::string auto_pad{};
  int64_t group = 1;
};

void conv(const Shape& x, const Shape& w, const Window& win, bool bias = true) {
  CAPTURE(rt::shape_string(x));
  CAPTURE(rt::shape_string(w));
  CAPTURE(win.auto_pad);
  CAPTURE(win.group);
  GradCase c;
  c.op = "Conv";
  c.inputs = {random_tensor(x, -1, 1, 1), random_tensor(w, -1, 1, 2)};
  c.check = {true, true};
  if (bias) {
    c.inputs.push_back(random_tensor({w[0]}, -1, 1, 3));
    c.check.push_back(true);
  }
  c.attrs = [=](onnx::NodeProto& n) {
    set_ints_if_any(n, "strides", win.strides);
    set_ints_if_any(n, "pads", win.pads);
    set_ints_if_any(n, "dilations", win.dilations);
    if (!win.auto_pad.empty()) set_string(n, "auto_pad", win.auto_pad);
    if (win.group != 1) set_int(n, "group", win.group);
  };
  gradcheck(c);
}

}  // namespace

TEST_CASE("grad Conv 2-D") {
  conv({2, 3, 5, 5}, {4, 3, 3, 3}, {});
  conv({2, 3, 5, 5}, {4, 3, 3, 3}, {}, false);
  conv({1, 3, 6, 7}, {2, 3, 3, 2}, {.strides = {2, 1}, .pads = {1, 0, 0, 1}});
  conv({1, 2, 7, 7}, {3, 2, 3, 3}, {.strides = {2, 2}, .pads = {1, 1, 1, 1}, .dilations = {2, 1}});
  conv({1, 3, 4, 4}, {5, 3, 1, 1}, {});
  conv({1, 3, 5, 5}, {4, 3, 1, 1}, {.strides = {2, 2}});  // inputs that no window reads
}

// At least 8 channels in and out with a spatial kernel: the gradient runs on oneDNN's blocked
// layouts, with reorders in and out (conv_backward.h); a pointwise one stays on the plain ones.
TEST_CASE("grad Conv on oneDNN's blocked layouts") {
  conv({2, 8, 6, 6}, {16, 8, 3, 3}, {.pads = {1, 1, 1, 1}});
  conv({1, 16, 7, 7}, {8, 16, 3, 3}, {.strides = {2, 2}, .pads = {1, 0, 0, 1}, .dilations = {2, 1}},
       false);
  conv({2, 16, 9}, {8, 16, 3}, {.strides = {2}, .pads = {1, 1}});
  conv({1, 8, 4, 4, 4}, {8, 8, 3, 3, 3}, {.pads = {1, 1, 1, 1, 1, 1}});
  conv({2, 8, 5, 5}, {16, 8, 1, 1}, {});
}

TEST_CASE("grad Conv groups") {
  conv({2, 4, 5, 5}, {6, 2, 3, 3}, {.pads = {1, 1, 1, 1}, .group = 2});
  conv({1, 4, 6, 6}, {4, 1, 3, 3},
       {.strides = {2, 2}, .pads = {1, 1, 1, 1}, .group = 4});  // depthwise
}

TEST_CASE("grad Conv auto_pad") {
  for (const char* pad : {"SAME_UPPER", "SAME_LOWER", "VALID"})
    conv({1, 2, 6, 5}, {3, 2, 2, 3}, {.strides = {2, 1}, .auto_pad = pad});
}

TEST_CASE("grad Conv 1-D and 3-D") {
  conv({2, 3, 9}, {4, 3, 3}, {.strides = {2}, .pads = {1, 2}, .dilations = {2}});
  conv({1, 2, 4, 4, 4}, {3, 2, 2, 3, 2}, {.strides = {1, 2, 1}, .pads = {0, 1, 1, 1, 0, 0}});
}

namespace {

void pool(const std::string& op, const Shape& x, const std::vector<int64_t>& kernel,
          const Window& win, std::vector<std::pair<std::string, int64_t>> ints = {},
          int outputs = 1, int64_t modulus = 0) {
  CAPTURE(op);
  CAPTURE(rt::shape_string(x));
  CAPTURE(win.auto_pad);
  GradCase c;
  c.op = op;
  // Distinct values (a shuffled ramp, or with `modulus` one that repeats but is distinct within
  // each window) keep MaxPool away from ties.
  Tensor t = random_tensor(x, -1, 1, 4);
  const int64_t count = t.numel(), period = modulus > 0 ? modulus : count;
  for (int64_t i = 0; i < count; ++i)
    t.as<float>()[i] = static_cast<float>((i * 7919) % period) * 0.01f - 0.5f;
  c.inputs = {t};
  c.check = {true};
  c.outputs = outputs;
  c.attrs = [=](onnx::NodeProto& n) {
    set_ints_if_any(n, "kernel_shape", kernel);
    set_ints_if_any(n, "strides", win.strides);
    set_ints_if_any(n, "pads", win.pads);
    set_ints_if_any(n, "dilations", win.dilations);
    if (!win.auto_pad.empty()) set_string(n, "auto_pad", win.auto_pad);
    for (const auto& [name, v] : ints) set_int(n, name, v);
  };
  gradcheck(c);
}

}  // namespace

TEST_CASE("grad MaxPool") {
  pool("MaxPool", {2, 3, 6, 6}, {2, 2}, {.strides = {2, 2}});
  pool("MaxPool", {1, 2, 7, 7}, {3, 3}, {.strides = {2, 2}, .pads = {1, 1, 1, 1}});
  pool("MaxPool", {1, 2, 8, 7}, {3, 2}, {.strides = {2, 2}}, {{"ceil_mode", 1}});
  pool("MaxPool", {1, 2, 7, 7}, {2, 2}, {.dilations = {2, 2}});
  pool("MaxPool", {1, 2, 5, 6}, {3, 3}, {.strides = {2, 2}, .auto_pad = "SAME_UPPER"});
  pool("MaxPool", {2, 2, 9}, {3}, {.strides = {2}, .pads = {1, 1}}, {}, 2);  // with Indices
  pool("MaxPool", {1, 2, 4, 5, 4}, {2, 2, 2}, {.strides = {2, 2, 2}}, {{"ceil_mode", 1}});
}

TEST_CASE("grad AveragePool") {
  pool("AveragePool", {2, 3, 6, 6}, {2, 2}, {.strides = {2, 2}});
  for (int64_t include : {0, 1}) {
    pool("AveragePool", {1, 2, 7, 7}, {3, 3}, {.strides = {2, 2}, .pads = {1, 1, 1, 1}},
         {{"count_include_pad", include}});
    pool("AveragePool", {1, 2, 8, 7}, {3, 2}, {.strides = {2, 2}, .pads = {0, 1, 0, 0}},
         {{"ceil_mode", 1}, {"count_include_pad", include}});
    pool("AveragePool", {1, 2, 5, 6}, {3, 3}, {.strides = {2, 2}, .auto_pad = "SAME_LOWER"},
         {{"count_include_pad", include}});
  }
  pool("AveragePool", {2, 2, 9}, {3}, {.strides = {2}, .pads = {1, 1}});
  pool("AveragePool", {1, 2, 4, 5, 4}, {2, 3, 2}, {.strides = {2, 1, 2}}, {{"ceil_mode", 1}});
}

TEST_CASE("grad GlobalAveragePool") {
  for (const Shape& s : {Shape{2, 3, 4, 5}, Shape{2, 3, 7}, Shape{1, 2, 2, 3, 2}}) {
    GradCase c;
    c.op = "GlobalAveragePool";
    c.inputs = {random_tensor(s)};
    c.check = {true};
    gradcheck(c);
  }
}

// Large enough that the kernels split their loops among threads.
TEST_CASE("grad MaxPool AveragePool GlobalAveragePool large") {
  // 7919 * {0, 1, 2, 32, 33, 34, 64, 65, 66} mod 200 are at least 8 apart: no ties in a 3x3 window.
  pool("MaxPool", {4, 8, 32, 32}, {3, 3}, {.strides = {2, 2}, .pads = {1, 1, 1, 1}}, {}, 1, 200);
  pool("AveragePool", {4, 8, 32, 32}, {3, 3}, {.strides = {2, 2}, .pads = {1, 1, 1, 1}},
       {{"count_include_pad", 1}}, 1, 200);
  GradCase c;
  c.op = "GlobalAveragePool";
  c.inputs = {random_tensor({4, 16, 24, 24})};
  c.check = {true};
  gradcheck(c);
}

}  // namespace stagecraft::testing
