// ConvTranspose as U-Net decoders use it (issue 15): the CPU kernel against a direct loop over
// ONNX's definition (groups, dilations, pads, output_padding, output_shape, auto_pad, 1-D to
// 3-D), refusals at import in one line naming the node and the numbers, and a small U-Net built
// with the samples' builder planned on 2 devices, run and trained as on one, with and without
// InstanceNormalization (pix2pix's). The gradients are checked in tests/grad
// (grad_conv_transpose_test.cpp, grad_norm_test.cpp), ONNX's own cases by the conformance run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "samples/builder/model_builder.h"
#include "samples/builder/sample_models.h"
#include "tests/runtime/op_coverage_util.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

using samples::attr_int;
using samples::attr_ints;
using samples::attr_string;
using samples::ModelBuilder;
using testing::check_contains;

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

std::vector<float> random_values(int64_t count, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& f : v) f = u(gen);
  return v;
}

int64_t product(const Shape& s, size_t from = 0) {
  int64_t p = 1;
  for (size_t i = from; i < s.size(); ++i) p *= s[i];
  return p;
}

// One ConvTranspose case: the node's attributes, and what ONNX's formulas give for it by hand
// (the output shape and the pad before each spatial dim).
struct Case {
  Shape x, w;
  int64_t group = 1;
  std::vector<onnx::AttributeProto> attrs;
  Shape y;
  std::vector<int64_t> pad_begin;
  std::vector<int64_t> strides, dilations;
};

// Y by ONNX's definition: every input element times W's window for its group's output channels,
// added at output position i * stride + k * dilation - pad_begin where that lies inside Y; + B.
std::vector<float> reference(const Case& c, const std::vector<float>& x,
                             const std::vector<float>& w, const std::vector<float>& b) {
  const size_t spatial = c.x.size() - 2;
  const int64_t n = c.x[0], ch = c.x[1], m = c.y[1], cg = ch / c.group, mg = m / c.group;
  const int64_t in_size = product(c.x, 2), out_size = product(c.y, 2), window = product(c.w, 2);
  std::vector<float> y(static_cast<size_t>(product(c.y)));
  for (int64_t b0 = 0; b0 < n; ++b0)
    for (int64_t oc = 0; oc < m; ++oc)
      for (int64_t o = 0; o < out_size; ++o) y[(b0 * m + oc) * out_size + o] = b[oc];
  for (int64_t b0 = 0; b0 < n; ++b0)
    for (int64_t ic = 0; ic < ch; ++ic)
      for (int64_t i = 0; i < in_size; ++i)
        for (int64_t mo = 0; mo < mg; ++mo)
          for (int64_t k = 0; k < window; ++k) {
            // Unravel i (input position) and k (kernel position) per spatial dim, last fastest.
            int64_t ri = i, rk = k, offset = 0, stride = 1;
            bool inside = true;
            for (size_t d = spatial; d-- > 0;) {
              const int64_t id = ri % c.x[2 + d], kd = rk % c.w[2 + d];
              ri /= c.x[2 + d];
              rk /= c.w[2 + d];
              const int64_t od = id * c.strides[d] + kd * c.dilations[d] - c.pad_begin[d];
              inside = inside && od >= 0 && od < c.y[2 + d];
              offset += od * stride;
              stride *= c.y[2 + d];
            }
            if (!inside) continue;
            const int64_t oc = (ic / cg) * mg + mo;
            y[(b0 * m + oc) * out_size + offset] += x[(b0 * ch + ic) * in_size + i] *
                                                     w[(ic * mg + mo) * window + k];
          }
  return y;
}

void check_against_reference(const Case& c) {
  CAPTURE(shape_string(c.x));
  CAPTURE(shape_string(c.w));
  testing::TempDir dir;
  ModelBuilder mb("conv_transpose");
  mb.add_input("x", kFloat, std::vector<samples::Dim>(c.x.begin(), c.x.end()));
  const int64_t m = c.w[1] * c.group;
  const std::vector<float> w = random_values(product(c.w), 2), b = random_values(m, 3);
  const std::string wn = mb.add_float_buffer("W", c.w, w);
  const std::string bn = mb.add_float_buffer("B", {m}, b);
  std::vector<onnx::AttributeProto> attrs = c.attrs;
  if (c.group != 1) attrs.push_back(attr_int("group", c.group));
  mb.add_node("ConvTranspose", "/up/ConvTranspose", {"x", wn, bn}, {"y"}, attrs);
  mb.add_output("y", kFloat, std::vector<samples::Dim>(c.y.begin(), c.y.end()));
  mb.write(dir.file("m.onnx"));
  const ImportedModel model = import_model(dir.file("m.onnx"), {});
  Program p = Program::from_model(ir::model_from_graph(model.graph), cpu_backend(), "m");
  auto device = cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(p.arena_bytes()) + 64);
  const std::vector<float> x = random_values(product(c.x), 1);
  std::vector<Tensor> inputs;
  inputs.push_back(Tensor::owned(DType::kFloat32, c.x));
  std::copy(x.begin(), x.end(), inputs[0].as<float>());
  const std::vector<Tensor> out = p.run(*device, inputs, arena.data());
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].shape == c.y);
  const std::vector<float> want = reference(c, x, w, b);
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(out[0].as<float>()[i] - want[i])));
  CHECK(worst <= 1e-5);
}

}  // namespace

TEST_CASE("ConvTranspose on the CPU equals ONNX's definition computed directly") {
  // Groups, strides, asymmetric pads, dilations: 6 = 2 * 2 + 3 - 1, 8 = 2 * 2 + 5 - 1.
  check_against_reference({.x = {1, 4, 3, 3},
                           .w = {4, 3, 3, 3},
                           .group = 2,
                           .attrs = {attr_ints("strides", {2, 2}), attr_ints("pads", {1, 0, 0, 1}),
                                     attr_ints("dilations", {1, 2})},
                           .y = {1, 6, 6, 8},
                           .pad_begin = {1, 0},
                           .strides = {2, 2},
                           .dilations = {1, 2}});
  // 1-D with output_padding: 15 = 3 * 4 + 2 + 3 - 2.
  check_against_reference({.x = {2, 3, 5},
                           .w = {3, 2, 3},
                           .attrs = {attr_ints("strides", {3}), attr_ints("pads", {1, 1}),
                                     attr_ints("output_padding", {2})},
                           .y = {2, 2, 15},
                           .pad_begin = {1},
                           .strides = {3},
                           .dilations = {1}});
  // 3-D with output_shape: total paddings 1, 0 and -1 (begin 1, 0, 0; the last extends).
  check_against_reference({.x = {1, 2, 2, 3, 2},
                           .w = {2, 1, 2, 2, 3},
                           .group = 2,
                           .attrs = {attr_ints("strides", {2, 1, 2}),
                                     attr_ints("output_shape", {3, 4, 6})},
                           .y = {1, 2, 3, 4, 6},
                           .pad_begin = {1, 0, 0},
                           .strides = {2, 1, 2},
                           .dilations = {1, 1, 1}});
  // auto_pad: out = in * stride, total paddings 0 and 1, the odd one before for SAME_LOWER.
  for (const char* pad : {"SAME_UPPER", "SAME_LOWER"})
    check_against_reference({.x = {1, 1, 3, 3},
                             .w = {1, 2, 2, 3},
                             .attrs = {attr_ints("strides", {2, 2}), attr_string("auto_pad", pad)},
                             .y = {1, 2, 6, 6},
                             .pad_begin = {0, std::string(pad) == "SAME_LOWER" ? 1 : 0},
                             .strides = {2, 2},
                             .dilations = {1, 1}});
}

TEST_CASE("ConvTranspose refusals at import: one line naming the node and the numbers") {
  testing::TempDir dir;
  auto refusal = [&](const Shape& w_shape, std::vector<onnx::AttributeProto> attrs,
                     int64_t bias = 0) {
    ModelBuilder b("refused");
    b.add_input("x", kFloat, {1, 4, 3, 3});
    std::vector<std::string> inputs{"x", b.add_parameter("W", w_shape, 9)};
    if (bias > 0) inputs.push_back(b.add_parameter("B", {bias}, 9));
    const std::string y = b.add_op("ConvTranspose", "/up/ConvTranspose", inputs, attrs);
    return testing::import_message(b, y, {1, "c", "h", "w"},
                                   dir.file(std::to_string(w_shape[1]) + ".onnx"));
  };
  CHECK(refusal({4, 2, 3, 3}, {attr_ints("strides", {2, 2}), attr_ints("output_padding", {1, 1})}) ==
        "imported");
  check_contains(
      refusal({4, 2, 3, 3}, {attr_ints("strides", {2, 2}), attr_ints("output_padding", {2, 0})}),
      "ConvTranspose '/up/ConvTranspose': output_padding 2 of spatial dim 0 must be in [0, "
      "max(stride 2, dilation 1))");
  check_contains(
      refusal({4, 2, 3, 3}, {attr_ints("dilations", {2, 2}), attr_ints("output_padding", {0, 1})}),
      "ConvTranspose '/up/ConvTranspose': the output of spatial dim 1 runs 1 positions past the "
      "last window (output_padding or output_shape); at most stride - 1 = 0 is supported");
  // output_shape past the full result: the extra position after (a total padding of -1) runs;
  // ONNX's split of -2 puts one before the first window, which the kernels do not run.
  CHECK(refusal({4, 2, 3, 3}, {attr_ints("strides", {2, 2}), attr_ints("output_shape", {8, 8})}) ==
        "imported");
  check_contains(
      refusal({4, 2, 3, 3}, {attr_ints("strides", {2, 2}), attr_ints("output_shape", {9, 9})}),
      "ConvTranspose '/up/ConvTranspose': the output of spatial dim 0 would start 1 positions "
      "before the first window (a negative pad before); not supported");
  check_contains(
      refusal({4, 2, 3, 3}, {attr_ints("output_shape", {6, 5})}),
      "ConvTranspose '/up/ConvTranspose': the output of spatial dim 0 runs 1 positions past the "
      "last window (output_padding or output_shape); at most stride - 1 = 0 is supported");
  check_contains(refusal({4, 1, 2, 2}, {attr_ints("strides", {2, 2})}, 3),
                 "bias 'B' [3] has 3 elements for 1 output channels");
}

TEST_CASE("a U-Net with ConvTranspose up-sampling: planned on 2 devices, run and trained as on one") {
  testing::TempDir dir;
  const std::string model = dir.file("unet.onnx");
  samples::build_unet({.width = 4, .image_size = 8}).write(model);
  testing::check_plans_and_training(model, "ConvTranspose", 2);
  const DType with_bias[] = {DType::kFloat32, DType::kFloat32, DType::kFloat32};
  testing::check_cuda_accepts("ConvTranspose", with_bias);
}

TEST_CASE("a U-Net with InstanceNormalization (pix2pix): 2 devices as one, trained") {
  testing::TempDir dir;
  const std::string model = dir.file("unet_in.onnx");
  samples::build_unet({.width = 4, .image_size = 8, .instance_norm = true}).write(model);
  testing::check_plans_and_training(model, "InstanceNormalization", 5);
  const DType three[] = {DType::kFloat32, DType::kFloat32, DType::kFloat32};
  testing::check_cuda_accepts("InstanceNormalization", three);
}

TEST_CASE("a U-Net with GroupNorm as torch exports it (InstanceNormalization): 2 devices as one") {
  testing::TempDir dir;
  const std::string model = dir.file("unet_gn.onnx");
  samples::build_unet({.width = 4, .image_size = 8, .group_norm = 2}).write(model);
  testing::check_plans_and_training(model, "InstanceNormalization", 5);
}

}  // namespace stagecraft::rt
