#pragma once
/// \file
/// Helpers for tests: temporary folders and tiny ONNX models built in code.

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace stagecraft::testing {

/// A fresh folder under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// Adds a float tensor input/output declaration; a dim < 0 becomes the symbolic `names[i]`.
void add_tensor_info(onnx::ValueInfoProto* info, const std::string& name, int32_t elem_type,
                     const std::vector<int64_t>& dims, const std::vector<std::string>& names = {});

/// Adds a node to `graph`.
onnx::NodeProto* add_node(onnx::GraphProto* graph, const std::string& op, const std::vector<std::string>& inputs,
                          const std::vector<std::string>& outputs, const std::string& name = "");

/// Adds a float initializer filled with 0.01 * index.
onnx::TensorProto* add_float_initializer(onnx::GraphProto* graph, const std::string& name,
                                         const std::vector<int64_t>& dims);

/// Adds an int64 initializer holding `values` as a 1-D tensor (or a scalar when `scalar`).
onnx::TensorProto* add_int64_initializer(onnx::GraphProto* graph, const std::string& name,
                                         const std::vector<int64_t>& values, bool scalar = false);

/// A model at `opset`: x float[batch,4] -> Relu -> y, with the batch dim symbolic ("batch").
onnx::ModelProto relu_model(int64_t opset = 17);

/// A linear layer y = x W + b with x [batch, in], W [in, out]: MatMul + Add.
onnx::ModelProto linear_model(int64_t in = 4, int64_t out = 3);

/// Writes `model` to `path` in protobuf binary form.
void write_model(const onnx::ModelProto& model, const std::string& path);

/// Writes raw bytes to `path`.
void write_bytes(const std::string& path, const std::string& bytes);

/// The whole file at `path` ("" when it cannot be read).
std::string read_bytes(const std::string& path);

/// The rates of a device spec file (cost_models/device_spec.h's JSON) a test writes: a small
/// device unless told.
struct DeviceRates {
  std::string name = "small";
  double flops_fp32 = 100e9, flops_fp16 = 100e9, bandwidth = 20e9, launch_s = 2e-6;
};

/// Writes a device spec with `memory_bytes` of memory and `rates` (efficiency 0.5) into `dir`
/// (a file per name and size) and returns its path.
std::string device_file(const TempDir& dir, int64_t memory_bytes, const DeviceRates& rates = {});

/// What a command run through the shell did: its exit code, stdout and stderr.
struct CommandResult {
  int code = 0;
  std::string out, err;
};

/// Runs `command_line` (shell-quoted) with stdout and stderr captured in files of `dir`; throws
/// std::runtime_error when it did not exit normally (a signal).
CommandResult run_captured(const TempDir& dir, const std::string& command_line);

}  // namespace stagecraft::testing
