// The model-local function that keeps a stage file with a loss on 16-bit scores plain ONNX
// (loss_function.h), from ops every ONNX runtime and stagecraft's importer take.
#include "compiler/plan/loss_function.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compiler/plan/attention_function.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::plan {
namespace {

constexpr std::string_view kLoss = "SoftmaxCrossEntropyLoss";

bool is_loss(const onnx::NodeProto& n) {
  return n.op_type() == kLoss && n.domain() == grad::kGradDomain;
}

// The node's inputs and outputs up to its last named one.
std::pair<int, int> arity(const onnx::NodeProto& n) {
  int in = n.input_size(), out = n.output_size();
  while (in > 0 && n.input(in - 1).empty()) --in;
  while (out > 0 && n.output(out - 1).empty()) --out;
  return {in, out};
}

onnx::FunctionProto loss_function(int inputs, int outputs, int storage, int64_t opset) {
  const char* const in_names[] = {"scores", "labels", "weights"};
  const char* const out_names[] = {"loss", "log_prob"};
  std::vector<CastOperand> in, out;
  for (int k = 0; k < inputs; ++k) in.push_back({in_names[k], k == 0});
  for (int k = 0; k < outputs; ++k) out.push_back({out_names[k], false});
  return op_between_casts(
      std::string(kLoss),
      "stagecraft's SoftmaxCrossEntropyLoss on 16-bit scores with a float32 loss (ONNX's op gives "
      "its outputs the scores' type) as the standard op after a Cast of the scores to float32, "
      "as the kernels compute",
      in, out,
      {{"ignore_index", onnx::AttributeProto::INT}, {"reduction", onnx::AttributeProto::STRING}},
      storage, opset);
}

}  // namespace

int add_loss_function(onnx::ModelProto& model) {
  const onnx::GraphProto& g = model.graph();
  std::set<std::pair<int, int>> arities;
  int nodes = 0;
  for (const onnx::NodeProto& n : g.node()) {
    if (!is_loss(n)) continue;
    ++nodes;
    arities.insert(arity(n));
  }
  if (nodes == 0) return 0;
  if (arities.size() > 1)
    fail(ErrorKind::kUnsupported,
         "graph '{}': {} SoftmaxCrossEntropyLoss nodes of domain {} with different inputs or "
         "outputs; one function body cannot serve them",
         g.name(), nodes, grad::kGradDomain);
  const int storage = function_storage_type(model, kLoss);
  if (storage == onnx::TensorProto::FLOAT)
    fail(ErrorKind::kInternal,
         "graph '{}': a SoftmaxCrossEntropyLoss node of domain {} that reads float32 scores",
         g.name(), grad::kGradDomain);
  const auto [inputs, outputs] = *arities.begin();
  for (onnx::NodeProto& n : *model.mutable_graph()->mutable_node()) {  // trailing "" dropped
    if (!is_loss(n)) continue;
    while (n.input_size() > inputs) n.mutable_input()->RemoveLast();
    while (n.output_size() > outputs) n.mutable_output()->RemoveLast();
  }
  *model.add_functions() = loss_function(inputs, outputs, storage, default_opset(model));
  return nodes;
}

}  // namespace stagecraft::plan
