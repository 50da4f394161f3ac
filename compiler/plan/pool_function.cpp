// The model-local functions that keep a stage file with 16-bit pooling nodes plain ONNX
// (pool_function.h), from ops every ONNX runtime and stagecraft's importer take.
#include "compiler/plan/pool_function.h"

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compiler/plan/attention_function.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::plan {
namespace {

using Attribute = std::pair<const char*, onnx::AttributeProto::AttributeType>;

// Each op's attributes at opset 11-18 (AveragePool's dilations from opset 19), every one
// optional.
std::vector<Attribute> attributes_of(std::string_view op, int64_t opset) {
  constexpr auto kInt = onnx::AttributeProto::INT, kInts = onnx::AttributeProto::INTS,
                 kString = onnx::AttributeProto::STRING;
  if (op == "MaxPool")
    return {{"auto_pad", kString},   {"ceil_mode", kInt}, {"dilations", kInts},
            {"kernel_shape", kInts}, {"pads", kInts},     {"storage_order", kInt},
            {"strides", kInts}};
  if (op == "AveragePool") {
    std::vector<Attribute> a = {
        {"auto_pad", kString},   {"ceil_mode", kInt}, {"count_include_pad", kInt},
        {"kernel_shape", kInts}, {"pads", kInts},     {"strides", kInts}};
    if (opset >= 19) a.push_back({"dilations", kInts});
    return a;
  }
  return {};  // GlobalAveragePool
}

bool is_pool(const onnx::NodeProto& n) {
  return n.domain() == grad::kGradDomain &&
         (n.op_type() == "MaxPool" || n.op_type() == "AveragePool" ||
          n.op_type() == "GlobalAveragePool");
}

// Outputs up to the last named one.
int outputs_of(const onnx::NodeProto& n) {
  int out = n.output_size();
  while (out > 0 && n.output(out - 1).empty()) --out;
  return out;
}

onnx::FunctionProto pool_function(const std::string& op, int outputs, int storage, int64_t opset) {
  std::vector<CastOperand> out = {{"Y", true}};
  if (outputs > 1) out.push_back({"Indices", false});
  return op_between_casts(op,
                          "stagecraft's 16-bit " + op + " (opset 17's " + op +
                              " has no bfloat16) as the standard op in float32 between Casts, "
                              "as the kernels compute",
                          {{"X", true}}, out, attributes_of(op, opset), storage, opset);
}

}  // namespace

int add_pool_functions(onnx::ModelProto& model) {
  const onnx::GraphProto& g = model.graph();
  std::map<std::string, std::set<int>> arities;  // op -> outputs
  int nodes = 0;
  for (const onnx::NodeProto& n : g.node()) {
    if (!is_pool(n)) continue;
    ++nodes;
    arities[n.op_type()].insert(outputs_of(n));
  }
  if (nodes == 0) return 0;
  const int64_t opset = default_opset(model);
  for (const auto& [op, outputs] : arities) {
    if (outputs.size() > 1)
      fail(ErrorKind::kUnsupported,
           "graph '{}': {} nodes of domain {} with and without Indices; one function body cannot "
           "serve both",
           g.name(), op, grad::kGradDomain);
    const int storage = function_storage_type(model, op);
    if (storage == onnx::TensorProto::FLOAT)
      fail(ErrorKind::kInternal, "graph '{}': a {} node of domain {} that reads float32", g.name(),
           op, grad::kGradDomain);
    for (onnx::NodeProto& n : *model.mutable_graph()->mutable_node())  // trailing "" dropped
      if (is_pool(n) && n.op_type() == op)
        while (n.output_size() > *outputs.begin()) n.mutable_output()->RemoveLast();
    *model.add_functions() = pool_function(op, *outputs.begin(), storage, opset);
  }
  return nodes;
}

}  // namespace stagecraft::plan
