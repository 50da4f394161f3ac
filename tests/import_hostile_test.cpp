// Hostile models (issue 17): external data of Constant nodes resolves in the model's folder,
// external-data numbers are parsed whole and checked for overflow, hard links are refused, and
// attributes that ONNX's shape inference or our runtime would choke on are refused at import,
// naming the node.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "compiler/import.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

/// Imports `path` expecting an Error of `kind` whose one-line message contains `needle`.
void expect_refused(const std::string& path, ErrorKind kind, const std::string& needle,
                    ImportOptions options = {}) {
  if (!options.batch && options.dims.empty()) options.batch = 2;
  try {
    import_model(path, options);
    FAIL("import of " << path << " succeeded; expected: " << needle);
  } catch (const Error& e) {
    std::string what = e.what();
    INFO(what);
    CHECK(e.kind() == kind);
    CHECK(what.find(needle) != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
}

/// Adds external-data entries to `t`.
void set_external(onnx::TensorProto* t, const std::string& location, const std::string& offset,
                  const std::string& length) {
  t->clear_float_data();
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* key, const std::string& value) {
    auto* e = t->add_external_data();
    e->set_key(key);
    e->set_value(value);
  };
  add("location", location);
  add("offset", offset);
  add("length", length);
}

/// The linear model with W [4,3] in external data.
onnx::ModelProto external_weight(const std::string& location, const std::string& offset,
                                 const std::string& length) {
  auto m = testing::linear_model();
  set_external(m.mutable_graph()->mutable_initializer(0), location, offset, length);
  return m;
}

/// The linear model whose bias comes from a Constant node holding external data at `location`.
onnx::ModelProto external_constant(const std::string& location) {
  auto m = testing::linear_model();
  auto* g = m.mutable_graph();
  g->mutable_initializer()->RemoveLast();  // b
  testing::add_node(g, "Constant", {}, {"b"}, "bias_constant");
  auto* node = g->mutable_node(g->node_size() - 1);
  auto* a = node->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_dims(3);
  set_external(t, location, "0", "12");
  // Constant first: nodes are in topological order.
  for (int i = g->node_size() - 1; i > 0; --i) g->mutable_node()->SwapElements(i, i - 1);
  return m;
}

/// Runs `body` with the current directory at `dir`, restoring it after.
template <typename Body>
void in_directory(const fs::path& dir, Body&& body) {
  const fs::path before = fs::current_path();
  fs::current_path(dir);
  try {
    body();
  } catch (...) {
    fs::current_path(before);
    throw;
  }
  fs::current_path(before);
}

TEST_CASE("a Constant's external data resolves in the model's folder, not the current one") {
  TempDir dir;
  fs::create_directories(dir.path() / "model");
  fs::create_directories(dir.path() / "home");
  std::string bias(12, '\0');
  const float values[3] = {1.5f, -2.0f, 0.25f};
  std::memcpy(bias.data(), values, 12);
  testing::write_bytes(dir.file("model/bias.bin"), bias);
  testing::write_model(external_constant("bias.bin"), dir.file("model/m.onnx"));
  // Issue 17: compiled from another folder, the location was looked up there.
  in_directory(dir.path() / "home", [&] {
    ImportOptions options;
    options.batch = 2;
    auto model = import_model(dir.file("model/m.onnx"), options);
    auto b = model.graph.find_value("b");
    REQUIRE(b);
    auto bytes = model.graph.value(*b).initializer->bytes();
    REQUIRE(bytes.size() == 12);
    float back[3];
    std::memcpy(back, bytes.data(), 12);
    CHECK(back[0] == 1.5f);
    CHECK(back[2] == 0.25f);
  });
  // A "secret" beside the user, not beside the model, is never read.
  testing::write_bytes(dir.file("home/secret.bin"), bias);
  testing::write_model(external_constant("secret.bin"), dir.file("model/s.onnx"));
  in_directory(dir.path() / "home", [&] {
    expect_refused(dir.file("model/s.onnx"), ErrorKind::kFormat, "secret.bin does not exist");
  });
  testing::write_model(external_constant("../home/secret.bin"), dir.file("model/d.onnx"));
  expect_refused(dir.file("model/d.onnx"), ErrorKind::kFormat, "'..' is refused");
}

TEST_CASE("external-data numbers are read whole and their sum cannot wrap") {
  TempDir dir;
  testing::write_bytes(dir.file("w.bin"), std::string(48, '\0'));
  auto check = [&](const onnx::ModelProto& m, const std::string& needle) {
    testing::write_model(m, dir.file("m.onnx"));
    expect_refused(dir.file("m.onnx"), ErrorKind::kFormat, needle);
  };
  // Issue 17: "64abc" was read as 64 (prefix parse).
  check(external_weight("w.bin", "0", "48abc"), "length '48abc' is not a number");
  check(external_weight("w.bin", "0x10", "48"), "offset '0x10' is not a number");
  check(external_weight("w.bin", "", "48"), "offset '' is not a number");
  check(external_weight("w.bin", "99999999999999999999", "48"), "is not a number");
  check(external_weight("w.bin", "9223372036854775800", "48"),
        "offset 9223372036854775800 + length 48 = over 2^63 lies past the end of the file");
}

TEST_CASE("an external data file with more than one hard link is refused") {
  TempDir dir;
  fs::create_directories(dir.path() / "m");
  testing::write_bytes(dir.file("outside.bin"), std::string(48, '\0'));
  fs::create_hard_link(dir.file("outside.bin"), dir.file("m/w.bin"));
  testing::write_model(external_weight("w.bin", "0", "48"), dir.file("m/m.onnx"));
  expect_refused(dir.file("m/m.onnx"), ErrorKind::kFormat, "w.bin has 2 hard links");
}

}  // namespace
}  // namespace stagecraft
