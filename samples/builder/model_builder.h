// A small builder for ONNX models, used to write the sample models and by tests that need
// a model built in code. It hides the protobuf boilerplate (value infos, opset, raw tensor
// bytes, external data) and keeps every generated model reproducible byte for byte.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_set>
#include <vector>

namespace stagecraft::samples {

/// One dimension of a graph input or output: a fixed size, or a symbolic name (an ONNX
/// dim_param such as "batch") that the user binds when compiling.
class Dim {
 public:
  /// A fixed size; must be non-negative.
  Dim(int64_t size);  // NOLINT(google-explicit-constructor): shapes read as {"batch", 10}.
  /// A symbolic size named `symbol`; must be a valid identifier.
  Dim(std::string symbol);  // NOLINT(google-explicit-constructor)
  /// A symbolic size (so that string literals convert without ambiguity).
  Dim(const char* symbol);  // NOLINT(google-explicit-constructor)

  /// True when the dimension is a dim_param rather than a number.
  bool is_symbolic() const { return !symbol_.empty(); }
  /// The fixed size; meaningless for a symbolic dimension.
  int64_t size() const { return size_; }
  /// The dim_param name; empty for a fixed dimension.
  const std::string& symbol() const { return symbol_; }

 private:
  int64_t size_ = 0;
  std::string symbol_;
};

/// The shape of a graph input or output.
using Shape = std::vector<Dim>;

/// Whether an initializer is a trainable parameter or a fixed buffer. Parameters are counted
/// by parameter_count() and are the tensors left as holes in a sparse dry-run data file;
/// buffers (masks, indices, normalisation statistics) are always written.
enum class InitializerRole { kParameter, kBuffer };

/// Where and how write() stores initializer bytes.
struct WriteOptions {
  /// Store initializers of at least `external_threshold_bytes` in one data file beside the
  /// model (ONNX external data) instead of inside the protobuf. int64 initializers always
  /// stay inline, because ONNX shape inference reads their values and cannot read external data.
  bool external_data = false;
  /// Smallest initializer, in bytes, that goes to the data file.
  int64_t external_threshold_bytes = 1024;
  /// Offset alignment of each tensor in the data file (so that it can be mapped page-wise).
  int64_t alignment = 4096;
  /// When false, parameter bytes are never generated: the data file gets its full size with
  /// ftruncate and the parameters' ranges stay holes (a sparse file). This lets a dry-run model
  /// of any size be written in seconds. Implies nothing about buffers, which are written.
  bool write_parameter_bytes = true;
  /// File name of the data file, relative to the model's directory; empty means
  /// "<model file name>.data".
  std::string data_file_name;
};

/// What write() produced.
struct WriteSummary {
  std::filesystem::path model_path;
  /// Empty when no initializer went to external data.
  std::filesystem::path data_path;
  int64_t model_bytes = 0;
  /// Logical size of the data file (a sparse file may occupy much less disk).
  int64_t data_bytes = 0;
  int64_t parameter_count = 0;
  int64_t node_count = 0;
};

/// Makes an INT attribute.
onnx::AttributeProto attr_int(const std::string& name, int64_t value);
/// Makes a FLOAT attribute.
onnx::AttributeProto attr_float(const std::string& name, float value);
/// Makes an INTS attribute.
onnx::AttributeProto attr_ints(const std::string& name, const std::vector<int64_t>& values);
/// Makes a STRING attribute.
onnx::AttributeProto attr_string(const std::string& name, const std::string& value);
/// Makes a TENSOR attribute (as used by Constant's `value`).
onnx::AttributeProto attr_tensor(const std::string& name, onnx::TensorProto value);

/// Makes an int64 tensor with the given dims (empty dims: a scalar) and raw little-endian data.
onnx::TensorProto make_int64_tensor(const std::vector<int64_t>& dims,
                                    const std::vector<int64_t>& values);
/// Makes a float tensor with the given dims (empty dims: a scalar) and raw little-endian data.
onnx::TensorProto make_float_tensor(const std::vector<int64_t>& dims,
                                    const std::vector<float>& values);

/// Builds one ONNX model (opset 17, IR version 8, producer "stagecraft-samples") node by node.
/// Names are checked as they are added: every tensor has one producer, every node input
/// exists when the node is added, and node names are unique. Random initializer values come
/// from a counter-based generator keyed by the builder's seed and the tensor's name, so a
/// tensor's values do not depend on what else is in the model or on the order of calls.
class ModelBuilder {
 public:
  /// Starts an empty model whose graph is called `graph_name`.
  explicit ModelBuilder(std::string graph_name, uint64_t seed = 0x5eed5a3b1e5ull);

  /// Adds a graph input of element type `elem_type` (onnx::TensorProto::FLOAT, INT64, ...).
  void add_input(const std::string& name, int32_t elem_type, const Shape& shape);
  /// Declares an already produced tensor as a graph output with the given type and shape.
  void add_output(const std::string& name, int32_t elem_type, const Shape& shape);

  /// Adds a trainable float parameter with values uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)),
  /// PyTorch's default for Linear and Conv weights and biases. Returns the name.
  std::string add_parameter(const std::string& name, std::vector<int64_t> dims, int64_t fan_in);
  /// Adds a trainable float parameter filled with `value` (norm scales 1, norm shifts 0).
  std::string add_parameter_filled(const std::string& name, std::vector<int64_t> dims, float value);
  /// Adds a float buffer filled with `value` (e.g. BatchNormalization running statistics).
  std::string add_buffer_filled(const std::string& name, std::vector<int64_t> dims, float value);
  /// Adds a float buffer with explicit values.
  std::string add_float_buffer(const std::string& name, std::vector<int64_t> dims,
                               const std::vector<float>& values);
  /// Adds an int64 buffer with explicit values (shape pieces, axes, indices).
  std::string add_int64_buffer(const std::string& name, std::vector<int64_t> dims,
                               const std::vector<int64_t>& values);
  /// Adds a bool buffer with explicit values (masks); values are 0 or 1.
  std::string add_bool_buffer(const std::string& name, std::vector<int64_t> dims,
                              const std::vector<uint8_t>& values);

  /// Adds a node with explicit output names; returns the output names.
  std::vector<std::string> add_node(const std::string& op_type, const std::string& node_name,
                                    const std::vector<std::string>& inputs,
                                    const std::vector<std::string>& outputs,
                                    std::vector<onnx::AttributeProto> attributes = {});
  /// Adds a single-output node whose output is named "<node_name>_output_0", as the PyTorch
  /// exporter names them; returns the output name.
  std::string add_op(const std::string& op_type, const std::string& node_name,
                     const std::vector<std::string>& inputs,
                     std::vector<onnx::AttributeProto> attributes = {});
  /// Adds a Constant node holding `value`; returns its output name.
  std::string add_constant(const std::string& node_name, onnx::TensorProto value);

  /// Number of elements in all parameters (buffers and Constant nodes excluded).
  int64_t parameter_count() const;
  /// Number of nodes added so far.
  int64_t node_count() const { return static_cast<int64_t>(graph_.node_size()); }

  /// Returns the model with every initializer's bytes inline. Meant for small models built in
  /// tests; large models should be written with write() and external data.
  onnx::ModelProto to_model() const;
  /// Writes the model to `model_path` (and a data file beside it when options say so), with
  /// deterministic serialisation. Throws std::runtime_error on I/O errors or when the model
  /// would exceed protobuf's 2 GiB limit.
  WriteSummary write(const std::filesystem::path& model_path,
                     const WriteOptions& options = {}) const;

 private:
  /// How an initializer's contents are produced when it is written.
  enum class Fill { kUniform, kConstant, kExplicit };

  /// An initializer whose bytes are generated only when written.
  struct Initializer {
    std::string name;
    int32_t elem_type = onnx::TensorProto::FLOAT;
    std::vector<int64_t> dims;
    InitializerRole role = InitializerRole::kParameter;
    Fill fill = Fill::kConstant;
    /// Bound of the uniform range, or the constant value.
    float scalar = 0.0f;
    /// Little-endian bytes for Fill::kExplicit.
    std::string bytes;
  };

  std::string add_initializer(Initializer initializer);
  void claim_tensor_name(const std::string& name);
  onnx::ModelProto skeleton() const;
  static int64_t element_count(const Initializer& initializer);
  static int64_t byte_size(const Initializer& initializer);
  /// Writes `count` bytes of the initializer starting at byte `begin` into `out`.
  void generate_bytes(const Initializer& initializer, int64_t begin, int64_t count,
                      char* out) const;
  std::string all_bytes(const Initializer& initializer) const;

  uint64_t seed_;
  onnx::GraphProto graph_;
  std::vector<Initializer> initializers_;
  std::unordered_set<std::string> tensor_names_;
  std::unordered_set<std::string> node_names_;
};

}  // namespace stagecraft::samples
