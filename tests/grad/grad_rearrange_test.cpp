// Finite-difference checks of the rearrange family's gradient kernels (runtime/cpu/rearrange.cpp):
// DepthToSpace (DCR, CRD), SpaceToDepth and TopK (largest and smallest, any axis; values only,
// Indices carry no gradient).
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "tests/grad/gradcheck.h"

namespace stagecraft::testing {
namespace {

using rt::Shape;
using rt::Tensor;

GradCase space_depth(const std::string& op, const Shape& shape, int64_t blocksize,
                     const std::string& mode = "") {
  GradCase c;
  c.op = op;
  c.inputs = {random_tensor(shape)};
  c.check = {true};
  c.attrs = [=](onnx::NodeProto& n) {
    set_int(n, "blocksize", blocksize);
    if (!mode.empty()) set_string(n, "mode", mode);
  };
  return c;
}

TEST_CASE("grad DepthToSpace and SpaceToDepth") {
  SUBCASE("DepthToSpace DCR") { gradcheck(space_depth("DepthToSpace", {2, 8, 3, 2}, 2, "DCR")); }
  SUBCASE("DepthToSpace CRD (torch's PixelShuffle)") {
    gradcheck(space_depth("DepthToSpace", {1, 18, 2, 3}, 3, "CRD"));
  }
  SUBCASE("DepthToSpace, default mode") { gradcheck(space_depth("DepthToSpace", {2, 4, 2, 2}, 2)); }
  SUBCASE("SpaceToDepth") { gradcheck(space_depth("SpaceToDepth", {2, 3, 4, 6}, 2)); }
  SUBCASE("blocksize 1 is the identity") {
    gradcheck(space_depth("SpaceToDepth", {1, 2, 3, 3}, 1));
  }
}

// Values well apart (a shuffled ramp, step 0.05), so the finite differences (eps 1e-3) never
// reorder them: TopK is smooth there.
Tensor spaced_tensor(const Shape& shape, unsigned seed) {
  Tensor t = Tensor::owned(DType::kFloat32, shape);
  std::vector<int64_t> order(static_cast<size_t>(t.numel()));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i = 0; i < order.size(); ++i)
    t.as<float>()[i] = 0.05f * static_cast<float>(order[i]) - 1.0f;
  return t;
}

GradCase topk(const Shape& shape, int64_t k, int64_t axis, bool largest, unsigned seed = 3) {
  GradCase c;
  c.op = "TopK";
  c.inputs = {spaced_tensor(shape, seed), int64_tensor({1}, {k})};
  c.check = {true, false};
  c.outputs = 2;
  c.int64_as_constants = true;
  c.attrs = [=](onnx::NodeProto& n) {
    set_int(n, "axis", axis);
    set_int(n, "largest", largest ? 1 : 0);
  };
  return c;
}

TEST_CASE("grad TopK") {
  SUBCASE("largest along the last axis (mixture-of-experts routing)") {
    gradcheck(topk({4, 8}, 2, -1, true));
  }
  SUBCASE("smallest along a middle axis") { gradcheck(topk({2, 5, 3}, 3, 1, false)); }
  SUBCASE("K equal to the axis: a sort") { gradcheck(topk({3, 4}, 4, 1, true, 7)); }
  SUBCASE("axis 0") { gradcheck(topk({6, 2, 2}, 1, 0, true, 11)); }
}

}  // namespace
}  // namespace stagecraft::testing
