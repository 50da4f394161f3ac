#include "compiler/ir/onnx_bridge.h"

#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>
#include <sys/stat.h>

#include <charconv>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <unordered_set>

#include "compiler/ir/onnx_attributes.h"
#include "runtime/format/checked.h"
#include "runtime/format/error.h"
#include "runtime/format/inside_folder.h"

namespace stagecraft::ir {
namespace fs = std::filesystem;

namespace {

/// Appends `count` little-endian values of type T taken from a repeated field.
template <typename T, typename Field>
std::string pack(const Field& field) {
  std::string out(static_cast<std::size_t>(field.size()) * sizeof(T), '\0');
  for (int i = 0; i < field.size(); ++i) {
    T v = static_cast<T>(field.Get(i));
    std::memcpy(out.data() + static_cast<std::size_t>(i) * sizeof(T), &v, sizeof(T));
  }
  return out;
}

std::string typed_bytes(const onnx::TensorProto& t) {
  using TP = onnx::TensorProto;
  switch (t.data_type()) {
    case TP::FLOAT:
      return pack<float>(t.float_data());
    case TP::COMPLEX64:
      return pack<float>(t.float_data());
    case TP::DOUBLE:
      return pack<double>(t.double_data());
    case TP::COMPLEX128:
      return pack<double>(t.double_data());
    case TP::INT64:
      return pack<int64_t>(t.int64_data());
    case TP::UINT64:
      return pack<uint64_t>(t.uint64_data());
    case TP::UINT32:
      return pack<uint32_t>(t.uint64_data());
    case TP::INT32:
      return pack<int32_t>(t.int32_data());
    case TP::INT16:
      return pack<int16_t>(t.int32_data());
    case TP::UINT16:
      return pack<uint16_t>(t.int32_data());
    case TP::FLOAT16:
      return pack<uint16_t>(t.int32_data());
    case TP::BFLOAT16:
      return pack<uint16_t>(t.int32_data());
    case TP::INT8:
      return pack<int8_t>(t.int32_data());
    case TP::UINT8:
      return pack<uint8_t>(t.int32_data());
    case TP::BOOL:
      return pack<uint8_t>(t.int32_data());
    default:
      fail(ErrorKind::kUnsupported,
           "tensor '{}' has element type {} which stagecraft does not handle", t.name(),
           t.data_type());
  }
}

int64_t tensor_expected_bytes(const onnx::TensorProto& t) {
  std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
  int64_t n = checked_numel(dims, "initializer '" + t.name() + "'");
  auto dtype = dtype_from_onnx(t.data_type());
  if (!dtype || dtype_size(*dtype) == 0) {
    fail(ErrorKind::kUnsupported,
         "initializer '{}' has element type {} which stagecraft does not handle", t.name(),
         t.data_type());
  }
  if (n > INT64_MAX / dtype_size(*dtype)) {
    fail(ErrorKind::kShape, "initializer '{}': byte size overflows int64", t.name());
  }
  return n * dtype_size(*dtype);
}

/// Reads a static shape from a ValueInfo; false when the type has no shape or a dim is unknown.
bool static_shape(const onnx::TypeProto& type, std::vector<int64_t>& shape) {
  if (!type.has_tensor_type() || !type.tensor_type().has_shape()) return false;
  shape.clear();
  for (const auto& d : type.tensor_type().shape().dim()) {
    if (!d.has_dim_value() || d.dim_value() < 0) return false;
    shape.push_back(d.dim_value());
  }
  return true;
}

void fill_value_type(Value& v, const onnx::ValueInfoProto& info) {
  const auto& type = info.type();
  if (type.value_case() != onnx::TypeProto::kTensorType) {
    fail(ErrorKind::kUnsupported, "tensor '{}' is not a plain tensor (sequence, map or optional)",
         info.name());
  }
  if (type.tensor_type().elem_type() != 0) {
    auto dtype = dtype_from_onnx(type.tensor_type().elem_type());
    if (!dtype) {
      fail(ErrorKind::kUnsupported, "tensor '{}' has unknown element type {}", info.name(),
           type.tensor_type().elem_type());
    }
    v.dtype = *dtype;
  }
  v.shape_known = static_shape(type, v.shape);
}

}  // namespace

ExternalRef resolve_external_data(const onnx::TensorProto& tensor, const std::string& model_dir,
                                  int64_t expected_bytes, ExternalFiles* files) {
  std::string location;
  int64_t offset = 0;
  int64_t length = -1;
  auto bad = [&](const std::string& why) -> Error {
    return Error(ErrorKind::kFormat, fmt::format("initializer '{}': external data '{}': {}",
                                                 tensor.name(), location, why));
  };
  // The whole value must be a number: "64abc" is refused, not read as 64.
  auto number = [&](const std::string& key, const std::string& text) {
    int64_t value = 0;
    auto [last, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || last != text.data() + text.size())
      throw bad(fmt::format("{} '{}' is not a number", key, text));
    return value;
  };
  for (const auto& entry : tensor.external_data()) {
    if (entry.key() == "location") {
      location = entry.value();
    } else if (entry.key() == "offset") {
      offset = number(entry.key(), entry.value());
    } else if (entry.key() == "length") {
      length = number(entry.key(), entry.value());
    }
  }
  if (location.empty()) throw bad("no 'location' entry");
  if (offset < 0) throw bad(fmt::format("offset {} is negative", offset));
  if (length < -1) throw bad(fmt::format("length {} is negative", length));
  std::string path;
  int64_t file_size = 0;
  const ExternalFiles::File* known = nullptr;
  if (files != nullptr) {
    auto it = files->by_location.find(location);
    if (it != files->by_location.end()) known = &it->second;
  }
  if (known != nullptr) {
    path = known->path;
    file_size = known->size;
  } else {
    // The one rule for paths a file names inside its folder (runtime/format/inside_folder.h).
    try {
      path = resolve_inside_folder(model_dir, location);
    } catch (const Error& e) {
      throw bad(e.message());
    }
    std::error_code ec;
    file_size = static_cast<int64_t>(fs::file_size(path, ec));
    if (ec) throw bad(fmt::format("cannot read the size of {}: {}", path, ec.message()));
    if (files) files->by_location[location] = {path, file_size};
  }
  if (length == -1) length = file_size > offset ? file_size - offset : 0;
  if (!range_within(offset, length, file_size)) {
    const std::optional<int64_t> end = try_add(offset, length);
    throw bad(fmt::format(
        "window offset {} + length {} = {} lies past the end of the file ({} bytes)", offset,
        length, end ? std::to_string(*end) : std::string("over 2^63"), file_size));
  }
  if (length != expected_bytes) {
    throw bad(fmt::format("length {} does not match the {} bytes its dtype and dims need", length,
                          expected_bytes));
  }
  return ExternalRef{path, location, offset, length};
}

std::shared_ptr<const WeightData> take_tensor_data(onnx::TensorProto& tensor,
                                                   const std::string& model_dir,
                                                   ExternalFiles* files) {
  int64_t expected = tensor_expected_bytes(tensor);
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL) {
    auto ref = resolve_external_data(tensor, model_dir, expected, files);
    return WeightData::external(ref.path, ref.location, ref.offset, ref.length);
  }
  std::string bytes;
  if (tensor.has_raw_data()) {
    bytes = std::move(*tensor.mutable_raw_data());
    tensor.clear_raw_data();
  } else {
    bytes = typed_bytes(tensor);
  }
  if (static_cast<int64_t>(bytes.size()) != expected) {
    fail(ErrorKind::kFormat, "initializer '{}' holds {} bytes but its dtype and dims {} need {}",
         tensor.name(), bytes.size(),
         shape_string(std::vector<int64_t>(tensor.dims().begin(), tensor.dims().end())), expected);
  }
  return WeightData::owned(std::move(bytes));
}

std::string node_name_or_default(const onnx::NodeProto& node, int index) {
  if (!node.name().empty()) return node.name();
  return node.op_type() + "(" + (node.output_size() > 0 ? node.output(0) : std::to_string(index)) +
         ")";
}

Graph graph_from_model(onnx::ModelProto& model, const std::string& model_path) {
  Graph g;
  auto* proto = model.mutable_graph();
  g.name = proto->name();
  g.source_path = model_path;
  g.producer_name = model.producer_name();
  g.ir_version = model.ir_version();
  for (const auto& imp : model.opset_import()) {
    std::string domain = imp.domain() == "ai.onnx" ? "" : imp.domain();
    g.opset_imports[domain] = imp.version();
    if (domain.empty()) g.opset = imp.version();
  }
  std::string model_dir = fs::path(model_path).parent_path().string();

  // Initializers first: they are weights even when an old exporter also lists them as inputs.
  std::unordered_set<std::string> initializer_names;
  ExternalFiles files;
  for (auto& init : *proto->mutable_initializer()) {
    Value v;
    v.name = init.name();
    auto dtype = dtype_from_onnx(init.data_type());
    if (!dtype) {
      fail(ErrorKind::kUnsupported,
           "initializer '{}' has element type {} which stagecraft does not handle", init.name(),
           init.data_type());
    }
    v.dtype = *dtype;
    v.shape.assign(init.dims().begin(), init.dims().end());
    checked_numel(v.shape, "initializer '" + v.name + "'");
    v.shape_known = true;
    v.initializer = take_tensor_data(init, model_dir, &files);
    v.is_weight = is_floating(v.dtype);
    initializer_names.insert(v.name);
    g.add_value(std::move(v));
  }
  if (proto->sparse_initializer_size() > 0) {
    fail(ErrorKind::kUnsupported, "sparse initializers ('{}') are not supported",
         proto->sparse_initializer(0).values().name());
  }
  for (const auto& info : proto->input()) {
    if (initializer_names.count(info.name())) continue;
    Value v;
    v.name = info.name();
    fill_value_type(v, info);
    v.is_graph_input = true;
    g.inputs.push_back(g.add_value(std::move(v)));
  }
  // Every node output becomes a value before any node is linked, so an input read before its
  // producer appears (a model out of order, or a cycle) is told apart from one nobody writes.
  for (const auto& n : proto->node()) {
    for (const auto& out : n.output()) {
      if (out.empty()) continue;
      Value v;
      v.name = out;
      g.add_value(std::move(v));
    }
  }
  auto set_info = [&](const onnx::ValueInfoProto& info) {
    if (auto id = g.find_value(info.name())) {
      Value& v = g.value(*id);
      if (!v.is_initializer() && !v.is_graph_input) fill_value_type(v, info);
    }
  };
  for (const auto& info : proto->value_info()) set_info(info);
  for (const auto& info : proto->output()) set_info(info);

  // Plans name nodes: give unnamed ones the name of their first output, and make repeats unique.
  std::unordered_set<std::string> node_names;
  for (int i = 0; i < proto->node_size(); ++i) {
    const auto& n = proto->node(i);
    Node node;
    node.name = node_name_or_default(n, i);
    const std::string base = node.name;
    for (int k = 2; !node_names.insert(node.name).second; ++k)
      node.name = base + "#" + std::to_string(k);
    node.op_type = n.op_type();
    node.domain = n.domain() == "ai.onnx" ? "" : n.domain();
    for (const auto& a : n.attribute()) node.attributes.push_back(a);
    for (const auto& in : n.input()) {
      if (in.empty()) {
        node.inputs.push_back(kNoId);
        continue;
      }
      auto id = g.find_value(in);
      if (!id) {
        fail(ErrorKind::kModel,
             "node '{}' ({}) reads tensor '{}' that no node, input or initializer produces",
             n.name(), n.op_type(), in);
      }
      node.inputs.push_back(*id);
    }
    for (const auto& out : n.output())
      node.outputs.push_back(out.empty() ? kNoId : *g.find_value(out));
    g.add_node(std::move(node));
  }
  for (const auto& info : proto->output()) {
    auto id = g.find_value(info.name());
    if (!id) fail(ErrorKind::kModel, "graph output '{}' is produced by nothing", info.name());
    g.value(*id).is_graph_output = true;
    g.outputs.push_back(*id);
  }
  return g;
}

namespace {

/// ONNX's line for a failing node, "... (op_type:Conv, node name: c1): [ShapeInferenceError]
/// reason", in our words: "node 'c1' (Conv): reason". Parsed by hand, not with std::regex: the
/// node name comes from the model, and std::regex recurses per character (a long name
/// overflowed the stack). A line of another shape is returned as it is.
std::string node_error_line(const std::string& line) {
  constexpr std::string_view kOp = "(op_type:", kName = ", node name: ", kEnd = "): ";
  const std::size_t op = line.find(kOp);
  if (op == std::string::npos) return line;
  const std::size_t name = line.find(kName, op + kOp.size());
  if (name == std::string::npos) return line;
  const std::size_t end = line.find(kEnd, name + kName.size());
  if (end == std::string::npos) return line;
  std::string_view op_type(line.data() + op + kOp.size(), name - op - kOp.size());
  std::string_view node(line.data() + name + kName.size(), end - name - kName.size());
  std::string_view reason(line);
  reason.remove_prefix(end + kEnd.size());
  // An "[ErrorKind] " tag in front of the reason is ONNX's, not the user's: drop it.
  if (reason.starts_with('[')) {
    const std::size_t close = reason.find("] ");
    if (close != std::string_view::npos) reason.remove_prefix(close + 2);
  }
  if (op_type.find(',') != std::string_view::npos || node.find(')') != std::string_view::npos)
    return line;
  return fmt::format("node '{}' ({}): {}", node, op_type, reason);
}

/// The node name in ONNX's line for a failing node; "" for a line of another shape.
std::string failing_node(const std::string& line) {
  constexpr std::string_view kName = ", node name: ", kEnd = "): ";
  const std::size_t name = line.find(kName);
  if (name == std::string::npos) return "";
  const std::size_t end = line.find(kEnd, name + kName.size());
  if (end == std::string::npos) return "";
  return line.substr(name + kName.size(), end - name - kName.size());
}

}  // namespace

void infer_onnx_shapes(onnx::ModelProto& model) {
  // libonnx divides by strides and loops over Slice steps without looking at them.
  check_attributes_for_inference(model);
  try {
    onnx::ShapeInferenceOptions strict(/*check_type=*/true, /*error_mode=*/1, /*data_prop=*/true);
    onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(), strict);
  } catch (const std::exception& e) {
    // ONNX lists one line per failing node; the first is the cause, the rest follow from it.
    std::string text = e.what();
    std::vector<std::string> lines;
    std::size_t start = 0;
    while (start < text.size()) {
      std::size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      if (end > start) lines.push_back(text.substr(start, end - start));
      start = end + 1;
    }
    std::string first = lines.empty() ? text : lines.front();
    first = node_error_line(first) + inference_context(model, failing_node(first));
    std::string more =
        lines.size() > 1 ? fmt::format(" ({} more errors follow from it)", lines.size() - 1) : "";
    fail(ErrorKind::kShape, "ONNX shape inference: {}{}", first, more);
  }
}

namespace {

void write_value_info(const Value& v, onnx::ValueInfoProto* info) {
  info->set_name(v.name);
  auto* tt = info->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(v.dtype));
  if (v.shape_known) {
    auto* shape = tt->mutable_shape();
    for (int64_t d : v.shape) shape->add_dim()->set_dim_value(d);
  }
}

void write_initializer(const Value& v, WeightMode mode, onnx::TensorProto* t) {
  t->set_name(v.name);
  t->set_data_type(static_cast<int32_t>(v.dtype));
  for (int64_t d : v.shape) t->add_dims(d);
  if (mode == WeightMode::kNoData) return;
  const WeightData& w = *v.initializer;
  auto bytes = w.bytes();
  t->set_raw_data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace

onnx::ModelProto model_from_graph(const Graph& graph, const ExportOptions& options) {
  onnx::ModelProto model;
  // IR 4 and later let initializers be absent from the inputs, which export relies on.
  model.set_ir_version(std::max<int64_t>(graph.ir_version, 8));
  model.set_producer_name(graph.producer_name.empty() ? "stagecraft" : graph.producer_name);
  for (const auto& [domain, version] : graph.opset_imports) {
    auto* imp = model.add_opset_import();
    imp->set_domain(domain);
    imp->set_version(version);
  }
  if (graph.opset_imports.empty()) {
    auto* imp = model.add_opset_import();
    imp->set_domain("");
    imp->set_version(graph.opset);
  }
  auto* proto = model.mutable_graph();
  proto->set_name(graph.name.empty() ? "stagecraft" : graph.name);

  // The subset in the caller's order, or every live node in the graph's topological order.
  const std::vector<NodeId> order = options.nodes ? *options.nodes : graph.topological_order();
  std::vector<bool> in_set(graph.num_nodes(), false);
  std::vector<bool> written(graph.num_nodes(), false);
  for (NodeId n : order) in_set[n] = true;
  for (NodeId n : order) {
    // A node read before its producer in the subset is written: the caller's order is wrong.
    for (ValueId in : graph.node(n).inputs) {
      const NodeId p = in == kNoId ? kNoId : graph.value(in).producer;
      if (p != kNoId && in_set[p] && !written[p])
        fail(ErrorKind::kInternal, "export: node {} is listed before its input's producer {}",
             graph.node(n).describe(graph), graph.node(p).describe(graph));
    }
    written[n] = true;
  }

  std::vector<bool> seen(graph.num_values(), false);
  std::vector<ValueId> reads;
  if (!options.nodes) {
    // The whole model keeps its inputs, used or not, in the user's order.
    for (ValueId v : graph.inputs) {
      seen[v] = true;
      reads.push_back(v);
    }
    // A graph output that folding turned into a constant is written as an initializer.
    for (ValueId v : graph.outputs) {
      if (seen[v] || !graph.value(v).is_initializer()) continue;
      seen[v] = true;
      reads.push_back(v);
    }
  }
  for (NodeId n : order) {
    for (ValueId in : graph.node(n).inputs) {
      if (in == kNoId || seen[in]) continue;
      seen[in] = true;
      reads.push_back(in);
    }
  }
  // Inputs: values read here whose producer is elsewhere (or a graph input); initializers.
  for (ValueId v : reads) {
    const Value& val = graph.value(v);
    if (val.producer != kNoId && in_set[val.producer]) continue;
    if (val.is_initializer()) {
      // Shape inference reads constants (Reshape targets, Slice bounds), never weights.
      bool needed = !val.is_weight && val.numel() <= options.small_constant_elements;
      if (options.weights == WeightMode::kAsInputs && !needed) {
        write_value_info(val, proto->add_input());
      } else {
        write_initializer(val, options.weights, proto->add_initializer());
      }
    } else {
      write_value_info(val, proto->add_input());
    }
  }
  // Outputs: values produced here that a graph output or a node outside the subset reads.
  std::unordered_set<ValueId> written_outputs;
  if (!options.nodes) {
    for (ValueId v : graph.outputs) {
      if (written_outputs.insert(v).second) write_value_info(graph.value(v), proto->add_output());
    }
  }
  for (NodeId n : order) {
    for (ValueId out : graph.node(n).outputs) {
      if (out == kNoId || written_outputs.count(out)) continue;
      const Value& val = graph.value(out);
      bool read_outside = val.is_graph_output;
      for (NodeId user : val.consumers) read_outside |= !in_set[user];
      if (read_outside && options.nodes) {
        written_outputs.insert(out);
        write_value_info(val, proto->add_output());
      }
    }
  }
  for (NodeId n : order) {
    const Node& node = graph.node(n);
    auto* np = proto->add_node();
    np->set_name(node.name);
    np->set_op_type(node.op_type);
    np->set_domain(node.domain);
    for (ValueId in : node.inputs) np->add_input(in == kNoId ? "" : graph.value(in).name);
    for (ValueId out : node.outputs) np->add_output(out == kNoId ? "" : graph.value(out).name);
    // Before opset 14 BatchNormalization has no training_mode: its outputs say it, all five
    // (Y, running mean and var, saved mean and inverse std; compiler/import.cpp
    // read_old_training_batch_norms). The saved two, which nothing reads, get names of their own
    // again; Program::from_model reads the node back as the opset 14 form.
    const bool old_batch_norm =
        node.op_type == "BatchNormalization" && node.domain.empty() && graph.opset < 14;
    if (old_batch_norm && node.attr_int("training_mode", 0) != 0) {
      while (np->output_size() < 3) np->add_output("");
      for (const char* saved : {"saved_mean", "saved_inv_std"}) {
        std::string name = node.name + "/" + saved;
        while (graph.find_value(name)) name += "_";
        np->add_output(name);
      }
    }
    for (const auto& a : node.attributes)
      if (!(old_batch_norm && a.name() == "training_mode")) *np->add_attribute() = a;
    if (!options.value_info) continue;
    for (ValueId out : node.outputs) {
      if (out == kNoId || written_outputs.count(out)) continue;
      const Value& val = graph.value(out);
      if (val.shape_known && val.dtype != DType::kUndefined)
        write_value_info(val, proto->add_value_info());
    }
  }
  return model;
}

}  // namespace stagecraft::ir
