// Hostile models (issue 17): external data of Constant nodes resolves in the model's folder,
// external-data numbers are parsed whole and checked for overflow, hard links are refused, and
// attributes that ONNX's shape inference or our runtime would choke on are refused at import,
// naming the node.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <limits>

#include "compiler/import.h"
#include "runtime/format/error.h"
#include "tests/import_refusal.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using testing::expect_refused;
using testing::TempDir;
namespace fs = std::filesystem;

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

/// Sets an integer-list attribute on `node`.
void set_ints(onnx::NodeProto* node, const std::string& name, const std::vector<int64_t>& values) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

/// Sets an integer attribute on `node`.
void set_int(onnx::NodeProto* node, const std::string& name, int64_t value) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

/// Declares a graph output of `rank` whose dims shape inference is left to find.
void add_unshaped_output(onnx::GraphProto* g, const std::string& name, int rank,
                         int32_t elem_type = onnx::TensorProto::FLOAT) {
  testing::add_tensor_info(g->add_output(), name, elem_type, std::vector<int64_t>(rank, -1));
}

/// x [batch, channels, 8, 8] -> `op` (named "hostile") -> y; a Conv reads W [out, channels /
/// group, 3, 3]. The caller adds the attributes.
onnx::ModelProto window_model(const std::string& op, int64_t channels = 1, int64_t out = 2,
                              int64_t group = 1) {
  onnx::ModelProto m = testing::relu_model(13);
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_output();
  g->clear_input();
  testing::add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {-1, channels, 8, 8},
                           {"batch"});
  std::vector<std::string> inputs{"x"};
  if (op == "Conv" || op == "ConvTranspose") {
    testing::add_float_initializer(g, "W", {op == "Conv" ? out : channels,
                                            (op == "Conv" ? channels : out) / group, 3, 3});
    inputs.push_back("W");
  }
  testing::add_node(g, op, inputs, {"y"}, "hostile");
  add_unshaped_output(g, "y", 4);
  return m;
}

/// Writes `m` to a temporary folder and expects import to refuse it with `needle`.
void expect_model_refused(const onnx::ModelProto& m, ErrorKind kind, const std::string& needle) {
  TempDir dir;
  testing::write_model(m, dir.file("m.onnx"));
  expect_refused(dir.file("m.onnx"), kind, needle);
}

/// The node called "hostile" in `m`.
onnx::NodeProto* hostile(onnx::ModelProto& m) {
  auto* g = m.mutable_graph();
  for (int i = 0; i < g->node_size(); ++i)
    if (g->node(i).name() == "hostile") return g->mutable_node(i);
  throw std::runtime_error("no node 'hostile'");
}

TEST_CASE("window attributes libonnx divides by are refused before shape inference") {
  // Issue 17: strides = [0, 0] killed `stagec --info` with SIGFPE inside libonnx.
  auto with = [](const std::string& op, auto&& set) {
    onnx::ModelProto m = window_model(op);
    if (op != "Conv") set_ints(hostile(m), "kernel_shape", {3, 3});
    set(hostile(m));
    return m;
  };
  expect_model_refused(
      with("Conv", [](auto* n) { set_ints(n, "strides", {0, 0}); }), ErrorKind::kModel,
      "node 'hostile' (Conv): attribute strides = [0, 0]: entry 0 is 0; each must be >= 1");
  expect_model_refused(with("MaxPool", [](auto* n) { set_ints(n, "strides", {1, 0}); }),
                       ErrorKind::kModel,
                       "node 'hostile' (MaxPool): attribute strides = [1, 0]: entry 1 is 0");
  expect_model_refused(with("AveragePool", [](auto* n) { set_ints(n, "strides", {-2, 1}); }),
                       ErrorKind::kModel, "attribute strides = [-2, 1]: entry 0 is -2");
  expect_model_refused(with("Conv", [](auto* n) { set_ints(n, "dilations", {1, 0}); }),
                       ErrorKind::kModel, "(Conv): attribute dilations = [1, 0]: entry 1 is 0");
  expect_model_refused(with("MaxPool", [](auto* n) { n->mutable_attribute(0)->set_ints(1, 0); }),
                       ErrorKind::kModel, "attribute kernel_shape = [3, 0]: entry 1 is 0");
  expect_model_refused(with("Conv", [](auto* n) { set_ints(n, "pads", {0, 0, -1, 0}); }),
                       ErrorKind::kModel,
                       "attribute pads = [0, 0, -1, 0]: entry 2 is -1; each must be >= 0");
  expect_model_refused(with("Conv", [](auto* n) { set_int(n, "group", 0); }), ErrorKind::kModel,
                       "node 'hostile' (Conv): attribute group = 0; it must be >= 1");
  expect_model_refused(
      with("ConvTranspose", [](auto* n) { set_ints(n, "output_padding", {0, -1}); }),
      ErrorKind::kModel, "(ConvTranspose): attribute output_padding = [0, -1]: entry 1 is -1");
  onnx::ModelProto depth = window_model("DepthToSpace");
  set_int(hostile(depth), "blocksize", 0);
  expect_model_refused(depth, ErrorKind::kModel,
                       "node 'hostile' (DepthToSpace): attribute blocksize = 0; it must be >= 1");
  // The same attributes within their bounds import.
  TempDir dir;
  onnx::ModelProto fine = with("Conv", [](auto* n) {
    set_ints(n, "strides", {2, 2});
    set_ints(n, "pads", {1, 1, 1, 1});
    set_ints(n, "dilations", {1, 1});
  });
  testing::write_model(fine, dir.file("fine.onnx"));
  ImportOptions options;
  options.batch = 2;
  auto model = import_model(dir.file("fine.onnx"), options);
  auto y = model.graph.find_value("y");
  REQUIRE(y);
  CHECK(model.graph.value(*y).shape == std::vector<int64_t>{2, 2, 4, 4});
}

/// x [batch, 4] -> Shape -> Slice(starts [start], ends [end], axes [0], steps) -> s (int64).
/// The steps come from an initializer or, with `constant_node`, from a Constant node.
onnx::ModelProto slice_of_shape(int64_t step, bool constant_node = false, int64_t start = 0,
                                int64_t end = 2) {
  onnx::ModelProto m = testing::relu_model(13);
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_output();
  testing::add_node(g, "Shape", {"x"}, {"shape"}, "shape");
  testing::add_int64_initializer(g, "starts", {start});
  testing::add_int64_initializer(g, "ends", {end});
  testing::add_int64_initializer(g, "axes", {0});
  if (constant_node) {
    auto* c = testing::add_node(g, "Constant", {}, {"steps"}, "steps_constant");
    auto* a = c->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(onnx::TensorProto::INT64);
    a->mutable_t()->add_dims(1);
    a->mutable_t()->set_raw_data(std::string(reinterpret_cast<const char*>(&step), 8));
  } else {
    testing::add_int64_initializer(g, "steps", {step});
  }
  testing::add_node(g, "Slice", {"shape", "starts", "ends", "axes", "steps"}, {"s"}, "hostile");
  add_unshaped_output(g, "s", 1, onnx::TensorProto::INT64);
  return m;
}

TEST_CASE("a Slice step of 0 or past 2^31 is refused before ONNX's data propagation") {
  // Issue 17: INT64_MIN sent ONNX's data propagation over the shape tensor into a loop that ran
  // for minutes with its memory growing; -2^63 + 1 read past the shape (SIGSEGV).
  const int64_t min = std::numeric_limits<int64_t>::min();
  expect_model_refused(slice_of_shape(min, false, -1, min), ErrorKind::kModel,
                       "node 'hostile' (Slice): steps 'steps' entry 0 is -9223372036854775808; "
                       "stagecraft takes steps within +-2147483647");
  expect_model_refused(slice_of_shape(min + 1, false, -1, min), ErrorKind::kModel,
                       "steps 'steps' entry 0 is -9223372036854775807");
  expect_model_refused(slice_of_shape(min, true, -1, min), ErrorKind::kModel,
                       "steps 'steps' entry 0 is -9223372036854775808");
  expect_model_refused(slice_of_shape(int64_t{1} << 32, false), ErrorKind::kModel,
                       "steps 'steps' entry 0 is 4294967296");
  expect_model_refused(slice_of_shape(0), ErrorKind::kModel,
                       "node 'hostile' (Slice): steps 'steps' entry 0 is 0; a step must not be 0");
  // The largest step taken: from the last dim backwards, one element.
  TempDir dir;
  testing::write_model(slice_of_shape(-2147483647, false, -1, min), dir.file("m.onnx"));
  ImportOptions options;
  options.batch = 3;
  auto model = import_model(dir.file("m.onnx"), options);
  auto s = model.graph.find_value("s");
  REQUIRE(s);
  CHECK(model.graph.value(*s).shape == std::vector<int64_t>{1});
}

/// x [batch, 4] -> `op` (named "hostile", inputs x and then `more`) -> y of `out_rank`.
onnx::ModelProto one_node_model(const std::string& op, const std::vector<std::string>& more,
                                int out_rank, int32_t out_type = onnx::TensorProto::FLOAT,
                                int64_t opset = 17) {
  onnx::ModelProto m = testing::relu_model(opset);
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_output();
  std::vector<std::string> inputs{"x"};
  inputs.insert(inputs.end(), more.begin(), more.end());
  testing::add_node(g, op, inputs, {"y"}, "hostile");
  add_unshaped_output(g, "y", out_rank, out_type);
  return m;
}

TEST_CASE("models the runtime would refuse are refused at import, naming the node") {
  // Issue 17, finding 9: each of these imported and planned, and failed only when run.
  SUBCASE("a Conv group that does not divide the channels") {
    onnx::ModelProto m = window_model("Conv", /*channels=*/4, /*out=*/2, /*group=*/3);
    set_int(hostile(m), "group", 3);
    expect_model_refused(m, ErrorKind::kModel,
                         "node 'hostile' (Conv): group 3 does not divide the 4 input channels of "
                         "'x' [2,4,8,8]");
  }
  SUBCASE("a Conv weight whose channels do not match the group") {
    onnx::ModelProto m = window_model("Conv", /*channels=*/4, /*out=*/4, /*group=*/1);
    set_int(hostile(m), "group", 2);  // W [4, 4, 3, 3] needs [4, 2, 3, 3] with group 2
    expect_model_refused(m, ErrorKind::kModel,
                         "weight 'W' [4,4,3,3] has 4 channels per group; with group 2 the input "
                         "'x' [2,4,8,8] needs 2");
  }
  SUBCASE("a Conv group that does not divide the filters") {
    onnx::ModelProto m = window_model("Conv", /*channels=*/4, /*out=*/3, /*group=*/2);
    set_int(hostile(m), "group", 2);
    expect_model_refused(m, ErrorKind::kModel,
                         "group 2 does not divide the 3 filters of weight 'W' [3,2,3,3]");
  }
  SUBCASE("an axis out of range") {
    // Some ops' axes ONNX's own inference checks (Softmax, Concat, Flatten: refused there,
    // naming the node); the others are checked after it.
    struct Case {
      const char* op;
      std::vector<std::string> more;
      int out_rank;
      const char* attribute;
      std::vector<int64_t> value;
    };
    const Case cases[] = {
        {"Softmax", {}, 2, "axis", {5}},
        {"Concat", {"x"}, 2, "axis", {-3}},
        {"Flatten", {}, 2, "axis", {3}},
        {"LayerNormalization", {"scale"}, 2, "axis", {2}},
        {"Split", {}, 2, "axis", {2}},
        {"Gather", {"idx"}, 2, "axis", {-3}},
        {"ReduceMean", {}, 2, "axes", {2}},
        {"ReduceMean", {}, 2, "axes", {1, -1}},
        {"Squeeze", {"axes"}, 1, "", {2}},
        {"Unsqueeze", {"axes"}, 3, "", {3}},
        {"Unsqueeze", {"axes"}, 4, "", {1, 1}},
        {"Gather", {"idx"}, 2, "axis", {2}},
        {"LayerNormalization", {"scale"}, 2, "axis", {-3}},
    };
    for (const Case& c : cases) {
      onnx::ModelProto m = one_node_model(c.op, c.more, c.out_rank);
      if (std::string(c.op) == "LayerNormalization")
        testing::add_float_initializer(m.mutable_graph(), "scale", {4});
      if (std::string(c.op) == "Gather") testing::add_int64_initializer(m.mutable_graph(), "idx", {0});
      if (std::string(c.attribute) == "axis") set_int(hostile(m), "axis", c.value[0]);
      else if (std::string(c.attribute) == "axes") set_ints(hostile(m), "axes", c.value);
      else testing::add_int64_initializer(m.mutable_graph(), "axes", c.value);
      TempDir dir;
      testing::write_model(m, dir.file("m.onnx"));
      ImportOptions options;
      options.batch = 2;
      try {
        import_model(dir.file("m.onnx"), options);
        FAIL(c.op << " with " << c.attribute << " " << c.value[0] << " imported");
      } catch (const Error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find(fmt::format("node 'hostile' ({})", c.op)) != std::string::npos);
        CHECK(what.find('\n') == std::string::npos);
      }
    }
    // What ONNX 1.12's inference lets through is refused by our own check.
    onnx::ModelProto norm = one_node_model("LayerNormalization", {"scale"}, 2);
    testing::add_float_initializer(norm.mutable_graph(), "scale", {4});
    set_int(hostile(norm), "axis", 2);
    expect_model_refused(norm, ErrorKind::kModel,
                         "node 'hostile' (LayerNormalization): axis 2 is out of range for 'x' of "
                         "rank 2 [2,4]; it must be in [-2, 1]");
    onnx::ModelProto reduce = one_node_model("ReduceMean", {}, 2);
    set_ints(hostile(reduce), "axes", {1, -1});
    expect_model_refused(reduce, ErrorKind::kModel,
                         "node 'hostile' (ReduceMean): axis -1 is listed twice in axes");
  }
  SUBCASE("a Reshape that changes the element count") {
    onnx::ModelProto m = one_node_model("Reshape", {"shape"}, 2);
    testing::add_int64_initializer(m.mutable_graph(), "shape", {3, 5});
    expect_model_refused(m, ErrorKind::kModel,
                         "node 'hostile' (Reshape): 'x' [2,4] holds 8 elements but its output "
                         "'y' [3,5] holds 15");
  }
  SUBCASE("a constant Gather index outside its dim") {
    onnx::ModelProto m = one_node_model("Gather", {"idx"}, 2);
    testing::add_int64_initializer(m.mutable_graph(), "idx", {0, 7});
    set_int(hostile(m), "axis", 1);
    expect_model_refused(m, ErrorKind::kModel,
                         "node 'hostile' (Gather): index 7 (entry 1 of 'idx') is out of range "
                         "for axis 1 of 'x' [2,4], of size 4; indices must be in [-4, 3]");
    onnx::ModelProto negative = one_node_model("Gather", {"idx"}, 2);
    testing::add_int64_initializer(negative.mutable_graph(), "idx", {-5});
    set_int(hostile(negative), "axis", 1);
    expect_model_refused(negative, ErrorKind::kModel, "index -5 (entry 0 of 'idx')");
  }
  SUBCASE("the same nodes within their limits import") {
    TempDir dir;
    onnx::ModelProto conv = window_model("Conv", /*channels=*/4, /*out=*/2, /*group=*/2);
    set_int(hostile(conv), "group", 2);
    onnx::ModelProto gather = one_node_model("Gather", {"idx"}, 2);
    testing::add_int64_initializer(gather.mutable_graph(), "idx", {-4, 3});
    set_int(hostile(gather), "axis", 1);
    onnx::ModelProto reshape = one_node_model("Reshape", {"shape"}, 2);
    testing::add_int64_initializer(reshape.mutable_graph(), "shape", {4, 2});
    for (const auto* m : {&conv, &gather, &reshape}) {
      testing::write_model(*m, dir.file("ok.onnx"));
      ImportOptions options;
      options.batch = 2;
      CHECK_NOTHROW(import_model(dir.file("ok.onnx"), options));
    }
  }
}

}  // namespace
}  // namespace stagecraft
