// ScatterElements and OneHot, rewritten at import (passes/lower_indexing.cpp) into ScatterND and
// into Equal and Where: OneHot's values against ONNX's definition (negative indices from the
// back, indices out of range all off, every axis); a model scattering a computed score back
// into zeros (torch's zeros_like(x).scatter(-1, top, x.gather(-1, top))) and adding by
// scatter_add plans on 2 devices and trains pipelined as on one (ONNX's scatter_elements cases
// check the forward in the conformance run).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "samples/builder/model_builder.h"
#include "tests/runtime/op_coverage_util.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

using samples::attr_int;
using samples::ModelBuilder;

// ids int64 [2, 5] -> OneHot(depth 4, values [off -1, on 3], axis) -> y float [...].
std::vector<float> one_hot(const std::vector<int64_t>& ids, int64_t axis, Shape* shape) {
  testing::TempDir dir;
  ModelBuilder b("one_hot");
  b.add_input("ids", onnx::TensorProto::INT64, {2, 5});
  const std::string depth = b.add_constant("/depth", samples::make_int64_tensor({}, {4}));
  const std::string values = b.add_constant("/values", samples::make_float_tensor({2}, {-1, 3}));
  b.add_node("OneHot", "/one_hot", {"ids", depth, values}, {"y"}, {attr_int("axis", axis)});
  samples::Shape out{2, 5};
  const int64_t at = axis < 0 ? axis + 3 : axis;
  out.insert(out.begin() + at, int64_t{4});
  b.add_output("y", onnx::TensorProto::FLOAT, out);
  b.write(dir.file("m.onnx"));
  ImportedModel m = import_model(dir.file("m.onnx"), {});
  for (const ir::Node& n : m.graph.nodes()) CHECK((n.dead || n.op_type != "OneHot"));
  Program p = Program::from_model(ir::model_from_graph(m.graph), cpu_backend(), "one_hot");
  auto device = cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(p.arena_bytes()) + 64);
  Tensor in = Tensor::owned(DType::kInt64, {2, 5});
  std::copy(ids.begin(), ids.end(), in.as<int64_t>());
  const std::vector<Tensor> args = {in};
  const std::vector<Tensor> y = p.run(*device, args, arena.data());
  *shape = y.at(0).shape;
  return std::vector<float>(y[0].as<float>(), y[0].as<float>() + y[0].numel());
}

}  // namespace

TEST_CASE("OneHot: negative indices from the back, out of range all off, on every axis") {
  const std::vector<int64_t> ids = {0, 3, -1, -4, 4, 2, -5, 1, 7, 0};
  // ONNX: class c of index i is on where i == c or i + depth == c (i in [-depth, depth)).
  auto on = [&](int64_t i, int64_t c) { return (i >= -4 && i < 4) && (i == c || i + 4 == c); };
  for (int64_t axis : {-1, 0, 1, 2}) {
    CAPTURE(axis);
    Shape shape;
    const std::vector<float> y = one_hot(ids, axis, &shape);
    const int64_t at = axis < 0 ? axis + 3 : axis;
    REQUIRE(shape.size() == 3);
    CHECK(shape[at] == 4);
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t k = 0; k < 5; ++k)
        for (int64_t c = 0; c < 4; ++c) {
          int64_t coord[3], rest[2] = {r, k}, j = 0;
          for (int d = 0; d < 3; ++d) coord[d] = d == at ? c : rest[j++];
          const float got = y[(coord[0] * shape[1] + coord[1]) * shape[2] + coord[2]];
          CHECK(got == (on(ids[r * 5 + k], c) ? 3.0f : -1.0f));
        }
  }
}

TEST_CASE("ScatterElements (scatter and scatter_add) plans on 2 devices and trains pipelined") {
  testing::TempDir dir;
  // x [batch, 6] -> s = Softmax(x W1) [batch, 4]; top = ArgMax(s) [batch, 1]; gate = zeros
  // scattered with GatherElements(s, top) at top; load = zeros + scatter_add of s at top; y =
  // Concat(gate, load) W2.
  ModelBuilder b("scatter");
  b.add_input("x", onnx::TensorProto::FLOAT, {"batch", 6});
  const std::string s = b.add_op(
      "Softmax", "/softmax", {b.add_op("MatMul", "/w1", {"x", b.add_parameter("w1", {6, 4}, 6)})},
      {attr_int("axis", -1)});
  const std::string top =
      b.add_op("ArgMax", "/argmax", {s}, {attr_int("axis", -1), attr_int("keepdims", 1)});
  const std::string picked = b.add_op("GatherElements", "/pick", {s, top}, {attr_int("axis", 1)});
  const std::string zeros = b.add_op(
      "Mul", "/zeros", {s, b.add_constant("/zero", samples::make_float_tensor({}, {0.0f}))});
  const std::string gate =
      b.add_op("ScatterElements", "/gate", {zeros, top, picked}, {attr_int("axis", 1)});
  const std::string load =
      b.add_op("ScatterElements", "/load", {s, top, picked},
               {attr_int("axis", 1), samples::attr_string("reduction", "add")});
  const std::string both = b.add_op("Concat", "/cat", {gate, load}, {attr_int("axis", 1)});
  b.add_node("MatMul", "/w2", {both, b.add_parameter("w2", {8, 3}, 8)}, {"y"});
  b.add_output("y", onnx::TensorProto::FLOAT, {"batch", 3});
  b.write(dir.file("scatter.onnx"));
  testing::check_plans_and_training(dir.file("scatter.onnx"), "ScatterND", 2);
}

}  // namespace stagecraft::rt
