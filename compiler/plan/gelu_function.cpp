// The model-local function that keeps a stage file with fused Gelu nodes plain ONNX
// (gelu_function.h), from ops every ONNX runtime and stagecraft's importer take.
#include "compiler/plan/gelu_function.h"

#include <initializer_list>
#include <set>
#include <string>

#include "compiler/plan/attention_function.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/gelu_element.h"

namespace stagecraft::plan {
namespace {

bool is_gelu(const onnx::NodeProto& n) {
  return n.op_type() == "Gelu" && n.domain() == grad::kGradDomain;
}

/// The node's `approximate`, "none" when absent (ONNX's default).
std::string approximate(const onnx::NodeProto& n) {
  for (const onnx::AttributeProto& a : n.attribute())
    if (a.name() == "approximate") return a.s();
  return "none";
}

/// The body for the `tanh` or erf form, X and Y of element type `storage` (FLOAT, or a 16-bit
/// type read and written through Casts).
onnx::FunctionProto gelu_function(bool tanh, int storage, int64_t opset) {
  onnx::FunctionProto f;
  f.set_name("Gelu");
  f.set_domain(std::string(grad::kGradDomain));
  f.set_doc_string(tanh ? "stagecraft's fused Gelu, approximate=tanh, in standard ops"
                        : "stagecraft's fused Gelu, approximate=none, in standard ops");
  f.add_input("X");
  f.add_output("Y");
  f.add_attribute("approximate");
  onnx::OperatorSetIdProto* imp = f.add_opset_import();
  imp->set_domain("");
  imp->set_version(opset);
  auto node = [&](const char* op, std::initializer_list<const char*> in, const char* out) {
    onnx::NodeProto* n = f.add_node();
    n->set_op_type(op);
    n->set_name(std::string("Gelu/") + out);
    for (const char* name : in) n->add_input(name);
    n->add_output(out);
    return n;
  };
  auto constant = [&](const char* out, double value) {
    onnx::AttributeProto* a = node("Constant", {}, out)->add_attribute();
    a->set_name("value_float");
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(static_cast<float>(value));
  };
  auto cast = [&](const char* in, const char* out, int to) {
    onnx::AttributeProto* a = node("Cast", {in}, out)->add_attribute();
    a->set_name("to");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(to);
  };
  // A 16-bit node's X is read in float32 (as its kernel computes) and Y written back.
  const bool typed = storage != onnx::TensorProto::FLOAT;
  const char* x = typed ? "X_float" : "X";
  if (typed) cast("X", x, onnx::TensorProto::FLOAT);
  constant("one", 1.0);
  constant("half", 0.5);
  if (tanh) {
    constant("kappa", rt::ops::kGeluKappa);
    constant("beta", rt::ops::kGeluSqrt2OverPi);
    node("Mul", {x, x}, "square");
    node("Mul", {"square", x}, "cube");
    node("Mul", {"cube", "kappa"}, "term");
    node("Add", {x, "term"}, "sum");
    node("Mul", {"sum", "beta"}, "inner");
    node("Tanh", {"inner"}, "curve");
  } else {
    constant("sqrt_half", rt::ops::kGeluSqrtHalf);
    node("Mul", {x, "sqrt_half"}, "scaled");
    node("Erf", {"scaled"}, "curve");
  }
  node("Add", {"curve", "one"}, "plus_one");
  node("Mul", {x, "plus_one"}, "product");
  node("Mul", {"product", "half"}, typed ? "Y_float" : "Y");
  if (typed) cast("Y_float", "Y", storage);
  return f;
}

}  // namespace

int add_gelu_function(onnx::ModelProto& model) {
  std::set<std::string> forms;
  int nodes = 0;
  for (const onnx::NodeProto& n : model.graph().node()) {
    if (!is_gelu(n)) continue;
    ++nodes;
    forms.insert(approximate(n));
  }
  if (nodes == 0) return 0;
  for (const std::string& form : forms)
    if (form != "none" && form != "tanh")
      fail(ErrorKind::kInternal, "graph '{}': a Gelu node with approximate='{}'",
           model.graph().name(), form);
  if (forms.size() > 1)
    fail(ErrorKind::kInternal,
         "graph '{}': Gelu nodes of both forms in one file; its Gelu function has one body",
         model.graph().name());
  *model.add_functions() = gelu_function(
      *forms.begin() == "tanh", function_storage_type(model, "Gelu"), default_opset(model));
  return nodes;
}

}  // namespace stagecraft::plan
