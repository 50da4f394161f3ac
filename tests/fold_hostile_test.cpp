// Constant folding on hostile numbers (issue 17, finding 6): integer arithmetic that would wrap
// is refused naming the node, and folding never allocates an output past its cap, so a
// few hundred bytes of model cannot take minutes and gigabytes to import.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <limits>

#include "compiler/import.h"
#include "passes/attributes.h"
#include "passes/host_tensor.h"
#include "passes/passes.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using passes::HostTensor;
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

HostTensor ints(std::vector<int64_t> shape, std::vector<int64_t> values,
                DType dtype = DType::kInt64) {
  return HostTensor{dtype, std::move(shape), std::move(values), {}};
}

ir::Node node_of(const std::string& op, const std::string& name = "hostile") {
  ir::Node node;
  node.op_type = op;
  node.name = name;
  return node;
}

/// Evaluates `op` on `a` and `b`, expecting a refusal naming the node with `needle`.
void expect_refused(const std::string& op, const HostTensor& a, const HostTensor& b,
                    const std::string& needle) {
  ir::Node node = node_of(op);
  try {
    passes::evaluate_on_host(node, {a, b}, {}, 17);
    FAIL(op << " folded; expected: " << needle);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == ErrorKind::kModel);
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

TEST_CASE("folded integer arithmetic that wraps is refused, naming the node") {
  // Issue 17: Div(INT64_MIN, -1) was SIGFPE; Add, Mul and Range wrapped silently.
  expect_refused("Div", ints({}, {kMin}), ints({}, {-1}),
                 "node 'hostile' (Div): -9223372036854775808 / -1 overflows int64");
  expect_refused("Add", ints({2}, {1, kMax}), ints({}, {1}),
                 "node 'hostile' (Add): 9223372036854775807 + 1 overflows int64 (element 1");
  expect_refused("Sub", ints({}, {kMin}), ints({1}, {1}), "-9223372036854775808 - 1 overflows");
  expect_refused("Mul", ints({}, {int64_t{1} << 62}), ints({}, {4}),
                 "4611686018427387904 x 4 overflows int64");
  expect_refused("Add", ints({}, {2147483647}, DType::kInt32), ints({}, {1}, DType::kInt32),
                 "2147483647 + 1 overflows int32");
  expect_refused("Div", ints({2}, {6, 3}), ints({2}, {3, 0}),
                 "node 'hostile' (Div): integer division by zero (3 / 0, element 1)");
  // Broadcast operands are read as the kernel reads them: [2, 1] x [3] -> [2, 3].
  expect_refused("Mul", ints({2, 1}, {1, int64_t{1} << 40}), ints({3}, {1, 1, int64_t{1} << 30}),
                 "1099511627776 x 1073741824 overflows int64 (element 5");
  ir::Node mul = node_of("Mul");
  auto fine = passes::evaluate_on_host(mul, {ints({2, 1}, {2, 3}), ints({3}, {1, -1, kMax / 3})},
                                       {}, 17);
  REQUIRE(fine);
  CHECK((*fine)[0].ints == std::vector<int64_t>{2, -2, kMax / 3 * 2, 3, -3, kMax / 3 * 3});

  ir::Node range = node_of("Range");
  CHECK_THROWS_WITH_AS(
      passes::evaluate_on_host(range, {ints({}, {-2}), ints({}, {kMax}), ints({}, {kMax / 2})}, {},
                               17),
      doctest::Contains("node 'hostile' (Range): limit - start = 9223372036854775807 - -2 "
                        "overflows int64"),
      Error);
  CHECK_THROWS_WITH_AS(
      passes::evaluate_on_host(range,
                               {ints({}, {-2147483648}, DType::kInt32),
                                ints({}, {2147483647}, DType::kInt32),
                                ints({}, {1 << 30}, DType::kInt32)},
                               {}, 17),
      doctest::Contains("limit - start = 2147483647 - -2147483648 overflows int32"), Error);
}

TEST_CASE("folding leaves an output past its cap to run time, without allocating it") {
  ir::Node fill = node_of("ConstantOfShape");
  // Issue 17: the shape was materialized first and compared with the cap after (a 200-byte
  // model took 105 s and 6.3 GB). 2^26 float32 is 256 MiB; 2^40 would be 4 TiB.
  for (int64_t n : {int64_t{1} << 26, int64_t{1} << 40, kMax}) {
    const auto start = std::chrono::steady_clock::now();
    CHECK_FALSE(passes::evaluate_on_host(fill, {ints({1}, {n})}, {}, 17));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  }
  CHECK_FALSE(passes::evaluate_on_host(fill, {ints({3}, {kMax, kMax, 2})}, {}, 17));
  CHECK_THROWS_WITH_AS(passes::evaluate_on_host(fill, {ints({2}, {4, -3})}, {}, 17),
                       doctest::Contains("node 'hostile' (ConstantOfShape): output shape [4,-3] has "
                                         "a negative dim (-3 at 1)"),
                       Error);
  ir::Node expand = node_of("Expand");
  CHECK_FALSE(passes::evaluate_on_host(expand, {ints({1}, {7}), ints({2}, {1 << 20, 1 << 20})},
                                       {}, 17));
  // Within the cap it folds.
  auto small = passes::evaluate_on_host(fill, {ints({2}, {2, 3})}, {}, 17);
  REQUIRE(small);
  CHECK((*small)[0].shape == std::vector<int64_t>{2, 3});
}

/// x [batch, 4] + ConstantOfShape(shape) broadcast: the constant is [1, n].
onnx::ModelProto huge_constant_model(int64_t n) {
  onnx::ModelProto m = testing::relu_model(13);
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_output();
  testing::add_int64_initializer(g, "fill_shape", {1, n});
  testing::add_node(g, "ConstantOfShape", {"fill_shape"}, {"zeros"}, "hostile");
  testing::add_tensor_info(g->add_output(), "zeros", onnx::TensorProto::FLOAT, {1, n});
  return m;
}

TEST_CASE("a model whose ConstantOfShape is 4 TiB imports at once, the node left in place") {
  testing::TempDir dir;
  testing::write_model(huge_constant_model(int64_t{1} << 40), dir.file("m.onnx"));
  ImportOptions options;
  options.batch = 1;
  const auto start = std::chrono::steady_clock::now();
  ImportedModel model = import_model(dir.file("m.onnx"), options);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  REQUIRE(model.graph.live_nodes() == 1);
  auto zeros = model.graph.find_value("zeros");
  REQUIRE(zeros);
  CHECK_FALSE(model.graph.value(*zeros).is_initializer());
  CHECK(model.graph.value(*zeros).shape == std::vector<int64_t>{1, int64_t{1} << 40});
}

/// A graph of `count` independent Add nodes, each of two int64 [elements] initializers.
ir::Graph adds(int count, int64_t elements) {
  ir::Graph g;
  g.opset = 17;
  std::string bytes(static_cast<std::size_t>(elements) * 8, '\0');
  for (int k = 0; k < count; ++k) {
    ir::Node node = node_of("Add", "add_" + std::to_string(k));
    for (const char* side : {"a", "b"}) {
      ir::Value v;
      v.name = fmt::format("{}{}", side, k);
      v.dtype = DType::kInt64;
      v.shape = {elements};
      v.shape_known = true;
      v.initializer = ir::WeightData::owned(bytes);
      node.inputs.push_back(g.add_value(std::move(v)));
    }
    ir::Value out;
    out.name = fmt::format("sum{}", k);
    node.outputs.push_back(g.add_value(std::move(out)));
    g.add_node(std::move(node));
  }
  return g;
}

TEST_CASE("folding refuses a model whose folded constants pass the total cap") {
  passes::PassContext context;
  context.fold_max_total_bytes = 3 * 4096 * 8;  // three folds of 4096 int64
  ir::Graph fits = adds(3, 4096);
  CHECK(passes::FoldConstants().run(fits, context));
  CHECK(context.folded_bytes == 3 * 4096 * 8);
  passes::PassContext fresh;
  fresh.fold_max_total_bytes = 3 * 4096 * 8;
  ir::Graph over = adds(4, 4096);
  CHECK_THROWS_WITH_AS(passes::FoldConstants().run(over, fresh),
                       doctest::Contains("node 'add_3' (Add): folding its 32768 bytes would bring "
                                         "the model's folded constants to 131072 bytes, past the "
                                         "cap of 98304"),
                       Error);
}

}  // namespace
}  // namespace stagecraft
