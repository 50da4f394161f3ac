// The model-local function that keeps a stage file with 16-bit Conv nodes plain ONNX
// (conv_function.h), from ops every ONNX runtime and stagecraft's importer take.
#include "compiler/plan/conv_function.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "compiler/plan/attention_function.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::plan {
namespace {

constexpr std::string_view kConv = "Conv";

/// Conv's attributes at opset 11-17, every one optional.
constexpr const char* kConvAttributes[] = {"auto_pad",     "dilations", "group",
                                           "kernel_shape", "pads",      "strides"};

bool is_conv(const onnx::NodeProto& n) {
  return n.op_type() == kConv && n.domain() == grad::kGradDomain;
}

bool has_bias(const onnx::NodeProto& n) { return n.input_size() > 2 && !n.input(2).empty(); }

onnx::FunctionProto conv_function(bool bias, int storage, int64_t opset) {
  std::vector<CastOperand> inputs = {{"X", true}, {"W", true}};
  if (bias) inputs.push_back({"B", true});
  std::vector<std::pair<const char*, onnx::AttributeProto::AttributeType>> attributes;
  for (const char* name : kConvAttributes) {
    const std::string_view n = name;
    attributes.emplace_back(name, n == "auto_pad" ? onnx::AttributeProto::STRING
                                  : n == "group"  ? onnx::AttributeProto::INT
                                                  : onnx::AttributeProto::INTS);
  }
  return op_between_casts(
      std::string(kConv),
      "stagecraft's 16-bit Conv (opset 17's Conv has no bfloat16) as the standard Conv in float32 "
      "between Casts, as the kernels compute",
      inputs, {{"Y", true}}, attributes, storage, opset);
}

/// The output channels (W's first dimension) of Conv node `n`, from its weight as the file
/// records it; -1 when the file does not say.
int64_t output_channels(const onnx::GraphProto& g, const onnx::NodeProto& n) {
  if (n.input_size() < 2) return -1;
  for (const auto* list : {&g.value_info(), &g.input()})
    for (const onnx::ValueInfoProto& vi : *list)
      if (vi.name() == n.input(1) && vi.type().tensor_type().has_shape() &&
          vi.type().tensor_type().shape().dim_size() > 0 &&
          vi.type().tensor_type().shape().dim(0).has_dim_value())
        return vi.type().tensor_type().shape().dim(0).dim_value();
  for (const onnx::TensorProto& t : g.initializer())
    if (t.name() == n.input(1) && t.dims_size() > 0) return t.dims(0);
  return -1;
}

/// Gives each bias-less Conv node of `g` a zero bias of its output channels, in `storage`.
void add_zero_biases(onnx::GraphProto& g, int storage) {
  std::map<int64_t, std::string> zero_of;  // channels -> initializer
  std::set<std::string> taken;
  for (const onnx::TensorProto& t : g.initializer()) taken.insert(t.name());
  for (onnx::NodeProto& n : *g.mutable_node()) {
    if (!is_conv(n) || has_bias(n)) continue;
    const int64_t m = output_channels(g, n);
    if (m <= 0)
      fail(ErrorKind::kInternal,
           "graph '{}': Conv node '{}': the file does not record weight "
           "{}'s shape",
           g.name(), n.name(), n.input_size() > 1 ? n.input(1) : "");
    auto [it, added] = zero_of.emplace(m, std::string(kConvZeroBias) + std::to_string(m));
    if (added) {
      if (taken.count(it->second))
        fail(ErrorKind::kInternal, "graph '{}': an initializer is already named '{}'", g.name(),
             it->second);
      onnx::TensorProto* zero = g.add_initializer();
      zero->set_name(it->second);
      zero->set_data_type(storage);
      zero->add_dims(m);
      zero->set_raw_data(std::string(static_cast<size_t>(m) * 2, '\0'));
    }
    while (n.input_size() < 3) n.add_input("");
    n.set_input(2, it->second);
  }
}

}  // namespace

int add_conv_function(onnx::ModelProto& model) {
  onnx::GraphProto& g = *model.mutable_graph();
  std::set<bool> biases;
  int nodes = 0;
  for (const onnx::NodeProto& n : g.node()) {
    if (!is_conv(n)) continue;
    ++nodes;
    biases.insert(has_bias(n));
  }
  if (nodes == 0) return 0;
  const int64_t opset = default_opset(model);
  const int storage = function_storage_type(model, kConv);
  if (storage == onnx::TensorProto::FLOAT)
    fail(ErrorKind::kInternal, "graph '{}': a Conv node of domain {} that reads float32", g.name(),
         grad::kGradDomain);
  for (onnx::NodeProto& n : *g.mutable_node())  // a trailing "" is no bias
    if (is_conv(n) && n.input_size() > 2 && n.input(2).empty()) n.mutable_input()->RemoveLast();
  if (biases.size() > 1) add_zero_biases(g, storage);
  *model.add_functions() = conv_function(*biases.rbegin(), storage, opset);
  return nodes;
}

}  // namespace stagecraft::plan
