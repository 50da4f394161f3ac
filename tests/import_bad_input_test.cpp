// Bad model files: each gives one clear Error naming the file and what is wrong.
#include <doctest/doctest.h>
#include <unistd.h>

#include "compiler/import.h"
#include "runtime/format/error.h"
#include "tests/import_refusal.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using testing::expect_refused;
using testing::TempDir;

TEST_CASE("a missing, empty, non-protobuf or truncated file is refused") {
  TempDir dir;
  expect_refused(dir.file("nope.onnx"), ErrorKind::kIo, "cannot open");
  testing::write_bytes(dir.file("empty.onnx"), "");
  expect_refused(dir.file("empty.onnx"), ErrorKind::kFormat, "empty file");
  testing::write_bytes(dir.file("text.onnx"), "this is not a protobuf at all\n\xff\xff\xff");
  expect_refused(dir.file("text.onnx"), ErrorKind::kFormat, "not a valid ONNX model");

  std::string bytes = testing::linear_model().SerializeAsString();
  testing::write_bytes(dir.file("truncated.onnx"), bytes.substr(0, bytes.size() * 2 / 3));
  expect_refused(dir.file("truncated.onnx"), ErrorKind::kFormat, "truncated");
}

TEST_CASE("every truncation of a valid model is refused or imports: none crashes") {
  TempDir dir;
  std::string bytes = testing::linear_model().SerializeAsString();
  int refused = 0;
  for (std::size_t cut = 1; cut < bytes.size(); cut += 7) {
    testing::write_bytes(dir.file("cut.onnx"), bytes.substr(0, cut));
    ImportOptions options;
    options.batch = 2;
    try {
      import_model(dir.file("cut.onnx"), options);
    } catch (const Error& e) {
      ++refused;
    }
  }
  CHECK(refused > 0);
}

TEST_CASE("a graph with a cycle names a node on it") {
  TempDir dir;
  auto m = testing::relu_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  testing::add_node(g, "Add", {"x", "b"}, {"a"}, "first");
  testing::add_node(g, "Relu", {"a"}, {"b"}, "second");
  testing::add_node(g, "Relu", {"b"}, {"y"}, "third");
  testing::write_model(m, dir.file("cycle.onnx"));
  expect_refused(dir.file("cycle.onnx"), ErrorKind::kModel, "cycle through node 'first'");
}

TEST_CASE("a node input nobody produces is named") {
  TempDir dir;
  auto m = testing::relu_model();
  m.mutable_graph()->mutable_node(0)->set_input(0, "ghost");
  testing::write_model(m, dir.file("dangling.onnx"));
  expect_refused(dir.file("dangling.onnx"), ErrorKind::kModel, "reads tensor 'ghost'");
}

TEST_CASE("negative dims and dims whose element count overflows int64 are refused") {
  TempDir dir;
  auto m = testing::relu_model();
  m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)
      ->set_dim_value(-4);
  testing::write_model(m, dir.file("negative.onnx"));
  expect_refused(dir.file("negative.onnx"), ErrorKind::kShape, "dim 1 is negative (-4)");

  auto big = testing::relu_model();
  big.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)
      ->set_dim_value(int64_t{1} << 62);
  testing::write_model(big, dir.file("overflow.onnx"));
  ImportOptions options;
  options.batch = 8;
  expect_refused(dir.file("overflow.onnx"), ErrorKind::kShape, "overflows int64", options);

  auto init = testing::linear_model();
  auto* w = init.mutable_graph()->mutable_initializer(0);
  w->clear_dims();
  w->add_dims(int64_t{1} << 40);
  w->add_dims(int64_t{1} << 40);
  testing::write_model(init, dir.file("overflow_init.onnx"));
  expect_refused(dir.file("overflow_init.onnx"), ErrorKind::kShape, "overflows int64");
}

TEST_CASE("an opset newer than 22 is refused with the numbers") {
  TempDir dir;
  testing::write_model(testing::relu_model(24), dir.file("opset24.onnx"));
  expect_refused(dir.file("opset24.onnx"), ErrorKind::kUnsupported,
                 "opset 24 is newer than 22, the newest stagecraft reads (opsets 18 to 22 as 17");
}

TEST_CASE("an unsupported op names the op, the node, the domain and the opset") {
  TempDir dir;
  auto m = testing::relu_model();
  m.mutable_graph()->mutable_node(0)->set_op_type("Tan");
  testing::write_model(m, dir.file("tan.onnx"));
  expect_refused(dir.file("tan.onnx"), ErrorKind::kUnsupported,
                 "op Tan (node '/relu/Relu', domain ai.onnx, opset 17) is not supported");

  // A detection model's post-processing: a data-dependent shape, said as the reason.
  auto nonzero = testing::relu_model();
  nonzero.mutable_graph()->mutable_node(0)->set_op_type("NonZero");
  auto* out_type = nonzero.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type();
  out_type->set_elem_type(onnx::TensorProto::INT64);
  out_type->mutable_shape()->clear_dim();
  out_type->mutable_shape()->add_dim()->set_dim_param("rank");
  out_type->mutable_shape()->add_dim()->set_dim_param("nonzero");
  testing::write_model(nonzero, dir.file("nonzero.onnx"));
  expect_refused(dir.file("nonzero.onnx"), ErrorKind::kUnsupported,
                 "op NonZero (node '/relu/Relu', domain ai.onnx, opset 17) is not supported: its "
                 "output's shape can depend on the values of input 'x'");

  auto custom = testing::relu_model();
  custom.mutable_graph()->mutable_node(0)->set_domain("com.microsoft");
  auto* imp = custom.add_opset_import();
  imp->set_domain("com.microsoft");
  imp->set_version(1);
  testing::write_model(custom, dir.file("custom.onnx"));
  expect_refused(dir.file("custom.onnx"), ErrorKind::kUnsupported, "domain 'com.microsoft', opset 1");
}

// torch.onnx's TrainingMode.TRAINING export at opsets 9 to 13 (11 and 12 are pinned in many
// scripts): the training outputs of BatchNormalization before training_mode existed, with no
// shapes from ONNX's inference. Import stopped at them ("has no static shape ... depends on the
// values of '/conv1/Conv_output_0'"); it now reads the opset 14 form.
TEST_CASE("a training-mode BatchNormalization before opset 14 imports as training_mode=1") {
  TempDir dir;
  auto m = testing::relu_model(13);
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_input();
  g->clear_output();
  testing::add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 3, 4, 4});
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {2, 3, 4, 4});
  for (const char* name : {"scale", "bias", "mean", "var"})
    testing::add_float_initializer(g, name, {3});
  testing::add_node(g, "BatchNormalization", {"x", "scale", "bias", "mean", "var"},
                    {"y", "running_mean", "running_var", "saved_mean", "saved_var"}, "/bn1/BN");
  testing::write_model(m, dir.file("bn13.onnx"));
  const ImportedModel got = import_model(dir.file("bn13.onnx"), ImportOptions{});
  const ir::Node* bn = nullptr;
  for (const ir::Node& n : got.graph.nodes())
    if (!n.dead && n.op_type == "BatchNormalization") bn = &n;
  REQUIRE(bn != nullptr);
  CHECK(bn->attr_int("training_mode", 0) == 1);
  REQUIRE(bn->outputs.size() == 3);
  for (size_t k = 1; k < 3; ++k) {
    CHECK(got.graph.value(bn->outputs[k]).shape == std::vector<int64_t>{3});
    CHECK(got.graph.value(bn->outputs[k]).shape_known);
  }
  // Y alone, an eval-mode export at any opset, stays in inference mode.
  g->mutable_node(0)->mutable_output()->DeleteSubrange(1, 4);
  testing::write_model(m, dir.file("bn13_eval.onnx"));
  const ImportedModel eval = import_model(dir.file("bn13_eval.onnx"), ImportOptions{});
  for (const ir::Node& n : eval.graph.nodes())
    if (!n.dead && n.op_type == "BatchNormalization") CHECK(n.attr_int("training_mode", 0) == 0);
}

TEST_CASE("PRelu at opset 6 with a slope per channel is refused, naming the node and shape") {
  // Before opset 7 the slope applied per channel (axis 1), not by numpy broadcasting.
  expect_refused(
      "/usr/share/libonnx-testdata/data/pytorch-converted/test_PReLU_2d_multiparam/model.onnx",
      ErrorKind::kUnsupported,
      "node 'PRelu(2)': PRelu at opset 6 applies its slope of shape [3] per channel");
}

/// A linear model whose weight W [4,3] lives in external data at `location`.
onnx::ModelProto external_model(const std::string& location, int64_t offset = 0, int64_t length = 48) {
  auto m = testing::linear_model();
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_float_data();
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* k, const std::string& v) {
    auto* e = w->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  add("location", location);
  add("offset", std::to_string(offset));
  add("length", std::to_string(length));
  return m;
}

TEST_CASE("external data loads from the model's folder") {
  TempDir dir;
  std::string weights(48, '\0');
  for (int i = 0; i < 12; ++i) {
    float f = 0.5f * static_cast<float>(i);
    std::memcpy(weights.data() + 4 * i, &f, 4);
  }
  testing::write_bytes(dir.file("w.bin"), std::string(16, 'x') + weights);
  testing::write_model(external_model("w.bin", 16), dir.file("model.onnx"));
  ImportOptions options;
  options.batch = 2;
  auto model = import_model(dir.file("model.onnx"), options);
  auto w = model.graph.find_value("W");
  REQUIRE(w);
  const auto& data = model.graph.value(*w).initializer;
  REQUIRE(data->is_external());
  auto bytes = data->bytes();
  float f = 0;
  std::memcpy(&f, bytes.data() + 4 * 3, 4);
  CHECK(f == doctest::Approx(1.5f));
}

TEST_CASE("external data that escapes the folder, is missing or too short is refused") {
  TempDir dir;
  std::filesystem::create_directory(dir.path() / "m");
  testing::write_bytes(dir.file("outside.bin"), std::string(48, '\0'));
  testing::write_bytes(dir.file("m/short.bin"), std::string(20, '\0'));
  testing::write_bytes(dir.file("m/ok.bin"), std::string(48, '\0'));
  std::filesystem::create_symlink(dir.file("outside.bin"), dir.file("m/link.bin"));

  auto check = [&](const onnx::ModelProto& m, const std::string& needle) {
    testing::write_model(m, dir.file("m/model.onnx"));
    expect_refused(dir.file("m/model.onnx"), ErrorKind::kFormat, needle);
  };
  check(external_model("../outside.bin"), "'..' is refused");
  check(external_model(dir.file("outside.bin")), "absolute paths are refused");
  check(external_model("link.bin"), "is a symlink");
  check(external_model("missing.bin"), "does not exist");
  check(external_model("short.bin"), "lies past the end of the file (20 bytes)");
  check(external_model("ok.bin", 40, 48), "offset 40 + length 48 = 88 lies past the end");
  check(external_model("ok.bin", 0, 44), "length 44 does not match the 48 bytes");
  check(external_model("ok.bin", -1, 48), "offset -1 is negative");
}

TEST_CASE("unbound symbolic dims and bad bindings are named") {
  TempDir dir;
  testing::write_model(testing::relu_model(), dir.file("relu.onnx"));
  ImportOptions none;
  none.dims["unused"] = 1;
  try {
    import_model(dir.file("relu.onnx"), ImportOptions{});
    FAIL("import without --batch succeeded");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("input 'x' dim 0 ('batch') is symbolic; bind it with --dim batch=N") !=
          std::string::npos);
  }
  ImportOptions wrong;
  wrong.batch = 2;
  wrong.dims["seq"] = 5;
  expect_refused(dir.file("relu.onnx"), ErrorKind::kUsage, "--dim seq=5 names no unbound dim", wrong);

  ImportOptions by_name;
  by_name.dims["batch"] = 3;
  auto model = import_model(dir.file("relu.onnx"), by_name);
  CHECK(model.graph.value(model.graph.inputs[0]).shape == std::vector<int64_t>{3, 4});
  REQUIRE(model.bound_dims.size() == 1);
  CHECK(model.bound_dims[0].flag == "--dim");
}

TEST_CASE("--dim parsing refuses malformed values") {
  ImportOptions o;
  CHECK_THROWS_AS(parse_dim_binding("seq", o), Error);
  CHECK_THROWS_AS(parse_dim_binding("seq=", o), Error);
  CHECK_THROWS_AS(parse_dim_binding("seq=-3", o), Error);
  CHECK_THROWS_AS(parse_dim_binding("seq=12x", o), Error);
  parse_dim_binding("seq=12", o);
  CHECK(o.dims.at("seq") == 12);
}

}  // namespace
}  // namespace stagecraft
