// The model-local function that keeps a stage file with fused Attention nodes plain ONNX
// (attention_function.h). The body uses only ops stagecraft's importer also takes (no CastLike,
// no LessOrEqual), so a stage file inlined by any tool can be read back by stagec too.
#include "compiler/plan/attention_function.h"

#include <initializer_list>
#include <limits>
#include <utility>
#include <set>
#include <string>

#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::plan {
namespace {

constexpr std::string_view kAttention = "Attention";

bool is_attention(const onnx::NodeProto& n) {
  return n.op_type() == kAttention && n.domain() == grad::kGradDomain;
}

/// Writes the body's nodes one line each, so the function reads like the formula it computes.
class Body {
 public:
  explicit Body(onnx::FunctionProto& f) : f_(f) {}

  onnx::NodeProto& node(const char* op, std::initializer_list<const char*> in, const char* out) {
    onnx::NodeProto* n = f_.add_node();
    n->set_op_type(op);
    n->set_name(std::string("Attention/") + out);
    for (const char* name : in) n->add_input(name);
    n->add_output(out);
    return *n;
  }
  /// A Constant whose value is the calling node's attribute `ref` (a float or an int).
  void attribute_constant(const char* out, const char* ref,
                          onnx::AttributeProto::AttributeType type) {
    onnx::AttributeProto* a = node("Constant", {}, out).add_attribute();
    a->set_name(type == onnx::AttributeProto::FLOAT ? "value_float" : "value_int");
    a->set_type(type);
    a->set_ref_attr_name(ref);
  }
  /// `out` = Cast(`in`) to element type `to`.
  void cast(const char* in, const char* out, int to) {
    attr(node("Cast", {in}, out), "to", onnx::AttributeProto::INT).set_i(to);
  }
  /// A Constant int64 scalar.
  void int_constant(const char* out, int64_t value) {
    onnx::TensorProto* t =
        attr(node("Constant", {}, out), "value", onnx::AttributeProto::TENSOR).mutable_t();
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_int64_data(value);
  }
  static onnx::AttributeProto& attr(onnx::NodeProto& n, const char* name,
                                    onnx::AttributeProto::AttributeType type) {
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(type);
    return *a;
  }

 private:
  onnx::FunctionProto& f_;
};

/// The body for nodes of `arity` inputs (3 or 4), Q of `rank` (0: ranks differ) and Q, K, V, O
/// of element type `storage` (FLOAT, or a 16-bit type read through Casts to float32).
onnx::FunctionProto attention_function(int arity, int rank, int storage, int64_t opset) {
  onnx::FunctionProto f;
  f.set_name(std::string(kAttention));
  f.set_domain(std::string(grad::kGradDomain));
  f.set_doc_string(
      "stagecraft's fused attention (runtime/ops/attention_shape.h) in standard ops: "
      "softmax(scale * Q K^T, causal top-left, + mask) V and each query's log-sum-exp");
  for (const char* in : {"Q", "K", "V", "mask"})
    if (f.input_size() < arity) f.add_input(in);
  f.add_output("O");
  f.add_output("lse");
  f.add_attribute("scale");
  f.add_attribute("causal");
  // Whether the backward gives the mask a gradient (a learned position bias): the forward's
  // value does not depend on it.
  f.add_attribute("mask_gradient");
  onnx::OperatorSetIdProto* imp = f.add_opset_import();
  imp->set_domain("");
  imp->set_version(opset);
  Body b(f);
  // A 16-bit node's Q, K and V are read in float32 (as its kernels compute), O written back.
  const bool cast = storage != onnx::TensorProto::FLOAT;
  const char* q = cast ? "Q_float" : "Q";
  const char* k = cast ? "K_float" : "K";
  const char* v = cast ? "V_float" : "V";
  if (cast)
    for (auto [from, to] : {std::pair{"Q", q}, {"K", k}, {"V", v}})
      b.cast(from, to, onnx::TensorProto::FLOAT);
  // scores = MatMul(Q, K^T) * scale.
  if (rank > 0) {
    onnx::AttributeProto& perm =
        Body::attr(b.node("Transpose", {k}, "Kt"), "perm", onnx::AttributeProto::INTS);
    for (int d = 0; d < rank; ++d) perm.add_ints(d < rank - 2 ? d : 2 * rank - 3 - d);
  } else {
    Body::attr(b.node("Einsum", {k}, "Kt"), "equation", onnx::AttributeProto::STRING)
        .set_s("...kd->...dk");
  }
  b.node("MatMul", {q, "Kt"}, "products");
  b.attribute_constant("scale", "scale", onnx::AttributeProto::FLOAT);
  b.node("Mul", {"products", "scale"}, "scaled");
  // causal: key j of query i is hidden where j > i (top-left aligned, as the kernels). The
  // running counts along the two axes of a [Tq, Tk] plane of ones are i + 1 and j + 1: sized by
  // the scores' own shape, so one body serves every Tq and Tk, and ONNX's inference follows
  // the shapes through it (through a Range's length it cannot).
  // Before opset 15 (no Shape start) the ones span the scores' whole shape.
  onnx::NodeProto& plane_shape = b.node("Shape", {"scaled"}, "plane_shape");
  if (opset >= 15) Body::attr(plane_shape, "start", onnx::AttributeProto::INT).set_i(-2);
  onnx::TensorProto* one = Body::attr(b.node("ConstantOfShape", {"plane_shape"}, "ones"), "value",
                                      onnx::AttributeProto::TENSOR)
                               .mutable_t();
  one->set_data_type(onnx::TensorProto::INT64);
  one->add_dims(1);
  one->add_int64_data(1);
  b.int_constant("last", -1);
  b.int_constant("second_last", -2);
  b.node("CumSum", {"ones", "last"}, "key_count");
  b.node("CumSum", {"ones", "second_last"}, "query_count");
  b.node("Greater", {"key_count", "query_count"}, "later");
  b.int_constant("one", 1);
  b.attribute_constant("causal", "causal", onnx::AttributeProto::INT);
  b.node("Equal", {"causal", "one"}, "is_causal");
  b.node("And", {"later", "is_causal"}, "hidden");
  Body::attr(b.node("Constant", {}, "minus_inf"), "value_float", onnx::AttributeProto::FLOAT)
      .set_f(-std::numeric_limits<float>::infinity());
  b.node("Where", {"hidden", "minus_inf", "scaled"}, arity > 3 ? "unmasked" : "scores");
  if (arity > 3) b.node("Add", {"unmasked", "mask"}, "scores");
  // O = MatMul(Softmax(scores), V); lse = ReduceLogSumExp(scores) over the keys.
  Body::attr(b.node("Softmax", {"scores"}, "P"), "axis", onnx::AttributeProto::INT).set_i(-1);
  b.node("MatMul", {"P", v}, cast ? "O_float" : "O");
  if (cast) b.cast("O_float", "O", storage);
  onnx::NodeProto& lse = b.node("ReduceLogSumExp", {"scores"}, "lse");
  Body::attr(lse, "axes", onnx::AttributeProto::INTS).add_ints(-1);
  Body::attr(lse, "keepdims", onnx::AttributeProto::INT).set_i(0);
  return f;
}

/// The rank of value `name` as the graph records it (value_info, inputs, outputs,
/// initializers), or -1.
int recorded_rank(const onnx::GraphProto& g, const std::string& name) {
  for (const auto* list : {&g.value_info(), &g.input(), &g.output()})
    for (const onnx::ValueInfoProto& vi : *list)
      if (vi.name() == name && vi.type().tensor_type().has_shape())
        return vi.type().tensor_type().shape().dim_size();
  for (const onnx::TensorProto& t : g.initializer())
    if (t.name() == name) return t.dims_size();
  return -1;
}

/// The element type of value `name` as the graph records it, or UNDEFINED.
int recorded_type(const onnx::GraphProto& g, const std::string& name) {
  for (const auto* list : {&g.value_info(), &g.input(), &g.output()})
    for (const onnx::ValueInfoProto& vi : *list)
      if (vi.name() == name) return vi.type().tensor_type().elem_type();
  for (const onnx::TensorProto& t : g.initializer())
    if (t.name() == name) return t.data_type();
  return onnx::TensorProto::UNDEFINED;
}

/// A name no value or node of `g` has, from `base`.
std::string unused_name(const onnx::GraphProto& g, const std::string& base) {
  std::set<std::string> taken;
  for (const onnx::NodeProto& n : g.node()) {
    taken.insert(n.input().begin(), n.input().end());
    taken.insert(n.output().begin(), n.output().end());
  }
  for (const onnx::TensorProto& t : g.initializer()) taken.insert(t.name());
  for (const onnx::ValueInfoProto& vi : g.input()) taken.insert(vi.name());
  std::string name = base;
  for (int k = 1; taken.count(name); ++k) name = base + "_" + std::to_string(k);
  return name;
}

/// Gives each mask-less Attention node of `g` a float32 scalar zero as its mask.
void add_zero_masks(onnx::GraphProto& g) {
  const std::string name = unused_name(g, std::string(kAttentionZeroMask));
  onnx::TensorProto* zero = g.add_initializer();
  zero->set_name(name);
  zero->set_data_type(onnx::TensorProto::FLOAT);
  zero->set_raw_data(std::string(sizeof(float), '\0'));
  for (onnx::NodeProto& n : *g.mutable_node()) {
    if (!is_attention(n) || n.input_size() > 3) continue;
    n.add_input(name);
  }
}

}  // namespace

int add_attention_function(onnx::ModelProto& model) {
  onnx::GraphProto& g = *model.mutable_graph();
  std::set<int> arities, ranks;
  int nodes = 0;
  for (const onnx::NodeProto& n : g.node()) {
    if (!is_attention(n)) continue;
    ++nodes;
    // A 4th input "" is no mask: the node is mask-less (ONNX's spelling of an absent input).
    arities.insert(n.input_size() > 3 && !n.input(3).empty() ? 4 : 3);
    ranks.insert(recorded_rank(g, n.input(0)));
  }
  if (nodes == 0) return 0;
  const int64_t opset = default_opset(model);
  if (opset < 11)
    fail(ErrorKind::kUnsupported,
         "graph '{}': fused Attention nodes at opset {}: their stage file's standard-op function "
         "needs opset 11 or later (CumSum); re-export the model at opset 11+ or plan it without "
         "--fuse-attention",
         g.name(), opset);
  for (onnx::NodeProto& n : *g.mutable_node())
    if (is_attention(n) && n.input_size() > 3 && n.input(3).empty())
      n.mutable_input()->RemoveLast();
  if (arities.size() > 1) add_zero_masks(g);
  const int rank = ranks.size() == 1 && *ranks.begin() >= 3 ? *ranks.begin() : 0;
  *model.add_functions() =
      attention_function(*arities.rbegin(), rank, function_storage_type(model, kAttention), opset);
  return nodes;
}

int function_storage_type(const onnx::ModelProto& model, std::string_view op_type) {
  const onnx::GraphProto& g = model.graph();
  const onnx::NodeProto* first = nullptr;
  int type = onnx::TensorProto::FLOAT;
  for (const onnx::NodeProto& n : g.node()) {
    if (n.op_type() != op_type || n.domain() != grad::kGradDomain || n.input_size() == 0) continue;
    int t = recorded_type(g, n.input(0));
    if (t == onnx::TensorProto::UNDEFINED) t = onnx::TensorProto::FLOAT;
    if (t != onnx::TensorProto::FLOAT && t != onnx::TensorProto::BFLOAT16 &&
        t != onnx::TensorProto::FLOAT16)
      fail(ErrorKind::kInternal, "graph '{}': {} node '{}' reads {} of element type {}", g.name(),
           op_type, n.name(), n.input(0), t);
    if (first != nullptr && t != type)
      fail(ErrorKind::kUnsupported,
           "graph '{}': {} nodes of two types in one stage file ('{}' reads element type {}, '{}' "
           "{}); ONNX 1.12 functions have no overloads, so their standard-op body cannot serve "
           "both; plan with --precision fp32, or with another cut so the two fall on different "
           "stages",
           g.name(), op_type, first->name(), type, n.name(), t);
    if (first == nullptr) first = &n;
    type = t;
  }
  return type;
}

int64_t default_opset(const onnx::ModelProto& model) {
  int64_t opset = -1;
  for (const onnx::OperatorSetIdProto& imp : model.opset_import())
    if (imp.domain().empty() || imp.domain() == "ai.onnx") opset = imp.version();
  return opset;
}

onnx::FunctionProto op_between_casts(
    const std::string& op, const std::string& doc, const std::vector<CastOperand>& inputs,
    const std::vector<CastOperand>& outputs,
    const std::vector<std::pair<const char*, onnx::AttributeProto::AttributeType>>& attributes,
    int storage, int64_t opset) {
  onnx::FunctionProto f;
  f.set_name(op);
  f.set_domain(std::string(grad::kGradDomain));
  f.set_doc_string(doc);
  for (const CastOperand& in : inputs) f.add_input(in.name);
  for (const CastOperand& out : outputs) f.add_output(out.name);
  for (const auto& [name, type] : attributes) f.add_attribute(name);
  onnx::OperatorSetIdProto* imp = f.add_opset_import();
  imp->set_domain("");
  imp->set_version(opset);
  auto node = [&](const std::string& type, const std::string& out) {
    onnx::NodeProto* n = f.add_node();
    n->set_op_type(type);
    n->set_name(op + "/" + out);
    return n;
  };
  auto cast = [&](const std::string& in, const std::string& out, int to) {
    onnx::NodeProto* n = node("Cast", out);
    n->add_input(in);
    n->add_output(out);
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name("to");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(to);
  };
  auto value = [](const CastOperand& o) { return o.cast ? o.name + "_float" : o.name; };
  for (const CastOperand& in : inputs)
    if (in.cast) cast(in.name, value(in), onnx::TensorProto::FLOAT);
  onnx::NodeProto* body = node(op, outputs.empty() ? op : value(outputs.front()));
  for (const CastOperand& in : inputs) body->add_input(value(in));
  for (const CastOperand& out : outputs) body->add_output(value(out));
  for (const auto& [name, type] : attributes) {
    onnx::AttributeProto* a = body->add_attribute();
    a->set_name(name);
    a->set_ref_attr_name(name);
    a->set_type(type);
  }
  for (const CastOperand& out : outputs)
    if (out.cast) cast(value(out), out.name, storage);
  return f;
}

}  // namespace stagecraft::plan
