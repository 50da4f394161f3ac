#include "tests/test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <stdexcept>

namespace stagecraft::testing {
namespace fs = std::filesystem;

TempDir::TempDir() {
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = fs::temp_directory_path() /
                     ("stagecraft-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    if (fs::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary folder");
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void add_tensor_info(onnx::ValueInfoProto* info, const std::string& name, int32_t elem_type,
                     const std::vector<int64_t>& dims, const std::vector<std::string>& names) {
  info->set_name(name);
  auto* tt = info->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem_type);
  auto* shape = tt->mutable_shape();
  for (std::size_t i = 0; i < dims.size(); ++i) {
    auto* d = shape->add_dim();
    if (dims[i] >= 0) {
      d->set_dim_value(dims[i]);
    } else if (i < names.size() && !names[i].empty()) {
      d->set_dim_param(names[i]);
    }
  }
}

onnx::NodeProto* add_node(onnx::GraphProto* graph, const std::string& op, const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs, const std::string& name) {
  auto* n = graph->add_node();
  n->set_op_type(op);
  n->set_name(name.empty() ? "/" + op + "_" + std::to_string(graph->node_size()) : name);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  return n;
}

onnx::TensorProto* add_float_initializer(onnx::GraphProto* graph, const std::string& name,
                                         const std::vector<int64_t>& dims) {
  auto* t = graph->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  int64_t n = 1;
  for (int64_t d : dims) {
    t->add_dims(d);
    n *= d;
  }
  for (int64_t i = 0; i < n; ++i) t->add_float_data(0.01f * static_cast<float>(i));
  return t;
}

onnx::TensorProto* add_int64_initializer(onnx::GraphProto* graph, const std::string& name,
                                         const std::vector<int64_t>& values, bool scalar) {
  auto* t = graph->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  if (!scalar) t->add_dims(static_cast<int64_t>(values.size()));
  for (int64_t v : values) t->add_int64_data(v);
  return t;
}

onnx::ModelProto relu_model(int64_t opset) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("stagecraft-tests");
  auto* imp = m.add_opset_import();
  imp->set_domain("");
  imp->set_version(opset);
  auto* g = m.mutable_graph();
  g->set_name("relu");
  add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {-1, 4}, {"batch"});
  add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {-1, 4}, {"batch"});
  add_node(g, "Relu", {"x"}, {"y"}, "/relu/Relu");
  return m;
}

onnx::ModelProto linear_model(int64_t in, int64_t out) {
  onnx::ModelProto m = relu_model();
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_output();
  add_float_initializer(g, "W", {in, out});
  add_float_initializer(g, "b", {out});
  g->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_value(in);
  add_node(g, "MatMul", {"x", "W"}, {"xw"}, "/fc/MatMul");
  add_node(g, "Add", {"xw", "b"}, {"y"}, "/fc/Add");
  add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {-1, out}, {"batch"});
  return m;
}

void write_model(const onnx::ModelProto& model, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!model.SerializeToOstream(&f)) throw std::runtime_error("cannot write " + path);
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string device_file(const TempDir& dir, int64_t memory_bytes, const DeviceRates& rates) {
  const std::string path = dir.file(rates.name + "_" + std::to_string(memory_bytes) + ".json");
  std::ofstream(path) << "{\"name\":\"" << rates.name << "\",\"peak_flops_fp32\":" << rates.flops_fp32
                      << ",\"peak_flops_fp16\":" << rates.flops_fp16
                      << ",\"memory_bandwidth\":" << rates.bandwidth
                      << ",\"memory_bytes\":" << memory_bytes
                      << ",\"launch_overhead_s\":" << rates.launch_s << ",\"efficiency\":0.5}";
  return path;
}

CommandResult run_captured(const TempDir& dir, const std::string& command_line) {
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  const std::string full = command_line + " >" + out + " 2>" + err;
  const int status = std::system(full.c_str());
  if (!WIFEXITED(status)) throw std::runtime_error("'" + command_line + "' did not exit normally");
  return {WEXITSTATUS(status), read_bytes(out), read_bytes(err)};
}

}  // namespace stagecraft::testing
