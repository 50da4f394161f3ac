#include "samples/builder/model_builder.h"

#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <utility>

namespace stagecraft::samples {

static_assert(std::endian::native == std::endian::little,
              "ONNX raw_data is little-endian; the builder copies host bytes as they are");

namespace {

constexpr int64_t kIrVersion = 8;
constexpr int64_t kOpsetVersion = 17;
constexpr const char* kProducerName = "stagecraft-samples";
constexpr const char* kProducerVersion = "0.1.0";
/// Bytes generated per write call when streaming an initializer into the data file.
constexpr int64_t kChunkBytes = int64_t{1} << 20;
/// Protobuf refuses to parse messages of 2 GiB or more.
constexpr int64_t kProtobufLimitBytes = std::numeric_limits<int32_t>::max();

bool is_identifier(const std::string& text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  for (char c : text) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

/// SplitMix64's finaliser: a bijective mix of 64 bits with good avalanche.
uint64_t mix64(uint64_t value) {
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ull;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebull;
  return value ^ (value >> 31);
}

/// FNV-1a over the name, so that each tensor gets its own random stream.
uint64_t hash_name(const std::string& name) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : name) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  return hash;
}

int64_t element_bytes(int32_t elem_type) {
  switch (elem_type) {
    case onnx::TensorProto::FLOAT:
      return 4;
    case onnx::TensorProto::INT64:
      return 8;
    case onnx::TensorProto::BOOL:
      return 1;
    default:
      throw std::invalid_argument("model builder: unsupported initializer element type " +
                                  std::to_string(elem_type));
  }
}

int64_t product(const std::vector<int64_t>& dims) {
  int64_t count = 1;
  for (int64_t dim : dims) {
    if (dim < 0) throw std::invalid_argument("model builder: negative tensor dimension");
    count *= dim;
  }
  return count;
}

template <typename T>
std::string to_bytes(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

template <typename T>
onnx::TensorProto make_tensor(int32_t elem_type, const std::vector<int64_t>& dims,
                              const std::vector<T>& values) {
  if (product(dims) != static_cast<int64_t>(values.size())) {
    throw std::invalid_argument("model builder: tensor value count does not match its dims");
  }
  onnx::TensorProto tensor;
  tensor.set_data_type(elem_type);
  for (int64_t dim : dims) tensor.add_dims(dim);
  tensor.set_raw_data(to_bytes(values));
  return tensor;
}

void set_shape(onnx::ValueInfoProto* info, int32_t elem_type, const Shape& shape) {
  auto* tensor_type = info->mutable_type()->mutable_tensor_type();
  tensor_type->set_elem_type(elem_type);
  auto* proto_shape = tensor_type->mutable_shape();
  for (const Dim& dim : shape) {
    auto* proto_dim = proto_shape->add_dim();
    if (dim.is_symbolic()) {
      proto_dim->set_dim_param(dim.symbol());
    } else {
      proto_dim->set_dim_value(dim.size());
    }
  }
}

std::string serialize_deterministically(const onnx::ModelProto& model) {
  std::string buffer;
  {
    google::protobuf::io::StringOutputStream stream(&buffer);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    if (!model.SerializeToCodedStream(&coded)) {
      throw std::runtime_error("model builder: protobuf serialisation failed");
    }
  }
  return buffer;
}

void write_whole_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void pwrite_all(int fd, const char* data, int64_t count, int64_t offset,
                const std::filesystem::path& path) {
  while (count > 0) {
    ssize_t written = ::pwrite(fd, data, static_cast<size_t>(count), offset);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      throw std::runtime_error("cannot write " + path.string() + ": " + std::strerror(errno));
    }
    data += written;
    count -= written;
    offset += written;
  }
}

/// Closes a file descriptor when it goes out of scope.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  /// Closes now so that errors reported by close() are not lost.
  int close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

}  // namespace

Dim::Dim(int64_t size) : size_(size) {
  if (size < 0) throw std::invalid_argument("model builder: negative dimension");
}

Dim::Dim(std::string symbol) : symbol_(std::move(symbol)) {
  if (!is_identifier(symbol_)) {
    throw std::invalid_argument("model builder: symbolic dimension '" + symbol_ +
                                "' is not an identifier");
  }
}

Dim::Dim(const char* symbol) : Dim(std::string(symbol)) {}

onnx::AttributeProto attr_int(const std::string& name, int64_t value) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::INT);
  attribute.set_i(value);
  return attribute;
}

onnx::AttributeProto attr_float(const std::string& name, float value) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::FLOAT);
  attribute.set_f(value);
  return attribute;
}

onnx::AttributeProto attr_ints(const std::string& name, const std::vector<int64_t>& values) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::INTS);
  for (int64_t value : values) attribute.add_ints(value);
  return attribute;
}

onnx::AttributeProto attr_string(const std::string& name, const std::string& value) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::STRING);
  attribute.set_s(value);
  return attribute;
}

onnx::AttributeProto attr_tensor(const std::string& name, onnx::TensorProto value) {
  onnx::AttributeProto attribute;
  attribute.set_name(name);
  attribute.set_type(onnx::AttributeProto::TENSOR);
  *attribute.mutable_t() = std::move(value);
  return attribute;
}

onnx::TensorProto make_int64_tensor(const std::vector<int64_t>& dims,
                                    const std::vector<int64_t>& values) {
  return make_tensor(onnx::TensorProto::INT64, dims, values);
}

onnx::TensorProto make_float_tensor(const std::vector<int64_t>& dims,
                                    const std::vector<float>& values) {
  return make_tensor(onnx::TensorProto::FLOAT, dims, values);
}

ModelBuilder::ModelBuilder(std::string graph_name, uint64_t seed) : seed_(seed) {
  if (graph_name.empty()) throw std::invalid_argument("model builder: empty graph name");
  graph_.set_name(std::move(graph_name));
}

void ModelBuilder::claim_tensor_name(const std::string& name) {
  if (name.empty()) throw std::invalid_argument("model builder: empty tensor name");
  if (!tensor_names_.insert(name).second) {
    throw std::invalid_argument("model builder: tensor '" + name + "' is defined twice");
  }
}

void ModelBuilder::add_input(const std::string& name, int32_t elem_type, const Shape& shape) {
  claim_tensor_name(name);
  set_shape(graph_.add_input(), elem_type, shape);
  graph_.mutable_input(graph_.input_size() - 1)->set_name(name);
}

void ModelBuilder::add_output(const std::string& name, int32_t elem_type, const Shape& shape) {
  if (!tensor_names_.contains(name)) {
    throw std::invalid_argument("model builder: output '" + name + "' is not produced");
  }
  for (const auto& output : graph_.output()) {
    if (output.name() == name) {
      throw std::invalid_argument("model builder: output '" + name + "' declared twice");
    }
  }
  auto* info = graph_.add_output();
  info->set_name(name);
  set_shape(info, elem_type, shape);
}

std::string ModelBuilder::add_initializer(Initializer initializer) {
  claim_tensor_name(initializer.name);
  element_bytes(initializer.elem_type);
  if (initializer.fill == Fill::kExplicit &&
      static_cast<int64_t>(initializer.bytes.size()) != byte_size(initializer)) {
    throw std::invalid_argument("model builder: initializer '" + initializer.name +
                                "' has the wrong number of values for its dims");
  }
  initializers_.push_back(std::move(initializer));
  return initializers_.back().name;
}

std::string ModelBuilder::add_parameter(const std::string& name, std::vector<int64_t> dims,
                                        int64_t fan_in) {
  if (fan_in <= 0) throw std::invalid_argument("model builder: fan_in must be positive");
  return add_initializer(
      {.name = name,
       .elem_type = onnx::TensorProto::FLOAT,
       .dims = std::move(dims),
       .role = InitializerRole::kParameter,
       .fill = Fill::kUniform,
       .scalar = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in))),
       .bytes = {}});
}

std::string ModelBuilder::add_parameter_filled(const std::string& name, std::vector<int64_t> dims,
                                               float value) {
  return add_initializer({.name = name,
                          .elem_type = onnx::TensorProto::FLOAT,
                          .dims = std::move(dims),
                          .role = InitializerRole::kParameter,
                          .fill = Fill::kConstant,
                          .scalar = value,
                          .bytes = {}});
}

std::string ModelBuilder::add_buffer_filled(const std::string& name, std::vector<int64_t> dims,
                                            float value) {
  return add_initializer({.name = name,
                          .elem_type = onnx::TensorProto::FLOAT,
                          .dims = std::move(dims),
                          .role = InitializerRole::kBuffer,
                          .fill = Fill::kConstant,
                          .scalar = value,
                          .bytes = {}});
}

std::string ModelBuilder::add_float_buffer(const std::string& name, std::vector<int64_t> dims,
                                           const std::vector<float>& values) {
  return add_initializer({.name = name,
                          .elem_type = onnx::TensorProto::FLOAT,
                          .dims = std::move(dims),
                          .role = InitializerRole::kBuffer,
                          .fill = Fill::kExplicit,
                          .scalar = 0.0f,
                          .bytes = to_bytes(values)});
}

std::string ModelBuilder::add_int64_buffer(const std::string& name, std::vector<int64_t> dims,
                                           const std::vector<int64_t>& values) {
  return add_initializer({.name = name,
                          .elem_type = onnx::TensorProto::INT64,
                          .dims = std::move(dims),
                          .role = InitializerRole::kBuffer,
                          .fill = Fill::kExplicit,
                          .scalar = 0.0f,
                          .bytes = to_bytes(values)});
}

std::string ModelBuilder::add_bool_buffer(const std::string& name, std::vector<int64_t> dims,
                                          const std::vector<uint8_t>& values) {
  for (uint8_t value : values) {
    if (value > 1) throw std::invalid_argument("model builder: bool values must be 0 or 1");
  }
  return add_initializer({.name = name,
                          .elem_type = onnx::TensorProto::BOOL,
                          .dims = std::move(dims),
                          .role = InitializerRole::kBuffer,
                          .fill = Fill::kExplicit,
                          .scalar = 0.0f,
                          .bytes = to_bytes(values)});
}

std::vector<std::string> ModelBuilder::add_node(const std::string& op_type,
                                                const std::string& node_name,
                                                const std::vector<std::string>& inputs,
                                                const std::vector<std::string>& outputs,
                                                std::vector<onnx::AttributeProto> attributes) {
  if (op_type.empty()) throw std::invalid_argument("model builder: empty op type");
  if (node_name.empty()) throw std::invalid_argument("model builder: empty node name");
  if (node_names_.contains(node_name)) {
    throw std::invalid_argument("model builder: node '" + node_name + "' is defined twice");
  }
  for (const std::string& input : inputs) {
    // An empty name is ONNX's way of leaving an optional input out.
    if (!input.empty() && !tensor_names_.contains(input)) {
      throw std::invalid_argument("model builder: node '" + node_name + "' reads '" + input +
                                  "', which nothing produces");
    }
  }
  for (const std::string& output : outputs) claim_tensor_name(output);
  node_names_.insert(node_name);

  onnx::NodeProto* node = graph_.add_node();
  node->set_op_type(op_type);
  node->set_name(node_name);
  for (const std::string& input : inputs) node->add_input(input);
  for (const std::string& output : outputs) node->add_output(output);
  for (auto& attribute : attributes) *node->add_attribute() = std::move(attribute);
  return outputs;
}

std::string ModelBuilder::add_op(const std::string& op_type, const std::string& node_name,
                                 const std::vector<std::string>& inputs,
                                 std::vector<onnx::AttributeProto> attributes) {
  return add_node(op_type, node_name, inputs, {node_name + "_output_0"}, std::move(attributes))
      .front();
}

std::string ModelBuilder::add_constant(const std::string& node_name, onnx::TensorProto value) {
  std::vector<onnx::AttributeProto> attributes;
  attributes.push_back(attr_tensor("value", std::move(value)));
  return add_op("Constant", node_name, {}, std::move(attributes));
}

int64_t ModelBuilder::element_count(const Initializer& initializer) {
  return product(initializer.dims);
}

int64_t ModelBuilder::byte_size(const Initializer& initializer) {
  return element_count(initializer) * element_bytes(initializer.elem_type);
}

int64_t ModelBuilder::parameter_count() const {
  int64_t count = 0;
  for (const Initializer& initializer : initializers_) {
    if (initializer.role == InitializerRole::kParameter) count += element_count(initializer);
  }
  return count;
}

void ModelBuilder::generate_bytes(const Initializer& initializer, int64_t begin, int64_t count,
                                  char* out) const {
  if (initializer.fill == Fill::kExplicit) {
    std::memcpy(out, initializer.bytes.data() + begin, static_cast<size_t>(count));
    return;
  }
  // Uniform and constant fills are float tensors; callers ask for whole elements.
  const int64_t first = begin / 4;
  const int64_t elements = count / 4;
  const uint64_t key = mix64(seed_ ^ hash_name(initializer.name));
  for (int64_t index = 0; index < elements; ++index) {
    float value = initializer.scalar;
    if (initializer.fill == Fill::kUniform) {
      // Counter-based: element i's value depends only on (seed, name, i), so any chunk of
      // the tensor can be generated on its own. 24 random bits give an exact float in [0, 2).
      const uint64_t bits =
          mix64(key + static_cast<uint64_t>(first + index + 1) * 0x9e3779b97f4a7c15ull);
      const float unit = static_cast<float>(bits >> 40) * 0x1p-23f - 1.0f;
      value = unit * initializer.scalar;
    }
    std::memcpy(out + index * 4, &value, 4);
  }
}

std::string ModelBuilder::all_bytes(const Initializer& initializer) const {
  std::string bytes(static_cast<size_t>(byte_size(initializer)), '\0');
  generate_bytes(initializer, 0, static_cast<int64_t>(bytes.size()), bytes.data());
  return bytes;
}

onnx::ModelProto ModelBuilder::skeleton() const {
  onnx::ModelProto model;
  model.set_ir_version(kIrVersion);
  model.set_producer_name(kProducerName);
  model.set_producer_version(kProducerVersion);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpsetVersion);
  *model.mutable_graph() = graph_;
  return model;
}

onnx::ModelProto ModelBuilder::to_model() const {
  onnx::ModelProto model = skeleton();
  for (const Initializer& initializer : initializers_) {
    onnx::TensorProto* tensor = model.mutable_graph()->add_initializer();
    tensor->set_name(initializer.name);
    tensor->set_data_type(initializer.elem_type);
    for (int64_t dim : initializer.dims) tensor->add_dims(dim);
    tensor->set_raw_data(all_bytes(initializer));
  }
  return model;
}

WriteSummary ModelBuilder::write(const std::filesystem::path& model_path,
                                 const WriteOptions& options) const {
  if (options.alignment <= 0 || options.external_threshold_bytes < 0) {
    throw std::invalid_argument("model builder: alignment must be positive");
  }
  WriteSummary summary;
  summary.model_path = model_path;
  summary.parameter_count = parameter_count();
  summary.node_count = node_count();
  const std::string data_name = options.data_file_name.empty()
                                    ? model_path.filename().string() + ".data"
                                    : options.data_file_name;

  // Decide where each initializer goes before generating any bytes, so that an oversized
  // inline model is refused without first building it in memory.
  onnx::ModelProto model = skeleton();
  std::vector<std::pair<const Initializer*, int64_t>> external;  // initializer, offset
  int64_t data_end = 0;
  int64_t inline_bytes = static_cast<int64_t>(model.ByteSizeLong());
  for (const Initializer& initializer : initializers_) {
    const int64_t bytes = byte_size(initializer);
    // int64 tensors (shape pieces, axes, indices) stay inline: ONNX shape inference reads
    // their values and cannot read external data.
    if (options.external_data && bytes >= options.external_threshold_bytes &&
        initializer.elem_type != onnx::TensorProto::INT64) {
      const int64_t offset =
          (data_end + options.alignment - 1) / options.alignment * options.alignment;
      external.emplace_back(&initializer, offset);
      data_end = offset + bytes;
    } else {
      inline_bytes += bytes;
    }
  }
  if (inline_bytes >= kProtobufLimitBytes) {
    throw std::runtime_error(
        "model " + model_path.string() + " would hold " + std::to_string(inline_bytes >> 20) +
        " MiB inline; protobuf files must stay under 2 GiB: use external data");
  }

  size_t next_external = 0;
  for (const Initializer& initializer : initializers_) {
    onnx::TensorProto* tensor = model.mutable_graph()->add_initializer();
    tensor->set_name(initializer.name);
    tensor->set_data_type(initializer.elem_type);
    for (int64_t dim : initializer.dims) tensor->add_dims(dim);
    if (next_external < external.size() && external[next_external].first == &initializer) {
      const int64_t offset = external[next_external++].second;
      tensor->set_data_location(onnx::TensorProto::EXTERNAL);
      const std::pair<const char*, std::string> entries[] = {
          {"location", data_name},
          {"offset", std::to_string(offset)},
          {"length", std::to_string(byte_size(initializer))}};
      for (const auto& [key, value] : entries) {
        auto* entry = tensor->add_external_data();
        entry->set_key(key);
        entry->set_value(value);
      }
    } else {
      tensor->set_raw_data(all_bytes(initializer));
    }
  }

  if (model_path.has_parent_path()) std::filesystem::create_directories(model_path.parent_path());
  const std::string serialized = serialize_deterministically(model);
  write_whole_file(model_path, serialized);
  summary.model_bytes = static_cast<int64_t>(serialized.size());
  if (external.empty()) return summary;

  summary.data_path = model_path.parent_path() / data_name;
  summary.data_bytes = data_end;
  FileDescriptor data_file(::open(summary.data_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  if (data_file.get() < 0 || ::ftruncate(data_file.get(), data_end) != 0) {
    throw std::runtime_error("cannot create " + summary.data_path.string() + ": " +
                             std::strerror(errno));
  }
  std::string chunk;
  for (const auto& [initializer, offset] : external) {
    if (initializer->role == InitializerRole::kParameter && !options.write_parameter_bytes) {
      continue;
    }
    const int64_t total = byte_size(*initializer);
    for (int64_t begin = 0; begin < total; begin += kChunkBytes) {
      const int64_t count = std::min(kChunkBytes, total - begin);
      chunk.resize(static_cast<size_t>(count));
      generate_bytes(*initializer, begin, count, chunk.data());
      pwrite_all(data_file.get(), chunk.data(), count, offset + begin, summary.data_path);
    }
  }
  if (data_file.close() != 0) {
    throw std::runtime_error("cannot write " + summary.data_path.string() + ": " +
                             std::strerror(errno));
  }
  return summary;
}

}  // namespace stagecraft::samples
