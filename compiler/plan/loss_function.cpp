// The model-local function that keeps a stage file with a loss on 16-bit scores plain ONNX
// (loss_function.h), from ops every ONNX runtime and stagecraft's importer take.
#include "compiler/plan/loss_function.h"

#include <set>
#include <string>
#include <utility>

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

onnx::FunctionProto loss_function(int inputs, int outputs, int64_t opset) {
  onnx::FunctionProto f;
  f.set_name(std::string(kLoss));
  f.set_domain(std::string(grad::kGradDomain));
  f.set_doc_string(
      "stagecraft's SoftmaxCrossEntropyLoss on 16-bit scores with a float32 loss (ONNX's op gives "
      "its outputs the scores' type) as the standard op after a Cast of the scores to float32, "
      "as the kernels compute");
  const char* const in_names[] = {"scores", "labels", "weights"};
  const char* const out_names[] = {"loss", "log_prob"};
  for (int k = 0; k < inputs; ++k) f.add_input(in_names[k]);
  for (int k = 0; k < outputs; ++k) f.add_output(out_names[k]);
  f.add_attribute("ignore_index");
  f.add_attribute("reduction");
  onnx::OperatorSetIdProto* imp = f.add_opset_import();
  imp->set_domain("");
  imp->set_version(opset);
  onnx::NodeProto* cast = f.add_node();
  cast->set_op_type("Cast");
  cast->set_name("SoftmaxCrossEntropyLoss/scores_float");
  cast->add_input("scores");
  cast->add_output("scores_float");
  onnx::AttributeProto* to = cast->add_attribute();
  to->set_name("to");
  to->set_type(onnx::AttributeProto::INT);
  to->set_i(onnx::TensorProto::FLOAT);
  onnx::NodeProto* loss = f.add_node();
  loss->set_op_type(std::string(kLoss));
  loss->set_name("SoftmaxCrossEntropyLoss/loss");
  loss->add_input("scores_float");
  for (int k = 1; k < inputs; ++k) loss->add_input(in_names[k]);
  for (int k = 0; k < outputs; ++k) loss->add_output(out_names[k]);
  for (const auto& [name, type] : {std::pair{"ignore_index", onnx::AttributeProto::INT},
                                   std::pair{"reduction", onnx::AttributeProto::STRING}}) {
    onnx::AttributeProto* a = loss->add_attribute();
    a->set_name(name);
    a->set_ref_attr_name(name);
    a->set_type(type);
  }
  return f;
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
  if (function_storage_type(model, kLoss) == onnx::TensorProto::FLOAT)
    fail(ErrorKind::kInternal,
         "graph '{}': a SoftmaxCrossEntropyLoss node of domain {} that reads "
         "float32 scores",
         g.name(), grad::kGradDomain);
  int64_t opset = -1;
  for (const onnx::OperatorSetIdProto& imp : model.opset_import())
    if (imp.domain().empty() || imp.domain() == "ai.onnx") opset = imp.version();
  const auto [inputs, outputs] = *arities.begin();
  for (onnx::NodeProto& n : *model.mutable_graph()->mutable_node()) {  // trailing "" dropped
    if (!is_loss(n)) continue;
    while (n.input_size() > inputs) n.mutable_input()->RemoveLast();
    while (n.output_size() > outputs) n.mutable_output()->RemoveLast();
  }
  *model.add_functions() = loss_function(inputs, outputs, opset);
  return nodes;
}

}  // namespace stagecraft::plan
