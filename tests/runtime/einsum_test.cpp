// Einsum, rewritten at import into ReduceSum, Transpose, Reshape and MatMul (passes/
// lower_einsum.cpp), against ONNX's own conformance cases (their float64 data in float32: the
// backends multiply matrices in float32) and against a plain loop over every letter for the
// equations transformers use; attention written with einsums trained on 2 devices as on one;
// and the einsums it refuses, in one line naming the node.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/core/tensor_io.h"
#include "runtime/format/error.h"
#include "samples/builder/model_builder.h"
#include "tests/runtime/op_coverage_util.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

namespace fs = std::filesystem;
using samples::attr_string;
using samples::ModelBuilder;

constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

// Imports the model at `path` and runs it as one program on the CPU backend.
std::vector<Tensor> run_imported(const std::string& path, const std::vector<Tensor>& args,
                                 int* einsums_left = nullptr, int* matmuls = nullptr) {
  ImportedModel imported = import_model(path, ImportOptions{});
  if (einsums_left != nullptr || matmuls != nullptr) {
    int e = 0, m = 0;
    for (ir::NodeId id : imported.graph.topological_order()) {
      e += imported.graph.node(id).op_type == "Einsum" ? 1 : 0;
      m += imported.graph.node(id).op_type == "MatMul" ? 1 : 0;
    }
    if (einsums_left != nullptr) *einsums_left = e;
    if (matmuls != nullptr) *matmuls = m;
  }
  Program program =
      Program::from_model(ir::model_from_graph(imported.graph), cpu_backend(), path);
  auto device = cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(program.arena_bytes()) + 64);
  return program.run(*device, args, arena.data());
}

// ---- ONNX's conformance cases, in float32 --------------------------------------------------

const fs::path kConformance = "/usr/share/libonnx-testdata/data/node";

// A float64 TensorProto as float32.
void to_float(onnx::TensorProto& t) {
  if (t.data_type() != onnx::TensorProto::DOUBLE) return;
  std::vector<double> values;
  if (t.has_raw_data()) {
    values.resize(t.raw_data().size() / sizeof(double));
    std::memcpy(values.data(), t.raw_data().data(), values.size() * sizeof(double));
  } else {
    values.assign(t.double_data().begin(), t.double_data().end());
  }
  std::vector<float> floats(values.begin(), values.end());
  t.clear_raw_data();
  t.clear_double_data();
  t.set_data_type(kFloat);
  t.set_raw_data(std::string(reinterpret_cast<const char*>(floats.data()),
                             floats.size() * sizeof(float)));
}

onnx::TensorProto read_pb(const fs::path& path) {
  onnx::TensorProto t;
  std::ifstream in(path, std::ios::binary);
  REQUIRE(t.ParseFromIstream(&in));
  return t;
}

// Runs conformance case `name` with its data in float32; returns its outputs and ONNX's.
void check_conformance_case(const std::string& name, const testing::TempDir& dir) {
  const fs::path root = kConformance / name;
  onnx::ModelProto model;
  {
    std::ifstream in(root / "model.onnx", std::ios::binary);
    REQUIRE(model.ParseFromIstream(&in));
  }
  for (auto* list : {model.mutable_graph()->mutable_input(), model.mutable_graph()->mutable_output()})
    for (auto& v : *list)
      if (v.type().tensor_type().elem_type() == onnx::TensorProto::DOUBLE)
        v.mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
  const std::string path = dir.file(name + ".onnx");
  {
    std::ofstream out(path, std::ios::binary);
    REQUIRE(model.SerializeToOstream(&out));
  }
  std::vector<Tensor> args;
  for (int k = 0; k < model.graph().input_size(); ++k) {
    onnx::TensorProto t = read_pb(root / "test_data_set_0" / fmt::format("input_{}.pb", k));
    to_float(t);
    const std::string pb = dir.file(fmt::format("{}_in{}.pb", name, k));
    std::ofstream(pb, std::ios::binary) << t.SerializeAsString();
    args.push_back(read_tensor_pb(pb));
  }
  int einsums = -1;
  std::vector<Tensor> got = run_imported(path, args, &einsums);
  CHECK(einsums == 0);
  onnx::TensorProto want_pb = read_pb(root / "test_data_set_0" / "output_0.pb");
  to_float(want_pb);
  const std::string pb = dir.file(name + "_out.pb");
  std::ofstream(pb, std::ios::binary) << want_pb.SerializeAsString();
  const Tensor want = read_tensor_pb(pb);
  REQUIRE(got.size() == 1);
  REQUIRE(got[0].shape == want.shape);
  for (int64_t i = 0; i < want.numel(); ++i) {
    const float w = want.as<float>()[i];
    CHECK(std::fabs(got[0].as<float>()[i] - w) <= 1e-5f + 1e-4f * std::fabs(w));
  }
}

TEST_CASE("Einsum lowered at import gives ONNX's conformance results (in float32)") {
  if (!fs::exists(kConformance / "test_einsum_batch_matmul")) {
    MESSAGE("SKIP: no ONNX conformance data (Debian's libonnx-testdata; tools/setup.sh installs it)");
    return;
  }
  testing::TempDir dir;
  for (const char* name : {"test_einsum_batch_matmul", "test_einsum_inner_prod", "test_einsum_sum",
                           "test_einsum_transpose"}) {
    CAPTURE(name);
    check_conformance_case(name, dir);
  }
}

// ---- Transformer equations against a loop over every letter --------------------------------

// Y = einsum(equation)(A, B) by visiting every assignment of the letters (explicit output).
std::vector<float> naive_einsum(const std::string& a_term, const std::string& b_term,
                                const std::string& out_term, const std::map<char, int64_t>& size,
                                const std::vector<float>& a, const std::vector<float>& b) {
  std::string letters;  // the letters of this equation only: the others must not repeat terms
  for (char c : a_term + b_term)
    if (letters.find(c) == std::string::npos) letters.push_back(c);
  auto offset = [&](const std::string& term, const std::map<char, int64_t>& at) {
    int64_t o = 0;
    for (char c : term) o = o * size.at(c) + at.at(c);
    return o;
  };
  int64_t out_n = 1;
  for (char c : out_term) out_n *= size.at(c);
  std::vector<float> y(static_cast<size_t>(out_n), 0.0f);
  std::map<char, int64_t> at;
  for (char c : letters) at[c] = 0;
  for (;;) {
    y[static_cast<size_t>(offset(out_term, at))] +=
        a[static_cast<size_t>(offset(a_term, at))] * b[static_cast<size_t>(offset(b_term, at))];
    size_t k = 0;
    for (; k < letters.size(); ++k) {
      if (++at[letters[k]] < size.at(letters[k])) break;
      at[letters[k]] = 0;
    }
    if (k == letters.size()) break;
  }
  return y;
}

std::vector<int64_t> dims_of(const std::string& term, const std::map<char, int64_t>& size) {
  std::vector<int64_t> d;
  for (char c : term) d.push_back(size.at(c));
  return d;
}

samples::Shape model_shape(const std::vector<int64_t>& dims) {
  return samples::Shape(dims.begin(), dims.end());
}

Tensor filled(const std::vector<int64_t>& shape, float seed) {
  Tensor t = Tensor::owned(DType::kFloat32, shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.as<float>()[i] = std::sin(seed + 0.37f * static_cast<float>(i));
  return t;
}

struct Case {
  std::string equation;    // as the model writes it
  std::string a, b, out;   // the same with "..." and the implicit output spelled out
  int matmuls;             // the MatMuls the lowering writes
};

TEST_CASE("Einsum lowered at import equals a loop over every letter, for transformer equations") {
  const std::map<char, int64_t> size{{'a', 2}, {'b', 2}, {'c', 4}, {'d', 3}, {'h', 2},
                                     {'i', 3}, {'j', 5}, {'k', 4}, {'l', 2}, {'q', 3}};
  const Case cases[] = {
      {"bhqd,bhkd->bhqk", "bhqd", "bhkd", "bhqk", 1},  // attention scores
      {"bhqk,bhkd->bhqd", "bhqk", "bhkd", "bhqd", 1},  // attention-weighted values
      {"bid,jd->bij", "bid", "jd", "bij", 1},          // a projection against [out, in]
      {"ij,jk", "ij", "jk", "ik", 1},                  // implicit output
      {"bij,bjk->bik", "bij", "bjk", "bik", 1},
      {"...ij,...jk->...ik", "abij", "abjk", "abik", 1},
      {"ik,kj->ji", "ik", "kj", "ji", 1},              // output transposed
      {"ij,kl->ijkl", "ij", "kl", "ijkl", 1},          // outer product
      {"ij,jk->", "ij", "jk", "", 1},                  // everything summed
      {"ic,jd->ij", "ic", "jd", "ij", 1},              // a letter each operand sums alone
  };
  testing::TempDir dir;
  for (const Case& c : cases) {
    CAPTURE(c.equation);
    ModelBuilder builder("einsum");
    builder.add_input("A", kFloat, model_shape(dims_of(c.a, size)));
    builder.add_input("B", kFloat, model_shape(dims_of(c.b, size)));
    builder.add_node("Einsum", "/attn/Einsum", {"A", "B"}, {"Y"},
                     {attr_string("equation", c.equation)});
    const std::vector<int64_t> out = dims_of(c.out, size);
    builder.add_output("Y", kFloat, model_shape(out));
    const std::string path = dir.file("einsum.onnx");
    builder.write(path);
    const Tensor a = filled(dims_of(c.a, size), 0.5f), b = filled(dims_of(c.b, size), 1.5f);
    int einsums = -1, matmuls = -1;
    std::vector<Tensor> got = run_imported(path, {a, b}, &einsums, &matmuls);
    CHECK(einsums == 0);
    CHECK(matmuls == c.matmuls);
    const std::vector<float> want = naive_einsum(
        c.a, c.b, c.out, size, std::vector<float>(a.as<float>(), a.as<float>() + a.numel()),
        std::vector<float>(b.as<float>(), b.as<float>() + b.numel()));
    REQUIRE(got.size() == 1);
    REQUIRE(got[0].shape == out);
    for (size_t i = 0; i < want.size(); ++i)
      CHECK(std::fabs(got[0].as<float>()[i] - want[i]) <= 1e-5f + 1e-5f * std::fabs(want[i]));
  }
}

// Self-attention written with einsums as a model exporter would: x [batch,4,6] -> q, k, v by
// "btc,dc->btd" against [out, in] weights, scores "bqd,bkd->bqk", Softmax, "bqk,bkd->bqd",
// then a sum over the positions "btd->bd" -> y [batch,6].
ModelBuilder attention_net() {
  ModelBuilder b("einsum_attention");
  b.add_input("x", kFloat, {"batch", 4, 6});
  auto project = [&](const std::string& name) {
    const std::string w = b.add_parameter(name + ".weight", {6, 6}, 6);
    return b.add_op("Einsum", "/" + name + "/Einsum", {"x", w},
                    {attr_string("equation", "btc,dc->btd")});
  };
  const std::string q = project("q"), k = project("k"), v = project("v");
  std::string s = b.add_op("Einsum", "/scores/Einsum", {q, k},
                           {attr_string("equation", "bqd,bkd->bqk")});
  s = b.add_op("Softmax", "/scores/Softmax", {s}, {samples::attr_int("axis", -1)});
  const std::string o = b.add_op("Einsum", "/values/Einsum", {s, v},
                                 {attr_string("equation", "bqk,bkd->bqd")});
  b.add_node("Einsum", "/pool/Einsum", {o}, {"y"}, {attr_string("equation", "btd->bd")});
  b.add_output("y", kFloat, {"batch", 6});
  return b;
}

TEST_CASE("attention written with einsums runs and trains on 2 devices as on one") {
  testing::TempDir dir;
  const std::string model = dir.file("attention.onnx");
  attention_net().write(model);
  // Every Einsum is gone by the time the model is planned.
  CHECK(testing::run_against_unpartitioned(model, 2, "Einsum") == 0);
  testing::check_training(model);
}

TEST_CASE("Einsum refusals at import name the node and say why") {
  testing::TempDir dir;
  auto refused = [&](const std::string& equation, std::vector<std::vector<int64_t>> shapes,
                     std::vector<int64_t> out) {
    ModelBuilder builder("einsum_refused");
    std::vector<std::string> names;
    for (size_t k = 0; k < shapes.size(); ++k) {
      names.push_back(fmt::format("X{}", k));
      builder.add_input(names.back(), kFloat, model_shape(shapes[k]));
    }
    builder.add_node("Einsum", "/bad/Einsum", names, {"Y"}, {attr_string("equation", equation)});
    builder.add_output("Y", kFloat, model_shape(out));
    return testing::import_message(builder, dir.file("refused.onnx"));
  };
  CHECK(refused("bii->bi", {{2, 3, 3}}, {2, 3}).find(
            "node '/bad/Einsum' (Einsum): operand 0 repeats 'i' (a diagonal); not supported") !=
        std::string::npos);
  CHECK(refused("ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}, {2, 5})
            .find("3 operands; one or two are supported") != std::string::npos);
}

}  // namespace
}  // namespace stagecraft::rt
