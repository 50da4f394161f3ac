// Finite-difference checks of the Resize gradient kernel (runtime/cpu/resize.cpp) in the modes
// torch exports and the others ONNX defines for nearest and linear, and of the indexing family's
// (runtime/cpu/indexing.cpp): Tile, CumSum, GatherElements, ScatterND.
#include <doctest/doctest.h>

#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;
using rt::Tensor;

Tensor float_tensor(const std::vector<float>& values) {
  Tensor t = Tensor::owned(DType::kFloat32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.as<float>());
  return t;
}

std::function<void(onnx::NodeProto&)> resize_attrs(const std::string& mode,
                                                   const std::string& coordinates,
                                                   const std::string& nearest = "") {
  return [=](onnx::NodeProto& n) {
    set_string(n, "mode", mode);
    set_string(n, "coordinate_transformation_mode", coordinates);
    if (!nearest.empty()) set_string(n, "nearest_mode", nearest);
  };
}

// Resize(X, "", scales) as torch writes it for scale_factor (opset 13+: roi omitted).
GradCase by_scales(const Tensor& x, const std::vector<float>& scales,
                   std::function<void(onnx::NodeProto&)> attrs, int opset = 17) {
  GradCase c;
  c.op = "Resize";
  c.inputs = {x, Tensor{}, float_tensor(scales)};
  c.check = {true, false, false};
  c.constant = {false, false, true};
  c.attrs = std::move(attrs);
  c.opset = opset;
  return c;
}

// Resize(X, "", "", sizes) as torch writes it for size=(h, w).
GradCase by_sizes(const Tensor& x, const std::vector<int64_t>& sizes,
                  std::function<void(onnx::NodeProto&)> attrs) {
  GradCase c;
  c.op = "Resize";
  c.inputs = {x, Tensor{}, Tensor{}, int64_tensor({static_cast<int64_t>(sizes.size())}, sizes)};
  c.check = {true, false, false, false};
  c.int64_as_constants = true;
  c.attrs = std::move(attrs);
  return c;
}

}  // namespace

TEST_CASE("grad Resize nearest") {
  const Tensor x = random_tensor({2, 3, 4, 5});
  SUBCASE("torch's nn.Upsample(scale_factor=2): asymmetric, floor") {
    gradcheck(by_scales(x, {1, 1, 2, 2}, resize_attrs("nearest", "asymmetric", "floor")));
  }
  SUBCASE("a non-integer scale: some inputs read twice, some not at all") {
    gradcheck(by_scales(x, {1, 1, 1.5f, 0.7f}, resize_attrs("nearest", "asymmetric", "floor")));
  }
  SUBCASE("half_pixel, round_prefer_floor, downsampling by sizes") {
    gradcheck(by_sizes(x, {2, 3, 3, 2}, resize_attrs("nearest", "half_pixel")));
  }
  SUBCASE("round_prefer_ceil, ceil and align_corners") {
    gradcheck(
        by_sizes(x, {2, 3, 7, 9}, resize_attrs("nearest", "align_corners", "round_prefer_ceil")));
    gradcheck(by_scales(x, {1, 1, 2.5f, 1.6f}, resize_attrs("nearest", "half_pixel", "ceil")));
    gradcheck(by_scales(x, {1, 1, 3, 2}, resize_attrs("nearest", "tf_half_pixel_for_nn")));
  }
}

TEST_CASE("grad Resize linear") {
  const Tensor x = random_tensor({2, 3, 4, 5});
  SUBCASE("bilinear, half_pixel (F.interpolate, align_corners=False)") {
    gradcheck(by_scales(x, {1, 1, 2, 2}, resize_attrs("linear", "half_pixel")));
  }
  SUBCASE("bilinear, pytorch_half_pixel to sizes, up and down") {
    gradcheck(by_sizes(x, {2, 3, 9, 3}, resize_attrs("linear", "pytorch_half_pixel")));
    gradcheck(by_sizes(x, {2, 3, 1, 7}, resize_attrs("linear", "pytorch_half_pixel")));
  }
  SUBCASE("bilinear, align_corners (F.interpolate, align_corners=True)") {
    gradcheck(by_sizes(x, {2, 3, 8, 10}, resize_attrs("linear", "align_corners")));
    gradcheck(by_scales(x, {1, 1, 0.6f, 1.5f}, resize_attrs("linear", "align_corners")));
  }
  SUBCASE("asymmetric; every dim resized (trilinear and more)") {
    gradcheck(by_scales(x, {1, 1, 2, 3}, resize_attrs("linear", "asymmetric")));
    gradcheck(
        by_scales(random_tensor({3, 4, 2}), {2, 0.5f, 2.5f}, resize_attrs("linear", "half_pixel")));
  }
  SUBCASE("opset 11: roi and scales both given, roi empty") {
    GradCase c = by_scales(x, {1, 1, 2, 2}, resize_attrs("linear", "half_pixel"), 11);
    c.inputs[1] = Tensor::owned(DType::kFloat32, {0});
    c.constant = {false, true, true};
    gradcheck(c);
  }
}

TEST_CASE("grad Resize cubic") {
  const Tensor x = random_tensor({2, 3, 4, 5});
  SUBCASE("bicubic, pytorch_half_pixel (F.interpolate(mode='bicubic'))") {
    gradcheck(by_scales(x, {1, 1, 2, 2}, resize_attrs("cubic", "pytorch_half_pixel")));
    gradcheck(by_sizes(x, {2, 3, 3, 7}, resize_attrs("cubic", "pytorch_half_pixel")));
  }
  SUBCASE("align_corners, a = -0.5, exclude_outside") {
    gradcheck(by_sizes(x, {2, 3, 7, 9}, resize_attrs("cubic", "align_corners")));
    auto attrs = [](onnx::NodeProto& n) {
      resize_attrs("cubic", "half_pixel")(n);
      set_float(n, "cubic_coeff_a", -0.5f);
      set_int(n, "exclude_outside", 1);
    };
    gradcheck(by_scales(x, {1, 1, 1.5f, 0.8f}, attrs));
  }
}

TEST_CASE("grad Tile") {
  auto tile = [](const Tensor& x, const std::vector<int64_t>& repeats) {
    GradCase c;
    c.op = "Tile";
    c.inputs = {x, int64_tensor({static_cast<int64_t>(repeats.size())}, repeats)};
    c.check = {true, false};
    c.int64_as_constants = true;
    return c;
  };
  gradcheck(tile(random_tensor({2, 3, 4}), {1, 2, 3}));
  gradcheck(tile(random_tensor({3, 1}), {2, 5}));
  gradcheck(tile(random_tensor({2, 3}), {1, 1}));
  gradcheck(tile(random_tensor({2, 3}), {0, 2}));  // an empty output: dX is zero
}

TEST_CASE("grad CumSum") {
  auto cumsum = [](const Tensor& x, int64_t axis, int exclusive, int reverse) {
    GradCase c;
    c.op = "CumSum";
    c.inputs = {x, int64_tensor({}, {axis})};
    c.check = {true, false};
    c.attrs = [=](onnx::NodeProto& n) {
      if (exclusive >= 0) set_int(n, "exclusive", exclusive);
      if (reverse >= 0) set_int(n, "reverse", reverse);
    };
    return c;
  };
  const Tensor x = random_tensor({3, 4, 5});
  for (int64_t axis : {0, 1, -1})
    for (int exclusive : {-1, 0, 1})
      for (int reverse : {-1, 1}) {
        CAPTURE(axis);
        CAPTURE(exclusive);
        CAPTURE(reverse);
        gradcheck(cumsum(x, axis, exclusive, reverse));
      }
}

TEST_CASE("grad GatherElements") {
  auto gather = [](const Tensor& data, const Tensor& indices, int64_t axis) {
    GradCase c;
    c.op = "GatherElements";
    c.inputs = {data, indices};
    c.check = {true, false};
    c.attrs = [=](onnx::NodeProto& n) { set_int(n, "axis", axis); };
    return c;
  };
  SUBCASE("torch.gather along the classes, as NLL losses and top-k heads use it") {
    gradcheck(gather(random_tensor({4, 5}), int64_tensor({4, 1}, {2, 0, 4, -1}), 1));
  }
  SUBCASE("repeated indices add; an index nobody reads gets 0; indices smaller than data") {
    gradcheck(gather(random_tensor({3, 4, 2}),
                     int64_tensor({2, 4, 2}, {0, 0, 2, 2, 1, 1, 0, 0, 2, 2, 2, 2, 0, 1, 1, 0}), 0));
  }
  SUBCASE("a negative axis") {
    gradcheck(gather(random_tensor({2, 3, 4}),
                     int64_tensor({2, 3, 2}, {3, 3, 0, 1, 2, 2, -4, 1, 0, 0, 3, 2}), -1));
  }
}

TEST_CASE("grad ScatterND") {
  auto scatter = [](const Tensor& data, const Tensor& indices, const Tensor& updates,
                    const std::string& reduction) {
    GradCase c;
    c.op = "ScatterND";
    c.inputs = {data, indices, updates};
    c.check = {true, false, true};
    c.int64_as_constants = true;
    c.attrs = [=](onnx::NodeProto& n) {
      if (!reduction.empty()) set_string(n, "reduction", reduction);
    };
    return c;
  };
  SUBCASE("slices set by index, as torch exports x[:, idx] = v") {
    gradcheck(scatter(random_tensor({4, 3, 2}), int64_tensor({2, 1}, {1, -1}),
                      random_tensor({2, 3, 2}, -1, 1, 2), ""));
  }
  SUBCASE("elements set by full index tuples") {
    gradcheck(scatter(random_tensor({3, 4}), int64_tensor({3, 2}, {0, 1, 2, 3, 1, 0}),
                      random_tensor({3}, -1, 1, 3), "none"));
  }
  SUBCASE("a repeated slot: the last update wins and the earlier get no gradient") {
    gradcheck(scatter(random_tensor({4, 2}), int64_tensor({3, 1}, {2, 0, 2}),
                      random_tensor({3, 2}, -1, 1, 4), "none"));
  }
  SUBCASE("reduction add (opset 16): every update adds, data passes through") {
    gradcheck(scatter(random_tensor({4, 2}), int64_tensor({3, 1}, {2, 0, 2}),
                      random_tensor({3, 2}, -1, 1, 5), "add"));
  }
}

TEST_CASE("grad Resize: large (threaded paths)") {
  GradCase c =
      by_scales(random_tensor({2, 8, 24, 24}), {1, 1, 2, 2}, resize_attrs("linear", "half_pixel"));
  c.samples = 12;
  gradcheck(c);
}

}  // namespace stagecraft::testing
