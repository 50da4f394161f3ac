// The graph IR: linking, topological order, cycles, compaction, shape arithmetic.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

#include "compiler/ir/graph.h"
#include "compiler/ir/weights.h"
#include "compiler/model_info.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

ir::ValueId add(ir::Graph& g, const std::string& name) {
  ir::Value v;
  v.name = name;
  v.dtype = DType::kFloat32;
  v.shape = {2};
  v.shape_known = true;
  return g.add_value(std::move(v));
}

ir::NodeId op(ir::Graph& g, const std::string& name, std::vector<ir::ValueId> in, std::vector<ir::ValueId> out) {
  ir::Node n;
  n.name = name;
  n.op_type = "Relu";
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return g.add_node(std::move(n));
}

TEST_CASE("topological order follows data, ties keep model order") {
  ir::Graph g;
  auto x = add(g, "x"), a = add(g, "a"), b = add(g, "b"), c = add(g, "c");
  g.value(x).is_graph_input = true;
  g.inputs.push_back(x);
  auto n_c = op(g, "c", {a, b}, {c});  // listed first but needs a and b
  auto n_a = op(g, "a", {x}, {a});
  auto n_b = op(g, "b", {x}, {b});
  CHECK(g.topological_order() == std::vector<ir::NodeId>{n_a, n_b, n_c});
}

TEST_CASE("a cycle is reported with a node on it") {
  ir::Graph g;
  auto a = add(g, "a"), b = add(g, "b");
  op(g, "first", {b}, {a});
  op(g, "second", {a}, {b});
  CHECK_THROWS_WITH_AS(g.topological_order(), doctest::Contains("cycle through node"), Error);
}

TEST_CASE("two producers of one tensor are refused") {
  ir::Graph g;
  auto x = add(g, "x"), y = add(g, "y");
  op(g, "one", {x}, {y});
  CHECK_THROWS_AS(op(g, "two", {x}, {y}), Error);
  CHECK_THROWS_AS(add(g, "x"), Error);
}

TEST_CASE("remove, rewire and compact keep links consistent") {
  ir::Graph g;
  auto x = add(g, "x"), a = add(g, "a"), y = add(g, "y");
  g.inputs.push_back(x);
  g.outputs.push_back(y);
  g.value(y).is_graph_output = true;
  auto first = op(g, "first", {x}, {a});
  op(g, "second", {a}, {y});
  g.remove_node(first);
  g.replace_all_uses(a, x);
  g.compact();
  CHECK(g.num_nodes() == 1);
  CHECK(g.num_values() == 2);  // "a" is gone
  CHECK(g.node(0).name == "second");
  CHECK(g.value(g.node(0).inputs[0]).name == "x");
  CHECK(g.value(*g.find_value("x")).consumers == std::vector<ir::NodeId>{0});
  CHECK(g.value(*g.find_value("y")).producer == 0);
  CHECK(!g.find_value("a"));
}

TEST_CASE("element counts check sign and overflow") {
  CHECK(ir::checked_numel({2, 3, 4}, "t") == 24);
  CHECK(ir::checked_numel({}, "t") == 1);
  CHECK(ir::checked_numel({0, int64_t{1} << 62}, "t") == 0);
  CHECK_THROWS_WITH_AS(ir::checked_numel({2, -1}, "t"), doctest::Contains("dim 1 is negative"), Error);
  CHECK_THROWS_WITH_AS(ir::checked_numel({int64_t{1} << 32, int64_t{1} << 32}, "t"),
                       doctest::Contains("overflows int64"), Error);
}

TEST_CASE("errors carry their context chain on one line") {
  Error e(ErrorKind::kModel, "bad thing");
  e.in("node 'n'").in("model.onnx");
  CHECK(std::string(e.what()) == "model.onnx: node 'n': bad thing");
  CHECK(exit_code(ErrorKind::kUsage) == 2);
  CHECK(exit_code(ErrorKind::kModel) == 1);
  // Bytes quoted from a hostile file cannot break the line (a fuzzing finding: a .npy key with
  // a newline in it).
  Error quoted(ErrorKind::kFormat, "unknown key 'a\nb\r\x01\tc'");
  quoted.in("x\ny.npy");
  CHECK(std::string(quoted.what()) == "x\\ny.npy: unknown key 'a\\nb\\r\\x01 c'");
}

TEST_CASE("weight bytes a sparse file never wrote are known unwritten, written ones are not") {
  testing::TempDir dir;
  const std::string path = dir.file("weights.data");
  constexpr int64_t kMiB = int64_t{1} << 20;
  {
    std::ofstream out(path, std::ios::binary);
    out << "written bytes";  // at offset 0
  }
  // 64 MiB more, never written (a hole, as stagecraft-make-samples --no-weight-bytes leaves),
  // then one written byte at the end.
  REQUIRE(::truncate(path.c_str(), 64 * kMiB) == 0);
  {
    std::fstream out(path, std::ios::binary | std::ios::in | std::ios::out);
    out.seekp(64 * kMiB - 1);
    out.put('x');
  }
  CHECK_FALSE(ir::WeightData::external(path, "weights.data", 0, 13)->unwritten());
  CHECK_FALSE(ir::WeightData::external(path, "weights.data", 0, 64 * kMiB)->unwritten());
  CHECK_FALSE(ir::WeightData::external(path, "weights.data", 64 * kMiB - 8, 8)->unwritten());
  // Whole blocks inside the hole (file systems keep holes in blocks of at most a few KiB), where
  // the file system reports holes at all (one that does not reads every byte: never wrong).
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  const bool holes = ::lseek(fd, 0, SEEK_HOLE) < 64 * kMiB;
  ::close(fd);
  if (holes)
    CHECK(ir::WeightData::external(path, "weights.data", kMiB, 4 * kMiB)->unwritten());
  else
    MESSAGE("this file system reports no holes: only the written cases are checked");
  CHECK_FALSE(ir::WeightData::owned(std::string(16, '\0'))->unwritten());
  CHECK_FALSE(ir::WeightData::external(dir.file("missing"), "missing", 0, 8)->unwritten());
}

}  // namespace
}  // namespace stagecraft

TEST_CASE("a node lies in a PyTorch module by its exporter scope") {
  using stagecraft::in_module;
  using stagecraft::module_of;
  CHECK(in_module("/enc/layers.2/self_attn/MatMul", "enc"));
  CHECK(in_module("/enc/layers.2/self_attn/MatMul", "enc.layers"));
  CHECK(in_module("/enc/layers.2/self_attn/MatMul", "enc.layers.2"));
  CHECK(in_module("/enc/layers.2/self_attn/MatMul", "enc.layers.2.self_attn"));
  CHECK_FALSE(in_module("/enc/layers.20/self_attn/MatMul", "enc.layers.2"));
  CHECK_FALSE(in_module("/enc/layers.2/self_attn/MatMul", "enc.layers.2.self"));
  CHECK_FALSE(in_module("/enc/layers.2/self_attn/MatMul", "enc.layers.2.self_attn.MatMul"));
  CHECK_FALSE(in_module("MatMul_12", "MatMul_12"));
  CHECK_FALSE(in_module("/enc/layers.2/MatMul", ""));
  CHECK(module_of("/enc/layers.2/self_attn/MatMul", 2) == "enc.layers.2");
  CHECK(module_of("/enc/layers.2/self_attn/MatMul", 9) == "enc.layers.2.self_attn");
  CHECK(module_of("/emb/Gather", 2) == "emb");
  CHECK(module_of("Gather_3", 2).empty());
}
