// Host evaluation (constant folding) of the elementwise ops issue 15 added and ops.def marks
// kHostFolds: values from the CPU backend's kernels, integer results that do not fit refused
// naming the node.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>

#include "passes/attributes.h"
#include "passes/host_tensor.h"
#include "runtime/format/error.h"

namespace stagecraft {
namespace {

using passes::HostTensor;
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

HostTensor ints(std::vector<int64_t> shape, std::vector<int64_t> values,
                DType dtype = DType::kInt64) {
  return HostTensor{dtype, std::move(shape), std::move(values), {}};
}

HostTensor reals(std::vector<int64_t> shape, std::vector<double> values,
                 DType dtype = DType::kFloat32) {
  return HostTensor{dtype, std::move(shape), {}, std::move(values)};
}

ir::Node node_of(const std::string& op, const std::string& name = "n") {
  ir::Node node;
  node.op_type = op;
  node.name = name;
  return node;
}

/// The one output of `op` on `inputs`, which must fold.
HostTensor fold(const ir::Node& node, const std::vector<std::optional<HostTensor>>& inputs) {
  auto r = passes::evaluate_on_host(node, inputs, {}, 17);
  REQUIRE(r);
  REQUIRE(r->size() == 1);
  return (*r)[0];
}

TEST_CASE("host evaluation: Neg, Abs, Ceil and Floor") {
  HostTensor n = fold(node_of("Neg"), {ints({3}, {4, -2, 0})});
  CHECK(n.dtype == DType::kInt64);
  CHECK(n.ints == std::vector<int64_t>{-4, 2, 0});
  CHECK(fold(node_of("Abs"), {ints({3}, {4, -2, 0}, DType::kInt32)}).ints ==
        std::vector<int64_t>{4, 2, 0});
  CHECK(fold(node_of("Abs"), {reals({2}, {-1.5, 2})}).reals == std::vector<double>{1.5, 2});
  // A size computed in float: floor(7 / 2) and ceil(7 / 2), as exporters write them.
  CHECK(fold(node_of("Floor"), {reals({2}, {3.5, -3.5})}).reals == std::vector<double>{3, -4});
  CHECK(fold(node_of("Ceil"), {reals({2}, {3.5, -3.5}, DType::kFloat64)}).reals ==
        std::vector<double>{4, -3});
  // Ceil of an integer has no kernel signature: left to run time (the checker refuses it).
  CHECK_FALSE(passes::evaluate_on_host(node_of("Ceil"), {ints({1}, {3})}, {}, 17));
}

TEST_CASE("host evaluation: Split by sizes, by attribute and into equal parts") {
  // torch's repeat_interleave writes its shape arithmetic through a Split of a constant.
  ir::Node split = node_of("Split");
  split.inputs = {0, 1};
  split.outputs = {2, 3};
  onnx::AttributeProto axis;
  axis.set_name("axis");
  axis.set_type(onnx::AttributeProto::INT);
  axis.set_i(1);
  split.attributes.push_back(axis);
  const HostTensor x = ints({2, 3}, {1, 2, 3, 4, 5, 6});
  auto r = passes::evaluate_on_host(split, {x, ints({2}, {1, 2})}, {}, 17);
  REQUIRE(r);
  REQUIRE(r->size() == 2);
  CHECK((*r)[0].shape == std::vector<int64_t>{2, 1});
  CHECK((*r)[0].ints == std::vector<int64_t>{1, 4});
  CHECK((*r)[1].ints == std::vector<int64_t>{2, 3, 5, 6});
  // Sizes that do not add up to the dim: left to run time, which names them.
  CHECK_FALSE(passes::evaluate_on_host(split, {x, ints({2}, {1, 1})}, {}, 17));
  // Opset 11: the sizes as an attribute; no sizes: equal parts (axis 0 of reals).
  ir::Node old = split;
  old.inputs = {0};
  onnx::AttributeProto sizes;
  sizes.set_name("split");
  sizes.set_type(onnx::AttributeProto::INTS);
  sizes.add_ints(2);
  sizes.add_ints(1);
  old.attributes.push_back(sizes);
  r = passes::evaluate_on_host(old, {x}, {}, 11);
  REQUIRE(r);
  CHECK((*r)[0].ints == std::vector<int64_t>{1, 2, 4, 5});
  ir::Node halves = node_of("Split");
  halves.inputs = {0};
  halves.outputs = {2, 3};
  r = passes::evaluate_on_host(halves, {reals({2, 2}, {1, 2, 3, 4})}, {}, 17);
  REQUIRE(r);
  CHECK((*r)[1].reals == std::vector<double>{3, 4});
}

TEST_CASE("folded Neg and Abs of the lowest integer are refused, naming the node") {
  CHECK_THROWS_WITH_AS(
      passes::evaluate_on_host(node_of("Neg", "/mask/Neg"), {ints({2}, {1, kMin})}, {}, 17),
      doctest::Contains("node '/mask/Neg' (Neg): the negation of "
                        "-9223372036854775808 overflows int64 (element 1)"),
      Error);
  CHECK_THROWS_WITH_AS(
      passes::evaluate_on_host(node_of("Abs"), {ints({1}, {-2147483648}, DType::kInt32)}, {}, 17),
      doctest::Contains("node 'n' (Abs): the negation of -2147483648 overflows int32"), Error);
}

TEST_CASE("host evaluation: ReduceMin, ReduceMax and Reciprocal as detection transforms use them") {
  // torchvision's GeneralizedRCNNTransform: scale = min(800 / min(h, w), 1333 / max(h, w)).
  ir::Node min = node_of("ReduceMin"), max = node_of("ReduceMax");
  min.attributes.push_back(passes::int_attribute("keepdims", 0));
  max.attributes.push_back(passes::int_attribute("keepdims", 0));
  HostTensor lo = fold(min, {ints({2}, {480, 640})});
  CHECK(lo.shape.empty());
  CHECK(lo.ints == std::vector<int64_t>{480});
  CHECK(fold(max, {reals({2}, {480, 640})}).reals == std::vector<double>{640});
  HostTensor r = fold(node_of("Reciprocal"), {reals({2}, {4, -0.5}, DType::kFloat64)});
  CHECK(r.dtype == DType::kFloat64);
  CHECK(r.reals == std::vector<double>{0.25, -2});
  // keepdims (default 1) and axes, by the kernels' own rule.
  ir::Node rows = node_of("ReduceMax");
  rows.attributes.push_back(passes::ints_attribute("axes", {1}));
  HostTensor m = fold(rows, {ints({2, 3}, {1, 7, 3, 9, 2, 4})});
  CHECK(m.shape == std::vector<int64_t>{2, 1});
  CHECK(m.ints == std::vector<int64_t>{7, 9});
  // An axis out of range is refused naming the node; Reciprocal of an integer is left alone.
  ir::Node bad = node_of("ReduceMin", "/transform/ReduceMin");
  bad.attributes.push_back(passes::ints_attribute("axes", {3}));
  CHECK_THROWS_WITH_AS(passes::evaluate_on_host(bad, {ints({2}, {1, 2})}, {}, 17),
                       doctest::Contains("node '/transform/ReduceMin' (ReduceMin)"), Error);
  CHECK_FALSE(passes::evaluate_on_host(node_of("Reciprocal"), {ints({1}, {3})}, {}, 17));
}

// torchvision's Faster R-CNN keeps boxes by `>=` (its RPN's GreaterOrEqual); each comparison is
// its own IEEE one, false against NaN, not the negation of the strict other.
TEST_CASE("host evaluation: GreaterOrEqual and LessOrEqual, false against NaN") {
  const HostTensor idx = ints({6}, {0, 1, 2, 3, 4, 5});
  const HostTensor ge = fold(node_of("GreaterOrEqual"), {idx, ints({}, {3})});
  CHECK(ge.dtype == DType::kBool);
  CHECK(ge.ints == std::vector<int64_t>{0, 0, 0, 1, 1, 1});
  CHECK(fold(node_of("LessOrEqual"), {idx, ints({2, 1}, {0, 4})}).ints ==
        std::vector<int64_t>{1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0});
  const HostTensor x = reals({3}, {1.0, std::nan(""), -2.0});
  CHECK(fold(node_of("GreaterOrEqual"), {x, reals({}, {1.0})}).ints ==
        std::vector<int64_t>{1, 0, 0});
  CHECK(fold(node_of("LessOrEqual"), {x, reals({}, {1.0})}).ints == std::vector<int64_t>{1, 0, 1});
}

TEST_CASE(
    "host evaluation: Greater, Less, Not, And, Or, Min, Max and Mod as Swin's masks use them") {
  const HostTensor idx = ints({6}, {0, 1, 2, 3, 4, 5});
  CHECK(fold(node_of("Greater"), {idx, ints({}, {3})}).ints ==
        std::vector<int64_t>{0, 0, 0, 0, 1, 1});
  const HostTensor less = fold(node_of("Less"), {idx, ints({}, {2})});
  CHECK(less.dtype == DType::kBool);
  CHECK(less.ints == std::vector<int64_t>{1, 1, 0, 0, 0, 0});
  const HostTensor no = fold(node_of("Not"), {less});
  CHECK(no.ints == std::vector<int64_t>{0, 0, 1, 1, 1, 1});
  const HostTensor pair = HostTensor{DType::kBool, {2, 1}, {0, 1}, {}};
  CHECK(fold(node_of("And"), {no, pair}).ints ==
        std::vector<int64_t>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1});
  CHECK(fold(node_of("Or"), {less, HostTensor{DType::kBool, {}, {0}, {}}}).ints == less.ints);
  // Variadic, broadcasting: Max(idx, 2, [[4], [1]]) -> [2, 6].
  const HostTensor mx = fold(node_of("Max"), {idx, ints({}, {2}), ints({2, 1}, {4, 1})});
  CHECK(mx.shape == std::vector<int64_t>{2, 6});
  CHECK(mx.ints == std::vector<int64_t>{4, 4, 4, 4, 4, 5, 2, 2, 2, 3, 4, 5});
  CHECK(fold(node_of("Min"), {idx}).ints == idx.ints);
  CHECK(fold(node_of("Min"), {reals({2}, {0.5, -1}), reals({}, {0})}).reals ==
        std::vector<double>{0, -1});
  // Mod: fmod=0 takes the divisor's sign (Python's %), fmod=1 the dividend's (C's).
  const HostTensor num = ints({4}, {7, -7, 7, -7}), den = ints({4}, {3, 3, -3, -3});
  CHECK(fold(node_of("Mod"), {num, den}).ints == std::vector<int64_t>{1, 2, -2, -1});
  ir::Node fmod = node_of("Mod");
  fmod.attributes.push_back(passes::int_attribute("fmod", 1));
  CHECK(fold(fmod, {num, den}).ints == std::vector<int64_t>{1, -1, 1, -1});
  CHECK(fold(fmod, {reals({2}, {5.5, -5.5}), reals({}, {2})}).reals ==
        std::vector<double>{1.5, -1.5});
  CHECK(fold(node_of("Mod"), {ints({1}, {kMin}), ints({1}, {-1})}).ints == std::vector<int64_t>{0});
  // A float Mod needs fmod=1: no kernel signature, left to the checker.
  CHECK_FALSE(passes::evaluate_on_host(node_of("Mod"), {reals({1}, {1}), reals({1}, {2})}, {}, 17));
}

TEST_CASE("folded integer Mod by zero is refused, naming the node") {
  CHECK_THROWS_WITH_AS(
      passes::evaluate_on_host(node_of("Mod", "/attn/Mod"), {ints({2}, {5, 6}), ints({2}, {2, 0})},
                               {}, 17),
      doctest::Contains("node '/attn/Mod' (Mod): integer modulo by zero (6 % 0, element 1)"),
      Error);
}

}  // namespace
}  // namespace stagecraft

namespace stagecraft {
namespace {

TEST_CASE("a Slice of bool bytes folds as the decoded Slice does: random bounds, axes and steps") {
  // bool_slice_on_host (attention fusion's masks) against evaluate_on_host on rank-3 data:
  // bounds past either end, negative, negative steps, steps near 2^63, bytes other than 0 and 1.
  std::mt19937 rng(7);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const std::vector<int64_t> shape{3, 5, 4};
  ir::Node slice;
  slice.op_type = "Slice";
  slice.name = "/attn/Slice";
  int folded = 0;
  for (int round = 0; round < 300; ++round) {
    HostTensor data = ints(shape, {}, DType::kBool);
    std::vector<std::byte> bytes;
    for (int64_t i = 0; i < 60; ++i) {
      const int64_t v = pick(0, 2);  // a byte of 2 reads as true
      data.ints.push_back(v != 0);
      bytes.push_back(static_cast<std::byte>(v));
    }
    const int64_t k = pick(1, 3);
    std::vector<int64_t> starts, ends, axes, steps;
    std::vector<int64_t> all{0, 1, 2};
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t a = 0; a < k; ++a) {
      starts.push_back(pick(-7, 7));
      ends.push_back(pick(0, 3) == 0 ? std::numeric_limits<int64_t>::max() : pick(-7, 7));
      axes.push_back(pick(0, 1) ? all[a] : all[a] - 3);
      const int64_t huge =
          pick(0, 1) ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
      steps.push_back(pick(0, 9) == 0 ? huge : pick(0, 1) ? pick(1, 3) : -pick(1, 3));
    }
    std::vector<std::optional<HostTensor>> rest{ints({k}, starts), ints({k}, ends),
                                                ints({k}, axes), ints({k}, steps)};
    std::vector<std::optional<HostTensor>> all_in{data};
    all_in.insert(all_in.end(), rest.begin(), rest.end());
    CAPTURE(round);
    const auto want = passes::evaluate_on_host(slice, all_in, {}, 17);
    const auto got = passes::bool_slice_on_host(slice, shape, bytes, rest, 17);
    REQUIRE(want.has_value() == got.has_value());
    if (!want) continue;
    const HostTensor& w = want->front();
    REQUIRE(static_cast<int64_t>(got->size()) == w.numel());
    CHECK(std::vector<int64_t>(got->begin(), got->end()) == w.ints);
    ++folded;
  }
  CHECK(folded > 250);
  // Another op, opset 9's attribute bounds, or an operand the node names that is not constant
  // is not this path's.
  ir::Node gather = slice;
  gather.op_type = "Gather";
  const std::vector<std::byte> two(2);
  CHECK_FALSE(passes::bool_slice_on_host(gather, {2}, two, {ints({1}, {0}), ints({1}, {1})}, 17));
  CHECK_FALSE(passes::bool_slice_on_host(slice, {2}, two, {ints({1}, {0}), ints({1}, {1})}, 9));
  ir::Node named = slice;
  named.inputs = {0, 1, 2};
  CHECK(passes::bool_slice_on_host(named, {2}, two, {ints({1}, {0}), ints({1}, {1})}, 17));
  named.inputs.push_back(3);  // axes (input 3) named, but not a constant
  CHECK_FALSE(passes::bool_slice_on_host(named, {2}, two, {ints({1}, {0}), ints({1}, {1})}, 17));
  CHECK_FALSE(passes::bool_slice_on_host(named, {2}, two,
                                         {ints({1}, {0}), ints({1}, {1}), std::nullopt}, 17));
}

}  // namespace
}  // namespace stagecraft
