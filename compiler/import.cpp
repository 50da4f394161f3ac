#include "compiler/import.h"

#include <fcntl.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/checker.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "compiler/import_opset.h"
#include "compiler/ir/onnx_bridge.h"
#include "compiler/ir/ops.h"
#include "passes/passes.h"
#include "passes/pipeline.h"
#include "runtime/format/error.h"
#include "runtime/ops/resize_shape.h"
#include "runtime/ops/rnn_core.h"

namespace stagecraft {
namespace fs = std::filesystem;
namespace {

onnx::ModelProto read_model(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(ErrorKind::kIo, "cannot open: {}", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(ErrorKind::kIo, "not a regular file");
  if (st.st_size == 0) fail(ErrorKind::kFormat, "empty file (0 bytes); expected an ONNX model");
  if (st.st_size > INT_MAX) {
    fail(ErrorKind::kFormat,
         "file is {:.2f} GiB; protobuf cannot parse a model over 2 GiB: save the weights as ONNX "
         "external data",
         static_cast<double>(st.st_size) / (1ull << 30));
  }
  // Stream the file through a small buffer: the weights then exist once, in the protobuf's
  // strings, from where import moves them into the IR.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "cannot open: {}", std::strerror(errno));
  onnx::ModelProto model;
  bool parsed = false;
  {
    google::protobuf::io::FileInputStream stream(fd);
    stream.SetCloseOnDelete(true);
    parsed = model.ParseFromZeroCopyStream(&stream);
  }
  if (!parsed) {
    fail(ErrorKind::kFormat,
         "not a valid ONNX model: the protobuf does not parse ({} bytes; truncated or not ONNX)",
         st.st_size);
  }
  if (!model.has_graph() || model.opset_import_size() == 0) {
    fail(ErrorKind::kFormat, "not an ONNX model: it has no {} ({} bytes)",
         model.has_graph() ? "opset_import" : "graph", st.st_size);
  }
  return model;
}

int64_t default_opset(const onnx::ModelProto& model) {
  for (const auto& imp : model.opset_import()) {
    if (imp.domain().empty() || imp.domain() == "ai.onnx") return imp.version();
  }
  return 0;
}

void check_versions(const onnx::ModelProto& model) {
  int64_t opset = default_opset(model);
  if (opset > kMaxOpset) {
    fail(ErrorKind::kUnsupported,
         "opset_import: default-domain opset {} is newer than {}, the newest stagecraft reads "
         "(opsets 18 to {} as {}, ONNX 1.12's); export with opset_version={} or older",
         opset, kNewestReadOpset, kNewestReadOpset, kMaxOpset, kNewestReadOpset);
  }
  if (model.ir_version() > onnx::IR_VERSION) {
    fail(ErrorKind::kUnsupported, "ir_version {} is newer than {}, the newest stagecraft reads",
         model.ir_version(), static_cast<int64_t>(onnx::IR_VERSION));
  }
}

/// Refuses nodes outside the default domain before ONNX's checker and shape inference, which
/// know no schemas for them.
void check_domains(const onnx::ModelProto& model) {
  std::unordered_map<std::string, int64_t> opsets;
  for (const auto& imp : model.opset_import()) opsets[imp.domain()] = imp.version();
  for (int k = 0; k < model.graph().node_size(); ++k) {
    const auto& n = model.graph().node(k);
    if (n.domain().empty() || n.domain() == "ai.onnx") continue;
    check_supported_op(n.op_type(), n.domain(), ir::node_name_or_default(n, k), opsets[n.domain()]);
  }
}

/// Refuses a Resize that the backends do not run (resize_shape.h's rules: opset 10's form,
/// tf_crop_and_resize) or whose output size is computed at run time: a static plan
/// needs scales or sizes that folding made constants.
void check_resize(const ir::Graph& graph, const ir::Node& node) {
  if (graph.opset < 11)
    fail(ErrorKind::kUnsupported,
         "node '{}': Resize at opset {} (X and scales, no coordinate modes) is not supported; "
         "re-export the model at opset 11 or later",
         node.name, graph.opset);
  onnx::NodeProto proto;
  for (const onnx::AttributeProto& a : node.attributes) *proto.add_attribute() = a;
  const rt::Attrs attrs(proto);
  if (auto read = rt::ops::read_resize_attributes(attrs); !read.error.empty())
    fail(ErrorKind::kUnsupported, "node '{}': {}", node.name, read.error);
  if (node.outputs.empty() || node.outputs[0] == ir::kNoId ||
      graph.value(node.outputs[0]).shape_known)
    return;
  for (std::size_t k : {std::size_t{3}, std::size_t{2}}) {
    if (k >= node.inputs.size() || node.inputs[k] == ir::kNoId) continue;
    const ir::Value& operand = graph.value(node.inputs[k]);
    if (operand.is_initializer()) continue;
    const char* what = k == 3 ? "sizes" : "scales";
    fail(ErrorKind::kShape,
         "node '{}': Resize's {} ('{}') {} at run time, so its output size is data-dependent; a "
         "static plan needs constant {} (export with a fixed input size, or with scale_factor)",
         node.name, what, operand.name,
         operand.producer != ir::kNoId
             ? fmt::format("are computed by node '{}' ({})", graph.node(operand.producer).name,
                           graph.node(operand.producer).op_type)
             : std::string("are a graph input, known only"),
         what);
  }
}

/// Refuses a TopK whose K is computed at run time: its outputs' length along the axis is K, so
/// a static plan needs K a constant (an initializer, or folded to one). Names K's input.
void check_topk(const ir::Graph& graph, const ir::Node& node) {
  if (node.inputs.size() < 2 || node.inputs[1] == ir::kNoId || node.outputs.empty() ||
      node.outputs[0] == ir::kNoId || graph.value(node.outputs[0]).shape_known)
    return;
  const ir::Value& k = graph.value(node.inputs[1]);
  if (k.is_initializer()) return;
  fail(ErrorKind::kShape,
       "node '{}': TopK's K ('{}') {} at run time, so its outputs' shape is data-dependent; a "
       "static plan needs a constant K (export with k as a Python int, not a tensor)",
       node.name, k.name,
       k.producer != ir::kNoId
           ? fmt::format("is computed by node '{}' ({})", graph.node(k.producer).name,
                         graph.node(k.producer).op_type)
           : std::string("is a graph input, known only"));
}

/// Refuses the ops that are left after folding and are outside the supported list. Checked
/// after folding, so shape arithmetic in ops we do not execute (Trilu on a constant mask,
/// say) is no obstacle.
/// LSTM, GRU and RNN: an activations attribute naming the defaults (torch writes RNN's
/// ["Tanh"]) is dropped, with activation_alpha and activation_beta, which the defaults ignore;
/// any other is refused in one line naming the node. The kernels then see no activations.
void drop_default_rnn_activations(ir::Graph& graph) {
  for (ir::NodeId id : graph.topological_order()) {
    ir::Node& node = graph.node(id);
    if (node.op_type != "LSTM" && node.op_type != "GRU" && node.op_type != "RNN") continue;
    if (!node.domain.empty() && node.domain != "ai.onnx") continue;
    std::string direction = "forward";
    std::vector<std::string> acts;
    bool has = false;
    for (const onnx::AttributeProto& a : node.attributes) {
      if (a.name() == "direction") direction = a.s();
      if (a.name() == "activations") {
        has = true;
        acts.assign(a.strings().begin(), a.strings().end());
      }
    }
    if (!has) continue;
    if (std::string why = rt::ops::rnn_activations_error(node.op_type, direction, acts);
        !why.empty())
      fail(ErrorKind::kUnsupported, "{}: {}", node.describe(graph), why);
    std::erase_if(node.attributes, [](const onnx::AttributeProto& a) {
      return a.name() == "activations" || a.name() == "activation_alpha" ||
             a.name() == "activation_beta";
    });
  }
}

void check_ops(const ir::Graph& graph) {
  for (const auto& node : graph.nodes()) {
    if (node.dead) continue;
    std::vector<std::string> inputs;
    for (ir::ValueId in : node.inputs)
      inputs.push_back(in == ir::kNoId ? std::string() : graph.value(in).name);
    check_supported_op(node.op_type, node.domain, node.name, graph.opset, inputs);
    if (node.op_type == "Resize") check_resize(graph, node);
    if (node.op_type == "TopK") check_topk(graph, node);
    // Before opset 7, PRelu's slope applied per channel (axis 1), not by numpy broadcasting;
    // the two agree only for a single slope.
    if (node.op_type == "PRelu" && graph.opset < 7 && node.inputs.size() > 1 &&
        node.inputs[1] != ir::kNoId && graph.value(node.inputs[1]).shape_known &&
        graph.value(node.inputs[1]).numel() != 1)
      fail(ErrorKind::kUnsupported,
           "node '{}': PRelu at opset {} applies its slope of shape {} per channel, before numpy "
           "broadcasting; stagecraft runs the opset-7 meaning; re-export the model at opset 7 or "
           "later",
           node.name, graph.opset, ir::shape_string(graph.value(node.inputs[1]).shape));
    // Before opset 13, Softmax normalises over all dims from `axis` (default 1) flattened
    // together; backends run the opset-13 meaning (one axis). The two agree on the last axis.
    if ((node.op_type == "Softmax" || node.op_type == "LogSoftmax") && graph.opset < 13 &&
        !node.inputs.empty()) {
      auto rank = static_cast<int64_t>(graph.value(node.inputs[0]).shape.size());
      int64_t axis = node.attr_int("axis", 1);
      if (axis < 0) axis += rank;
      if (axis != rank - 1)
        fail(ErrorKind::kUnsupported,
             "node '{}': {} at opset {} normalises dims {}..{} of its rank-{} input together; "
             "stagecraft runs it over one axis (opset 13); re-export the model at opset 13 or "
             "later",
             node.name, node.op_type, graph.opset, axis, rank - 1, rank);
    }
  }
}

/// Checks producers and consumers and puts the nodes in topological order (the ONNX checker
/// insists on it); names the first node that reads something nobody writes or sits on a cycle.
void check_structure(onnx::ModelProto& model) {
  auto* graph = model.mutable_graph();
  std::unordered_map<std::string, int> producer;  // -1: input or initializer
  for (const auto& i : graph->input()) producer[i.name()] = -1;
  for (const auto& i : graph->initializer()) producer[i.name()] = -1;
  for (int k = 0; k < graph->node_size(); ++k) {
    for (const auto& out : graph->node(k).output()) {
      if (out.empty()) continue;
      auto [it, inserted] = producer.emplace(out, k);
      if (!inserted) {
        fail(ErrorKind::kModel, "node '{}' ({}) writes tensor '{}', which already has a producer",
             ir::node_name_or_default(graph->node(k), k), graph->node(k).op_type(), out);
      }
    }
  }
  std::vector<int> pending(graph->node_size(), 0);
  std::vector<std::vector<int>> users(graph->node_size());
  for (int k = 0; k < graph->node_size(); ++k) {
    const auto& n = graph->node(k);
    for (const auto& in : n.input()) {
      if (in.empty()) continue;
      auto it = producer.find(in);
      if (it == producer.end()) {
        fail(ErrorKind::kModel,
             "node '{}' ({}) reads tensor '{}', which no node, input or initializer produces",
             ir::node_name_or_default(n, k), n.op_type(), in);
      }
      if (it->second >= 0) {
        ++pending[k];
        users[it->second].push_back(k);
      }
    }
  }
  for (const auto& out : graph->output()) {
    if (!producer.count(out.name())) {
      fail(ErrorKind::kModel, "graph output '{}' is produced by no node, input or initializer",
           out.name());
    }
  }
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  for (int k = 0; k < graph->node_size(); ++k) {
    if (pending[k] == 0) ready.push(k);
  }
  std::vector<int> order;
  while (!ready.empty()) {
    int k = ready.top();
    ready.pop();
    order.push_back(k);
    for (int u : users[k]) {
      if (--pending[u] == 0) ready.push(u);
    }
  }
  if (static_cast<int>(order.size()) != graph->node_size()) {
    for (int k = 0; k < graph->node_size(); ++k) {
      if (pending[k] > 0) {
        fail(ErrorKind::kModel, "the graph has a cycle through node '{}' ({})",
             ir::node_name_or_default(graph->node(k), k), graph->node(k).op_type());
      }
    }
  }
  bool sorted = true;
  for (std::size_t i = 0; i < order.size(); ++i) sorted &= order[i] == static_cast<int>(i);
  if (!sorted) {
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    for (int k : order) *nodes.Add() = graph->node(k);
    graph->mutable_node()->Swap(&nodes);
  }
}

/// The tensor attributes of the graph's Constant nodes, with the node's name.
std::vector<std::pair<std::string, const onnx::TensorProto*>> constant_tensors(
    const onnx::ModelProto& model) {
  std::vector<std::pair<std::string, const onnx::TensorProto*>> out;
  for (int i = 0; i < model.graph().node_size(); ++i) {
    const onnx::NodeProto& node = model.graph().node(i);
    if (node.op_type() != "Constant" || !node.domain().empty()) continue;
    for (const auto& a : node.attribute())
      if (a.has_t())
        out.emplace_back(fmt::format("node '{}' (Constant)", ir::node_name_or_default(node, i)),
                         &a.t());
  }
  return out;
}

bool has_external_data(const onnx::ModelProto& model) {
  const auto& inits = model.graph().initializer();
  const auto constants = constant_tensors(model);
  return std::any_of(inits.begin(), inits.end(),
                     [](const onnx::TensorProto& t) {
                       return t.data_location() == onnx::TensorProto::EXTERNAL;
                     }) ||
         std::any_of(constants.begin(), constants.end(), [](const auto& c) {
           return c.second->data_location() == onnx::TensorProto::EXTERNAL;
         });
}

/// Checks a tensor's dims (the ONNX checker's own element count wraps around on overflow) and
/// resolves its external data before anything reads it.
void check_tensor(const onnx::TensorProto& t, const std::string& model_dir) {
  std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
  int64_t n = ir::checked_numel(dims, "initializer '" + t.name() + "'");
  if (t.data_location() != onnx::TensorProto::EXTERNAL) return;
  auto dtype = dtype_from_onnx(t.data_type());
  int64_t size = dtype ? dtype_size(*dtype) : 0;
  if (size == 0) {
    fail(ErrorKind::kUnsupported,
         "initializer '{}' has element type {} which stagecraft does not handle", t.name(),
         t.data_type());
  }
  if (n > INT64_MAX / size)
    fail(ErrorKind::kShape, "initializer '{}': byte size overflows int64", t.name());
  ir::resolve_external_data(t, model_dir, n * size);
}

/// Every initializer and every Constant node's tensor, by `check_tensor`: a Constant's
/// external data follows the rules of an initializer's (the model's folder, nothing else).
void check_initializers(const onnx::ModelProto& model, const std::string& model_dir) {
  for (const auto& t : model.graph().initializer()) check_tensor(t, model_dir);
  for (const auto& [node, t] : constant_tensors(model))
    with_context(node, ErrorKind::kModel,
                 [&tensor = *t, &model_dir] { check_tensor(tensor, model_dir); });
}

std::vector<BoundDim> bind_dims(onnx::ModelProto& model, const ImportOptions& options) {
  auto* graph = model.mutable_graph();
  std::unordered_set<std::string> initializers;
  for (const auto& t : graph->initializer()) initializers.insert(t.name());
  std::vector<BoundDim> bound;
  std::set<std::string> used_keys;
  std::set<std::string> symbolic_names;
  std::map<std::string, int64_t> by_name;  // what each symbolic name got bound to
  std::string first_input_shape;

  for (auto& input : *graph->mutable_input()) {
    if (initializers.count(input.name())) continue;
    auto* type = input.mutable_type();
    if (!type->has_tensor_type()) {
      fail(ErrorKind::kUnsupported, "input '{}' is not a plain tensor (sequence, map or optional)",
           input.name());
    }
    if (!type->tensor_type().has_shape()) {
      fail(ErrorKind::kShape, "input '{}' has no shape in the model; stagecraft needs its rank",
           input.name());
    }
    auto* shape = type->mutable_tensor_type()->mutable_shape();
    std::vector<int64_t> dims;
    for (int i = 0; i < shape->dim_size(); ++i) {
      auto* d = shape->mutable_dim(i);
      if (d->has_dim_value()) {
        if (d->dim_value() < 0) {
          fail(ErrorKind::kShape, "input '{}' dim {} is negative ({})", input.name(), i,
               d->dim_value());
        }
        dims.push_back(d->dim_value());
        continue;
      }
      std::string name = d->has_dim_param() ? d->dim_param() : "";
      if (!name.empty()) symbolic_names.insert(name);
      std::string anon_key = input.name() + ":" + std::to_string(i);
      std::optional<int64_t> value;
      std::string flag = "--dim";
      if (!name.empty() && options.dims.count(name)) {
        value = options.dims.at(name);
        used_keys.insert(name);
      } else if (options.dims.count(anon_key)) {
        value = options.dims.at(anon_key);
        used_keys.insert(anon_key);
      } else if (i == 0 && options.batch) {
        value = *options.batch;
        flag = "--batch";
      }
      if (!value) {
        if (!name.empty()) {
          fail(ErrorKind::kShape, "input '{}' dim {} ('{}') is symbolic; bind it with --dim {}=N{}",
               input.name(), i, name, name, i == 0 ? " or --batch N" : "");
        }
        fail(ErrorKind::kShape,
             "input '{}' dim {} has no size in the model; bind it with --dim {}=N{}", input.name(),
             i, anon_key, i == 0 ? " or --batch N" : "");
      }
      if (!name.empty()) by_name[name] = *value;
      bound.push_back(BoundDim{input.name(), i, name, *value, flag});
      d->clear_dim_param();
      d->set_dim_value(*value);
      dims.push_back(*value);
    }
    ir::checked_numel(dims, "input '" + input.name() + "'");
    if (first_input_shape.empty())
      first_input_shape = "'" + input.name() + "' " + ir::shape_string(dims);
  }
  for (const auto& [key, value] : options.dims) {
    if (used_keys.count(key)) continue;
    std::string known;
    for (const auto& s : symbolic_names) known += (known.empty() ? "" : ", ") + s;
    fail(ErrorKind::kUsage, "--dim {}={} names no unbound dim of any input (symbolic dims: {})",
         key, value, known.empty() ? "none" : known);
  }
  if (options.batch) {
    bool used = std::any_of(bound.begin(), bound.end(),
                            [](const BoundDim& b) { return b.flag == "--batch"; });
    bool fixed_equal = false;
    for (const auto& input : graph->input()) {
      if (initializers.count(input.name())) continue;
      const auto& shape = input.type().tensor_type().shape();
      fixed_equal = shape.dim_size() > 0 && shape.dim(0).dim_value() == *options.batch;
      break;
    }
    if (!used && !fixed_equal) {
      fail(ErrorKind::kUsage,
           "--batch {} binds nothing: no input has a symbolic first dim (input {}); re-export the "
           "model with a dynamic batch axis or drop --batch",
           *options.batch, first_input_shape.empty() ? "none" : first_input_shape);
    }
  }
  // Outputs keep their declared types with the bound names substituted; intermediate
  // value_info is dropped and recomputed by shape inference.
  for (auto& output : *graph->mutable_output()) {
    if (!output.type().has_tensor_type() || !output.type().tensor_type().has_shape()) continue;
    for (auto& d : *output.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
      if (!d.has_dim_param()) continue;
      auto it = by_name.find(d.dim_param());
      if (it != by_name.end()) {
        d.set_dim_value(it->second);
      } else {
        d.clear_dim_param();
      }
    }
  }
  graph->clear_value_info();
  return bound;
}

/// Before opset 14 a training-mode BatchNormalization is told by its outputs (running mean and
/// var, saved mean and saved inverse std besides Y: torch.onnx's TrainingMode.TRAINING export
/// at opsets 9 to 13), with no training_mode attribute and no shapes for those outputs from
/// ONNX's inference. Each becomes the opset 14 form stagecraft trains: training_mode=1 here (the
/// stage files written at the model's opset leave the attribute out again, and the runtime
/// reads the outputs as saying it: ir::write, Program::from_model), outputs 1 and 2 of the
/// scale's shape and type, and the saved statistics dropped (read by a node, they are refused).
void read_old_training_batch_norms(ir::Graph& g) {
  if (g.opset >= 14) return;
  for (std::size_t i = 0; i < g.num_nodes(); ++i) {
    ir::Node& node = g.node(static_cast<ir::NodeId>(i));
    if (node.dead || node.op_type != "BatchNormalization" || !node.domain.empty() ||
        node.outputs.size() < 2 || node.inputs.size() < 2)
      continue;
    bool training = false;
    for (std::size_t k = 1; k < node.outputs.size(); ++k) training |= node.outputs[k] != ir::kNoId;
    if (!training) continue;
    for (std::size_t k = 3; k < node.outputs.size(); ++k) {
      const ir::ValueId out = node.outputs[k];
      if (out == ir::kNoId) continue;
      const ir::Value& saved = g.value(out);
      if (!saved.consumers.empty() || saved.is_graph_output)
        fail(ErrorKind::kUnsupported,
             "node '{}' (BatchNormalization, opset {}): its saved {} ('{}') is read; stagecraft "
             "trains the opset 14 form, which has none: export with opset_version=14 or newer",
             node.name, g.opset, k == 3 ? "mean" : "inverse standard deviation", saved.name);
      g.value(out).producer = ir::kNoId;
    }
    node.outputs.resize(std::min<std::size_t>(node.outputs.size(), 3));
    const ir::Value& scale = g.value(node.inputs[1]);
    for (std::size_t k = 1; k < node.outputs.size(); ++k) {
      if (node.outputs[k] == ir::kNoId) continue;
      ir::Value& stat = g.value(node.outputs[k]);
      stat.dtype = scale.dtype;
      stat.shape = scale.shape;
      stat.shape_known = scale.shape_known;
    }
    onnx::AttributeProto mode;
    mode.set_name("training_mode");
    mode.set_type(onnx::AttributeProto::INT);
    mode.set_i(1);
    node.attributes.push_back(mode);
  }
}

/// CastLike (opset 15; torch 2.x's exporter writes one for each constant it brings to an
/// activation's type) as the Cast it is once shape inference knows its target's type: the
/// backends then run one op for both, and the target is no longer read.
void lower_cast_like(ir::Graph& g) {
  for (std::size_t i = 0; i < g.num_nodes(); ++i) {
    const auto id = static_cast<ir::NodeId>(i);
    ir::Node& node = g.node(id);
    if (node.dead || node.op_type != "CastLike" || !node.domain.empty() || node.inputs.size() != 2)
      continue;
    const ir::Value& target = g.value(node.inputs[1]);
    if (target.dtype == DType::kUndefined)
      fail(ErrorKind::kShape, "node '{}' (CastLike): the type of its target '{}' is unknown",
           node.name, target.name);
    const DType to_type = target.dtype;
    g.drop_input(id, 1);
    node.op_type = "Cast";
    std::erase_if(node.attributes,
                  [](const onnx::AttributeProto& a) { return a.name() == "saturate"; });
    onnx::AttributeProto to;
    to.set_name("to");
    to.set_type(onnx::AttributeProto::INT);
    to.set_i(static_cast<int64_t>(to_type));
    node.attributes.push_back(to);
  }
}

}  // namespace

void parse_dim_binding(const std::string& text, ImportOptions& options) {
  auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size()) {
    fail(ErrorKind::kUsage, "--dim '{}' is not NAME=VALUE (e.g. --dim seq=512)", text);
  }
  std::string name = text.substr(0, eq);
  std::string number = text.substr(eq + 1);
  std::size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != number.size() || value <= 0) {
    fail(ErrorKind::kUsage, "--dim {}: value '{}' is not a positive integer", name, number);
  }
  if (auto it = options.dims.find(name); it != options.dims.end()) {
    fail(ErrorKind::kUsage, "--dim {} is given twice ({} and {}); give each dim once", name,
         it->second, value);
  }
  options.dims[name] = value;
}

ImportedModel import_model(const std::string& path, const ImportOptions& options) {
  return with_context(path, ErrorKind::kModel, [&] {
    if (options.batch && *options.batch <= 0) {
      fail(ErrorKind::kUsage, "--batch {} must be a positive integer", *options.batch);
    }
    onnx::ModelProto model = read_model(path);
    const int64_t file_opset = default_opset(model);
    const int64_t file_ir_version = model.ir_version();
    const int64_t lowered = lower_to_opset17(model);
    check_versions(model);
    check_domains(model);
    check_structure(model);
    std::string model_dir = fs::path(path).parent_path().string();
    check_initializers(model, model_dir.empty() ? "." : model_dir);

    ImportedModel result;
    result.nodes_in_file = model.graph().node_size();
    result.file_opset = file_opset;
    result.file_ir_version = file_ir_version;
    result.bound_dims = bind_dims(model, options);
    try {
      // The checker resolves external data against the model's folder only when given the
      // path; the file itself is small when weights are external, so reading it again is cheap.
      if (has_external_data(model)) {
        onnx::checker::check_model(path);
      } else {
        onnx::checker::check_model(model);
      }
    } catch (const onnx::checker::ValidationError& e) {
      // libonnx's message spans lines ("...\n\n==> Context: Bad node spec ..."): one line.
      std::string text;
      std::string_view rest = e.what();
      while (!rest.empty()) {
        const std::size_t end = std::min(rest.find('\n'), rest.size());
        std::string_view line = rest.substr(0, end);
        rest.remove_prefix(std::min(end + 1, rest.size()));
        while (!line.empty() && (line.front() == ' ' || line.front() == '=' || line.front() == '>'))
          line.remove_prefix(1);
        if (line.empty()) continue;
        text += text.empty() ? "" : "; ";
        text += line;
      }
      fail(ErrorKind::kModel, "ONNX checker: {}", text);
    }
    ir::infer_onnx_shapes(model);
    result.graph = ir::graph_from_model(model, path);
    read_old_training_batch_norms(result.graph);
    lower_cast_like(result.graph);
    passes::PassContext context;
    context.untie_merged_weights = options.untie_merged_weights;
    context.training = options.training;
    passes::run_import_pipeline(result.graph, context);
    result.untied = context.untied;
    check_ops(result.graph);
    passes::require_static_shapes(result.graph);
    drop_default_rnn_activations(result.graph);
    passes::check_node_shapes(result.graph);
    // Fused after every check of the imported ops: the Attention node is ours, not the model's.
    if (options.fuse_attention) passes::FuseAttention().run(result.graph, context);
    // After attention: a GELU never overlaps an attention block, and each fusion only shrinks
    // what the backward keeps.
    if (options.fuse_gelu) passes::FuseGelu().run(result.graph, context);
    result.attention_not_fused = context.not_fused;
    result.folded = context.counters;
    if (file_opset > kMaxOpset)
      result.folded[fmt::format("opset {} read as {}: nodes rewritten", file_opset, kMaxOpset)] =
          lowered;
    return result;
  });
}

}  // namespace stagecraft
