// DepthToSpace, SpaceToDepth and TopK as exporters write them (issue 29): a small model using
// all three (a pixel-shuffle stage, then top-k routing over 16 scores whose Indices pick from a
// second projection, as a mixture-of-experts router does) planned on 2 devices, run and trained
// as on one; refusals at import in one line naming the node and the numbers, and a K computed at
// run time refused naming K's input. The gradients are checked in tests/grad
// (grad_rearrange_test.cpp), ONNX's own cases by the conformance run.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "samples/builder/model_builder.h"
#include "tests/runtime/op_coverage_util.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

using samples::attr_int;
using samples::attr_string;
using samples::make_int64_tensor;
using samples::ModelBuilder;
using testing::check_contains;

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

// x [batch,8,4,4] -> Conv 1x1 (16 channels) -> DepthToSpace CRD (torch's PixelShuffle(2)) ->
// [batch,4,8,8] -> SpaceToDepth 2 -> [batch,16,4,4] -> DepthToSpace DCR 2 -> [batch,4,8,8] ->
// Flatten -> MatMul -> scores [batch,16]; TopK(scores, 4) -> values, indices; z = MatMul of the
// flattened image [batch,16]; y = MatMul(values + GatherElements(z, indices), w) [batch,3].
ModelBuilder rearrange_net() {
  ModelBuilder b("rearrange_net");
  b.add_input("x", kFloat, {"batch", 8, 4, 4});
  const std::string conv_w = b.add_parameter("conv.weight", {16, 8, 1, 1}, 8);
  std::string h = b.add_op("Conv", "/conv/Conv", {"x", conv_w});
  h = b.add_op("DepthToSpace", "/shuffle/DepthToSpace", {h},
               {attr_int("blocksize", 2), attr_string("mode", "CRD")});
  h = b.add_op("SpaceToDepth", "/unshuffle/SpaceToDepth", {h}, {attr_int("blocksize", 2)});
  h = b.add_op("DepthToSpace", "/shuffle2/DepthToSpace", {h},
               {attr_int("blocksize", 2), attr_string("mode", "DCR")});
  const std::string flat = b.add_op("Flatten", "/Flatten", {h}, {attr_int("axis", 1)});
  const std::string gate_w = b.add_parameter("gate.weight", {256, 16}, 256);
  const std::string scores = b.add_op("MatMul", "/gate/MatMul", {flat, gate_w});
  const std::string k = b.add_constant("/topk/Constant", make_int64_tensor({1}, {4}));
  b.add_node("TopK", "/topk/TopK", {scores, k}, {"values", "indices"}, {attr_int("axis", -1)});
  const std::string expert_w = b.add_parameter("expert.weight", {256, 16}, 256);
  const std::string z = b.add_op("MatMul", "/expert/MatMul", {flat, expert_w});
  const std::string picked =
      b.add_op("GatherElements", "/expert/GatherElements", {z, "indices"}, {attr_int("axis", 1)});
  const std::string sum = b.add_op("Add", "/Add", {"values", picked});
  const std::string out_w = b.add_parameter("out.weight", {4, 3}, 4);
  b.add_node("MatMul", "/out/MatMul", {sum, out_w}, {"y"});
  b.add_output("y", kFloat, {"batch", 3});
  return b;
}

// TopK of x [2,6] (K = 3 along the last axis) on the CPU backend: Values and Indices.
std::pair<std::vector<float>, std::vector<int64_t>> run_topk(const std::vector<float>& x,
                                                             int64_t largest, int64_t sorted) {
  testing::TempDir dir;
  ModelBuilder mb("topk");
  mb.add_input("x", kFloat, {2, 6});
  const std::string k = mb.add_constant("/k/Constant", make_int64_tensor({1}, {3}));
  mb.add_node("TopK", "/TopK", {"x", k}, {"values", "indices"},
              {attr_int("largest", largest), attr_int("sorted", sorted)});
  mb.add_output("values", kFloat, {2, 3});
  mb.add_output("indices", onnx::TensorProto::INT64, {2, 3});
  mb.write(dir.file("m.onnx"));
  const ImportedModel model = import_model(dir.file("m.onnx"), {});
  Program p = Program::from_model(ir::model_from_graph(model.graph), cpu_backend(), "m");
  auto device = cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(p.arena_bytes()) + 64);
  std::vector<Tensor> inputs;
  inputs.push_back(Tensor::owned(DType::kFloat32, {2, 6}));
  std::copy(x.begin(), x.end(), inputs[0].as<float>());
  const std::vector<Tensor> out = p.run(*device, inputs, arena.data());
  REQUIRE(out.size() == 2);
  REQUIRE(out[1].dtype == DType::kInt64);
  return {std::vector<float>(out[0].as<float>(), out[0].as<float>() + 6),
          std::vector<int64_t>(out[1].as<int64_t>(), out[1].as<int64_t>() + 6)};
}

TEST_CASE("TopK on the CPU: ties to the lower index, smallest, sorted = 0") {
  const std::vector<float> x = {1, 3, 2, 3, 0, 3, /**/ -1, 5, 5, -2, 4, -2};
  const auto [values, indices] = run_topk(x, 1, 1);
  CHECK(values == std::vector<float>{3, 3, 3, 5, 5, 4});
  CHECK(indices == std::vector<int64_t>{1, 3, 5, 1, 2, 4});
  const auto [small, small_at] = run_topk(x, 0, 1);
  CHECK(small == std::vector<float>{0, 1, 2, -2, -2, -1});
  CHECK(small_at == std::vector<int64_t>{4, 0, 2, 3, 5, 0});
  const auto [unsorted, unsorted_at] = run_topk(x, 1, 0);
  CHECK(unsorted == values);
  CHECK(unsorted_at == indices);
}

TEST_CASE("DepthToSpace, SpaceToDepth and TopK routing: planned on 2 devices, run and trained") {
  testing::TempDir dir;
  const std::string model = dir.file("rearrange_net.onnx");
  rearrange_net().write(model);
  CHECK(testing::run_against_unpartitioned(model, 1, "DepthToSpace") == 2);
  CHECK(testing::run_against_unpartitioned(model, 2, "TopK") == 1);
  testing::check_training(model);
  const DType one[] = {DType::kFloat32};
  testing::check_cuda_accepts("DepthToSpace", one);
  testing::check_cuda_accepts("SpaceToDepth", one);
}

TEST_CASE("the pixel-shuffle and top-k routing model trains in mixed precision on 2 devices") {
  testing::TempDir dir;
  const std::string model = dir.file("rearrange_net.onnx");
  rearrange_net().write(model);
  plan::PlanOptions o = testing::training_options(model, 2, "1f1b", "mse");
  o.precision = Precision::kMixed;
  const std::vector<double> losses = testing::train_losses(o, 8, dir.file("mixed"));
  REQUIRE(losses.size() == 8);
  for (double loss : losses) CHECK(std::isfinite(loss));
  CHECK(losses.back() < losses.front());
}

// x [1,c,h,w] -> op(attrs) -> Relu -> y, imported: the error message.
std::string space_depth_refusal(testing::TempDir& dir, const std::string& op, int64_t c, int64_t h,
                                std::vector<onnx::AttributeProto> attrs) {
  ModelBuilder b("refused");
  b.add_input("x", kFloat, {1, c, h, 4});
  const std::string y = b.add_op(op, "/bad/" + op, {"x"}, std::move(attrs));
  return testing::import_message(b, y, {1, "c", "h", "w"}, dir.file(op + ".onnx"));
}

TEST_CASE("DepthToSpace and SpaceToDepth refusals at import: one line naming the node") {
  testing::TempDir dir;
  const std::string channels =
      space_depth_refusal(dir, "DepthToSpace", 6, 4, {attr_int("blocksize", 2)});
  check_contains(channels, "/bad/DepthToSpace");
  check_contains(channels, "6 channels");
  check_contains(channels, "blocksize^2 = 4");
  const std::string mode = space_depth_refusal(
      dir, "DepthToSpace", 4, 4, {attr_int("blocksize", 2), attr_string("mode", "RCD")});
  check_contains(mode, "/bad/DepthToSpace");
  check_contains(mode, "RCD");
  const std::string height =
      space_depth_refusal(dir, "SpaceToDepth", 3, 5, {attr_int("blocksize", 2)});
  check_contains(height, "/bad/SpaceToDepth");
  check_contains(height, "height 5");
  const std::string block =
      space_depth_refusal(dir, "SpaceToDepth", 3, 4, {attr_int("blocksize", 0)});
  check_contains(block, "/bad/SpaceToDepth");
  check_contains(block, "locksize");
}

// x [2,5] -> TopK(x, K) along `axis` -> Relu(values) -> y; K a constant holding `k`, or (k
// absent) computed at run time from a graph input.
std::string topk_refusal(testing::TempDir& dir, std::optional<int64_t> k, int64_t axis,
                         const std::string& file) {
  ModelBuilder b("refused");
  b.add_input("x", kFloat, {2, 5});
  std::string k_name;
  if (k) {
    k_name = b.add_constant("/k/Constant", make_int64_tensor({1}, {*k}));
  } else {
    b.add_input("n", onnx::TensorProto::INT64, {1});
    const std::string one = b.add_constant("/k/Constant", make_int64_tensor({1}, {1}));
    k_name = b.add_op("Add", "/k/Add", {"n", one});
  }
  b.add_node("TopK", "/route/TopK", {"x", k_name}, {"values", "indices"}, {attr_int("axis", axis)});
  return testing::import_message(b, "values", {2, "k"}, dir.file(file));
}

TEST_CASE("TopK refusals at import: K out of range, a bad axis, a K computed at run time") {
  testing::TempDir dir;
  const std::string large = topk_refusal(dir, 6, 1, "large.onnx");
  check_contains(large, "/route/TopK");
  check_contains(large, "6");
  const std::string negative = topk_refusal(dir, -1, 1, "negative.onnx");
  check_contains(negative, "/route/TopK");
  check_contains(negative, "-1");
  const std::string axis = topk_refusal(dir, 2, 2, "axis.onnx");
  check_contains(axis, "/route/TopK");
  check_contains(axis, "axis = 2");
  const std::string runtime_k = topk_refusal(dir, std::nullopt, 1, "runtime.onnx");
  check_contains(runtime_k, "/route/TopK");
  check_contains(runtime_k, "'/k/Add_output_0'");
  check_contains(runtime_k, "data-dependent");
  CHECK(topk_refusal(dir, 5, -1, "fine.onnx") == "imported");
}

}  // namespace
}  // namespace stagecraft::rt
