// Writes the fuzz targets' generated seeds under OUT: the hostile inputs of issue 17 that are
// built in code (models), and for the plan and checkpoint targets each file of a template plan
// and checkpoint with its selector byte, plus the hostile edits of issue 17 (an arena offset
// whose end wraps, a manifest naming a file outside its folder, ...).
//
//   stagecraft-fuzz-seeds OUT [PLAN_DIR CHECKPOINT_DIR]
//
// Every input here once crashed, hung or escaped a reader (issue 17); the replay tests run
// them on every build, so none can come back.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using stagecraft::testing::add_int64_initializer;
using stagecraft::testing::add_node;
using stagecraft::testing::add_tensor_info;

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

void set_ints(onnx::NodeProto* node, const std::string& name, const std::vector<int64_t>& values) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

void set_int(onnx::NodeProto* node, const std::string& name, int64_t value) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

onnx::ModelProto empty_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(17);
  return m;
}

// x float[N,C,8,8] -> OP(attrs) -> y; W [C*?] for Conv.
onnx::ModelProto windowed(const std::string& op, int64_t channels, int64_t out_channels,
                          int64_t group, const std::vector<int64_t>& strides) {
  auto m = empty_model();
  auto* g = m.mutable_graph();
  g->set_name(op);
  add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, channels, 8, 8});
  std::vector<std::string> inputs{"x"};
  if (op == "Conv") {
    stagecraft::testing::add_float_initializer(g, "w", {out_channels, channels / group, 3, 3});
    inputs.push_back("w");
  }
  auto* node = add_node(g, op, inputs, {"y"}, op + "_node");
  set_ints(node, "kernel_shape", {3, 3});
  set_ints(node, "strides", strides);
  if (op == "Conv") set_int(node, "group", group);
  add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  return m;
}

// A model whose output is OP(a, b) of two int64 constants, added to a float input's shape so
// the graph has an input: the folder must compute OP on the host.
onnx::ModelProto folded_binary(const std::string& op, int64_t a, int64_t b) {
  auto m = empty_model();
  auto* g = m.mutable_graph();
  g->set_name("fold_" + op);
  add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 4});
  add_int64_initializer(g, "a", {a});
  add_int64_initializer(g, "b", {b});
  add_node(g, op, {"a", "b"}, {"c"}, op + "_node");
  add_node(g, "Reshape", {"x", "c"}, {"y"}, "reshape");
  add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  return m;
}

// ConstantOfShape of a huge shape folded on the host (issue 17, finding 6).
onnx::ModelProto huge_constant_of_shape() {
  auto m = empty_model();
  auto* g = m.mutable_graph();
  g->set_name("huge_constant_of_shape");
  add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 4});
  add_int64_initializer(g, "shape", {1 << 20, 1 << 20});
  add_node(g, "ConstantOfShape", {"shape"}, {"big"}, "constant_of_shape");
  add_node(g, "Shape", {"big"}, {"s"}, "shape_of_big");
  add_node(g, "Add", {"x", "x"}, {"y"}, "add");
  add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  add_tensor_info(g->add_output(), "s", onnx::TensorProto::INT64, {});
  return m;
}

// Slice of a shape tensor with a step of INT64_MIN (issue 17, finding 5).
onnx::ModelProto slice_min_step() {
  auto m = empty_model();
  auto* g = m.mutable_graph();
  g->set_name("slice_min_step");
  add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 4});
  add_node(g, "Shape", {"x"}, {"s"}, "shape");
  add_int64_initializer(g, "starts", {-1});
  add_int64_initializer(g, "ends", {kMin});
  add_int64_initializer(g, "axes", {0});
  add_int64_initializer(g, "steps", {kMin});
  add_node(g, "Slice", {"s", "starts", "ends", "axes", "steps"}, {"t"}, "slice");
  add_node(g, "Reshape", {"x", "t"}, {"y"}, "reshape");
  add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  return m;
}

// A model without graph inputs (issue 17, finding 8).
onnx::ModelProto no_inputs() {
  auto m = empty_model();
  auto* g = m.mutable_graph();
  g->set_name("no_inputs");
  stagecraft::testing::add_float_initializer(g, "w", {2, 2});
  add_node(g, "Relu", {"w"}, {"y"}, "relu");
  add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  return m;
}

// Gather with a constant index outside the data (issue 17, finding 9).
onnx::ModelProto gather_out_of_range() {
  auto m = empty_model();
  auto* g = m.mutable_graph();
  g->set_name("gather_out_of_range");
  add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 4});
  add_int64_initializer(g, "i", {7});
  auto* node = add_node(g, "Gather", {"x", "i"}, {"y"}, "gather");
  set_int(node, "axis", 1);
  add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  return m;
}

// Softmax over an axis the input does not have (issue 17, finding 9).
onnx::ModelProto softmax_bad_axis() {
  auto m = empty_model();
  auto* g = m.mutable_graph();
  g->set_name("softmax_bad_axis");
  add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 4});
  auto* node = add_node(g, "Softmax", {"x"}, {"y"}, "softmax");
  set_int(node, "axis", 5);
  add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  return m;
}

// A node whose shapes ONNX's inference refuses, named with 100,000 characters: the error line
// quoting the name was parsed with std::regex, which recursed once per character.
onnx::ModelProto long_name_shape_error() {
  auto m = empty_model();
  auto* g = m.mutable_graph();
  g->set_name("long_name_shape_error");
  add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 4});
  stagecraft::testing::add_float_initializer(g, "w", {5, 3});
  add_node(g, "MatMul", {"x", "w"}, {"y"}, std::string(100000, 'n'));
  add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  return m;
}

void write(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) {
    std::fprintf(stderr, "stagecraft-fuzz-seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

void write_model(const fs::path& dir, const std::string& name, const onnx::ModelProto& m) {
  write(dir / (name + ".onnx"), m.SerializeAsString());
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// An .npy file: magic, version 1.0, the header padded to 64 bytes, then `data`.
std::string npy(const std::string& header_dict, const std::string& data) {
  std::string header = header_dict;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  return out + header + data;
}

// Finding 4: .npy headers that overflowed the stack (std::regex), allocated 2 GiB before
// finding the file short, or overflowed numel * size. The first byte selects the .npy reader
// ('0' is even); '1' selects the TensorProto reader.
void tensor_seeds(const fs::path& out) {
  const fs::path dir = out / "tensor_file";
  const std::string four_floats(16, '\0');
  write(dir / "npy_valid",
        "0" + npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", four_floats));
  write(dir / "npy_long_descr",
        "0" + npy("{'descr': '" + std::string(30000, 'f') + "', 'fortran_order': False, "
                  "'shape': (2, 2), }", four_floats));
  write(dir / "npy_claims_2gib",
        "0" + npy("{'descr': '<f4', 'fortran_order': False, 'shape': (536870912,), }",
                  four_floats));
  write(dir / "npy_numel_overflows",
        "0" + npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1152921504606846976,), }",
                  four_floats));
  write(dir / "npy_nested_parens",
        "0" + npy("{'descr': '<f4', 'fortran_order': False, 'shape': " + std::string(20000, '(') +
                  ", }", four_floats));
  onnx::TensorProto t;
  t.set_name("t");
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_dims(2);
  t.add_dims(2);
  for (int i = 0; i < 4; ++i) t.add_float_data(static_cast<float>(i));
  write(dir / "pb_valid", "1" + t.SerializeAsString());
  t.clear_dims();
  t.add_dims(int64_t{1} << 60);
  t.add_dims(16);
  write(dir / "pb_numel_overflows", "1" + t.SerializeAsString());
}

// Token streams (stagerun --tokens): the first byte picks --token-dtype and the vocabulary
// checked (tests/fuzz/token_stream.cpp); hostile headers claim more tokens than the file holds.
void token_seeds(const fs::path& out) {
  const fs::path dir = out / "token_stream";
  auto llmc = [](int32_t magic, int32_t version, int32_t count, const std::string& tokens) {
    std::string header(1024, '\0');
    for (int i = 0; i < 4; ++i) {
      header[i] = static_cast<char>((magic >> (8 * i)) & 0xff);
      header[4 + i] = static_cast<char>((version >> (8 * i)) & 0xff);
      header[8 + i] = static_cast<char>((count >> (8 * i)) & 0xff);
    }
    return header + tokens;
  };
  const std::string eight_tokens(16, '\x01');
  write(dir / "llmc_valid", "0" + llmc(20240520, 1, 8, eight_tokens));
  write(dir / "llmc_claims_2g_tokens", "0" + llmc(20240520, 1, 2147483647, eight_tokens));
  write(dir / "llmc_version_2", "0" + llmc(20240520, 2, 8, eight_tokens));
  write(dir / "npy_claims_2gib",
        "0" + npy("{'descr': '<u2', 'fortran_order': False, 'shape': (1073741824,), }",
                  eight_tokens));
  write(dir / "raw_odd", "1" + std::string(7, '\x02'));
}

// JSON nested deeper than any stack: a recursive parser or destructor overflows on them. The
// first byte picks the specs target's reader ('0' profile database, '1' device spec).
void spec_seeds(const fs::path& out) {
  const fs::path dir = out / "specs";
  const int depth = 200000;
  write(dir / "json_array_depth_bomb", "0" + std::string(depth, '[') + std::string(depth, ']'));
  std::string object;
  for (int i = 0; i < depth / 2; ++i) object += "{\"a\":";
  object += "1" + std::string(depth / 2, '}');
  write(dir / "json_object_depth_bomb", "1" + object);
}

void model_seeds(const fs::path& out) {
  const fs::path dir = out / "model_import";
  write_model(dir, "conv_stride_zero", windowed("Conv", 4, 4, 1, {0, 0}));
  write_model(dir, "maxpool_stride_zero", windowed("MaxPool", 4, 4, 1, {0, 0}));
  write_model(dir, "conv_group_not_dividing", windowed("Conv", 4, 6, 4, {1, 1}));
  write_model(dir, "div_min_by_minus_one", folded_binary("Div", kMin, -1));
  write_model(dir, "add_overflow", folded_binary("Add", kMax, 1));
  write_model(dir, "mul_overflow", folded_binary("Mul", kMax, 2));
  write_model(dir, "huge_constant_of_shape", huge_constant_of_shape());
  write_model(dir, "slice_min_step", slice_min_step());
  write_model(dir, "no_inputs", no_inputs());
  write_model(dir, "gather_out_of_range", gather_out_of_range());
  write_model(dir, "softmax_bad_axis", softmax_bad_axis());
  write_model(dir, "long_name_shape_error", long_name_shape_error());
}

// The template's files with the selector byte the target reads (index into `names`).
void file_seeds(const fs::path& dir, const fs::path& from, const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i) {
    std::string name = names[i];
    std::replace(name.begin(), name.end(), '/', '_');
    write(dir / ("template_" + name), std::string(1, static_cast<char>(i)) + read(from / names[i]));
  }
}

std::vector<std::string> files_with(const fs::path& dir, const std::string& ext,
                                    std::vector<std::string> first) {
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.path().extension() == ext) found.push_back(fs::relative(entry.path(), dir).string());
  std::sort(found.begin(), found.end());
  first.insert(first.end(), found.begin(), found.end());
  return first;
}

void plan_seeds(const fs::path& out, const fs::path& plan) {
  const fs::path dir = out / "plan";
  file_seeds(dir, plan, files_with(plan, ".onnx", {"plan.json", "schedule.json"}));
  nlohmann::json json = nlohmann::json::parse(read(plan / "plan.json"));
  const std::string zero(1, '\0');
  // Finding 1: an arena tensor whose end wraps past 2^63.
  for (auto& stage : json["stages"]) {
    if (!stage.contains("arena") || !stage["arena"].contains("tensors")) continue;
    for (auto& t : stage["arena"]["tensors"]) t["offset"] = kMax - 63;
    break;
  }
  write(dir / "arena_offset_wraps", zero + json.dump());
  json = nlohmann::json::parse(read(plan / "plan.json"));
  json["microbatches"] = kMax;
  write(dir / "microbatches_max", zero + json.dump());
}

void checkpoint_seeds(const fs::path& out, const fs::path& checkpoint) {
  const fs::path dir = out / "checkpoint";
  file_seeds(dir, checkpoint, files_with(checkpoint, ".npy", {"manifest.json"}));
  const std::string zero(1, '\0');
  const nlohmann::json manifest = nlohmann::json::parse(read(checkpoint / "manifest.json"));
  // Finding 3: files outside the folder, lists left out, a step past 2^53.
  auto edit_files = [&](const std::string& file) {
    nlohmann::json m = manifest;
    for (auto& stage : m["stages"])
      for (auto& w : stage["weights"]) w["file"] = file;
    return m;
  };
  write(dir / "file_absolute", zero + edit_files("/etc/passwd").dump());
  write(dir / "file_dotdot", zero + edit_files("../../manifest.json").dump());
  nlohmann::json m = manifest;
  for (auto& stage : m["stages"]) stage["weights"] = nlohmann::json::array();
  write(dir / "weights_left_out", zero + m.dump());
  m = manifest;
  m["step"] = kMax;
  write(dir / "step_max", zero + m.dump());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    std::fprintf(stderr, "usage: %s OUT [PLAN_DIR CHECKPOINT_DIR]\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  model_seeds(out);
  tensor_seeds(out);
  token_seeds(out);
  spec_seeds(out);
  if (argc == 4) {
    plan_seeds(out, argv[2]);
    checkpoint_seeds(out, argv[3]);
  }
  return 0;
}
