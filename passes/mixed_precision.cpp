// Mixed precision (stagec --precision mixed): the stage graphs compute in bfloat16, the weights
// stay float32 masters. See passes.def "mixed-precision" and PassContext::stage_of. With
// PassContext::sixteen_bit float16 (stagec --precision fp16) the same in float16: read
// "bfloat16" below as that type (the schemas' constraints are then checked for float16).
//
// Per node, in topological order, one decision per ONNX type constraint of its float tensors:
// - bfloat16 when the node may run in 16 bits (below) and the constraint allows
//   tensor(bfloat16) in the node's opset schema: its float32 inputs of that constraint are read
//   through a Cast to bfloat16 (a weight: the 16-bit copy of the fp32 master the memory model
//   counts; a graph input: cast on entry), its float32 outputs become bfloat16.
// - float32 otherwise: inputs of that constraint already in bfloat16 are read through a Cast
//   back to float32. So the ONNX schemas (and strict shape inference, passes/infer_shapes.cpp)
//   accept every node (Resize's scales, Dropout's ratio, ops whose schema has no bfloat16).
// - Conv, whose opset-17 schema has no bfloat16, becomes Conv of our domain on 16-bit
//   X, W, B and Y (fused_sixteen_bit; cuDNN runs it on the tensor cores, the CPU widens it), and
//   the stage file spells it as the standard Conv between Casts (compiler/plan/conv_function.h);
//   MaxPool, AveragePool and GlobalAveragePool the same on 16-bit X and Y (the kernels widen
//   them: the same values as the float32 op between Casts; compiler/plan/pool_function.h).
//   In float16 (fp16 plans) the opset-17 Conv takes it as it is.
// A node runs in float32 (Casts around it) when its numerics or its contract need it:
// - the loss (nodes named "loss/..." that passes/loss.cpp appends) and any node writing a
//   graph output: the loss stagerun reports and the outputs a caller reads keep their float32.
//   A SoftmaxCrossEntropyLoss whose scores arrive in 16 bits (a language model's head, through
//   the loss pass's Reshape or Transpose into the op's layout, which then moves them in 16
//   bits) becomes our domain's SoftmaxCrossEntropyLoss (fused_sixteen_bit) reading them as they
//   are: its loss and log-probabilities stay float32 and the kernels compute in float32 from
//   the exact widening of each score, as the Cast before it did, so the loss is the same to the
//   bit; but the backward keeps the 16-bit scores, not a float32 copy (GPT-2's 8192 x 50257
//   logits: 0.8 GB against 1.6 GB), and the gradient is written in 16 bits with no CastGrad.
//   The stage file spells it as the standard op after a Cast (compiler/plan/loss_function.h);
// - BatchNormalization before opset 15, whose schema ties its statistics' type to X's: its
//   running statistics are float32 weights it writes back into. From opset 15 on (X and Y one
//   type constraint, Scale and B another, the statistics a third) X and Y are bfloat16 and the
//   rest float32 (sixteen_bit_operands);
// - ops of another domain, or without a schema, but for our fused ops that compute on 16-bit
//   activations (fused_sixteen_bit, passes.h): Attention reads Q, K and V and writes O in
//   bfloat16 (its additive mask and each query's log-sum-exp stay float32; the kernels keep the
//   softmax in float32), Gelu reads X and writes Y in bfloat16, and the 16-bit Conv above.
// LayerNormalization and Softmax run in bfloat16 tensors; their kernels keep the statistics in
// float32 (the runtime widens a 16-bit input to float32 for kernels without a 16-bit path,
// runtime/core/program.cpp), and LayerNormalization's Mean and InvStdDev stay float32
// (stash_type). Outputs whose type an attribute fixes (ConstantOfShape, RandomNormal...) keep
// it; a Cast to float32 becomes a Cast to bfloat16.
// The gradient of a Cast is the Cast back (runtime/format/grad_ops.h), so the masters get
// float32 gradients: the optimizer, the gradient sums and the all-reduce stay float32.
#include <fmt/format.h>
#include <onnx/defs/schema.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "passes/attributes.h"
#include "passes/passes.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::passes {
namespace {

/// The schemas' name of the 16-bit type, "tensor(bfloat16)" or "tensor(float16)".
std::string schema_type(DType sixteen_bit) {
  return sixteen_bit == DType::kFloat16 ? "tensor(float16)" : "tensor(bfloat16)";
}

/// ONNX's number of a float dtype (float32 or the 16-bit type).
int onnx_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return onnx::TensorProto::FLOAT16;
    case DType::kBFloat16:
      return onnx::TensorProto::BFLOAT16;
    default:
      return onnx::TensorProto::FLOAT;
  }
}

/// The type constraint (or the literal type) of formal input or output `k` of `schema`.
std::string formal_type(const std::vector<onnx::OpSchema::FormalParameter>& formals,
                        std::size_t k) {
  if (formals.empty()) return "";
  return formals[std::min(k, formals.size() - 1)].GetTypeStr();
}

/// Whether `type` (a constraint name or a literal "tensor(...)") allows `half` (a schema type
/// string of the 16-bit type) in `schema`.
bool allows(const onnx::OpSchema& schema, const std::string& type, const std::string& half) {
  if (type == half) return true;
  for (const auto& c : schema.typeConstraintParams())
    if (c.type_param_str == type)
      return std::find(c.allowed_type_strs.begin(), c.allowed_type_strs.end(), half) !=
             c.allowed_type_strs.end();
  return false;
}

/// The ops whose 16-bit form is our domain's where their schema has no 16-bit type (bfloat16
/// before opset 22): Conv and the pools.
bool own_sixteen_bit(const std::string& op) {
  return op == "Conv" || op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool";
}

class Rewriter {
 public:
  Rewriter(ir::Graph& graph, PassContext& context)
      : graph_(graph),
        context_(context),
        half_(context.sixteen_bit),
        half_type_(schema_type(context.sixteen_bit)) {}

  bool run() {
    const int64_t opset = graph_.opset;
    for (ir::NodeId id : graph_.topological_order()) {
      const ir::Node& node = graph_.node(id);
      const onnx::OpSchema* schema =
          node.domain.empty() || node.domain == "ai.onnx"
              ? onnx::OpSchemaRegistry::Schema(node.op_type, static_cast<int>(opset), "")
              : nullptr;
      // A loss on 16-bit scores: our domain's, reading them in 16 bits (its class weights, loss
      // and log-probabilities stay float32: fused_sixteen_bit).
      if (reads_sixteen_bit_scores(graph_, node) && graph_.value(node.inputs[0]).dtype == half_) {
        sixteen_bit_own(id);
        continue;
      }
      const bool may_half = schema != nullptr && !needs_float32(graph_, node);  // passes.h
      if (may_half && own_sixteen_bit(node.op_type) && !allows(*schema, "T", half_type_)) {
        sixteen_bit_own(id);
        continue;
      }
      if (const SixteenBitOperands* fused = sixteen_bit_operands(graph_, node);
          fused && !needs_float32(graph_, node)) {
        retype_fused(id, *fused);
        continue;
      }
      if (node.op_type == "Cast" && may_half) {
        retype_cast(id);
        continue;
      }
      // Each constraint's decision: bfloat16 when some output of it is float32 (a value this
      // node makes) or some input of it is bfloat16 already, and the schema allows it.
      std::map<std::string, bool> to_half;
      std::set<std::string> output_types;
      if (schema) {
        for (std::size_t k = 0; k < node.outputs.size(); ++k) {
          if (node.outputs[k] == ir::kNoId) continue;
          const std::string type = formal_type(schema->outputs(), k);
          output_types.insert(type);
          if (graph_.value(node.outputs[k]).dtype == DType::kFloat32)
            to_half[type] = may_half && allows(*schema, type, half_type_);
        }
        for (std::size_t k = 0; k < node.inputs.size(); ++k) {
          if (node.inputs[k] == ir::kNoId) continue;
          const std::string type = formal_type(schema->inputs(), k);
          if (graph_.value(node.inputs[k]).dtype == half_ && !to_half.count(type))
            to_half[type] = may_half && allows(*schema, type, half_type_);
        }
      }
      // From here on Casts are added: `node` may move, so it is looked up again each time.
      const std::size_t num_inputs = node.inputs.size(), num_outputs = node.outputs.size();
      cast_inputs(id, [&](std::size_t k) {
        auto it = schema ? to_half.find(formal_type(schema->inputs(), k)) : to_half.end();
        return it != to_half.end() && it->second;
      });
      for (std::size_t k = 0; k < num_outputs; ++k) {
        const ir::ValueId out = graph_.node(id).outputs[k];
        if (out == ir::kNoId || graph_.value(out).dtype != DType::kFloat32) continue;
        if (!schema) continue;
        auto it = to_half.find(formal_type(schema->outputs(), k));
        // An output whose constraint no input carries has its type from an attribute
        // (LayerNormalization's statistics: stash_type; ConstantOfShape's value): kept.
        bool bound_by_input = false;
        for (std::size_t i = 0; i < num_inputs; ++i)
          bound_by_input |= graph_.node(id).inputs[i] != ir::kNoId &&
                            formal_type(schema->inputs(), i) == formal_type(schema->outputs(), k);
        if (it != to_half.end() && it->second && bound_by_input) {
          graph_.value(out).dtype = half_;
          ++changed_;
        }
      }
    }
    context_.counters["mixed-precision"] += changed_;
    return changed_ > 0;
  }

 private:
  int stage(ir::NodeId id) const {
    return context_.stage_of && static_cast<std::size_t>(id) < context_.stage_of->size()
               ? (*context_.stage_of)[id]
               : 0;
  }

  /// One of our fused ops: the operands `fused` names in 16 bits, its other float ones float32.
  void retype_fused(ir::NodeId id, const SixteenBitOperands& fused) {
    cast_inputs(id, [&](std::size_t k) { return fused.input(k); });
    for (std::size_t k = 0; k < graph_.node(id).outputs.size(); ++k) {
      const ir::ValueId out = graph_.node(id).outputs[k];
      if (out == ir::kNoId || !fused.output(k) || graph_.value(out).dtype != DType::kFloat32)
        continue;
      graph_.value(out).dtype = half_;
      ++changed_;
    }
  }

  /// Reads each float32 or 16-bit input k of node `id` as the 16-bit type where `half(k)`,
  /// else as float32, through a Cast where its type differs. Casts are added, so the node is
  /// looked up again for each input.
  template <typename Half>
  void cast_inputs(ir::NodeId id, Half half) {
    for (std::size_t k = 0; k < graph_.node(id).inputs.size(); ++k) {
      const ir::ValueId in = graph_.node(id).inputs[k];
      if (in == ir::kNoId) continue;
      const DType dtype = graph_.value(in).dtype;
      if (dtype != DType::kFloat32 && dtype != half_) continue;
      const DType wanted = half(k) ? half_ : DType::kFloat32;
      if (dtype != wanted) set_input(id, k, cast_of(in, wanted, stage(id)));
    }
  }

  /// A Conv whose opset has no 16-bit Conv (bfloat16 before opset 22) becomes our domain's Conv
  /// (fused_sixteen_bit), which the kernels run on 16-bit X, W, B and Y; the stage file's
  /// function ai.stagecraft.Conv spells it as the standard Conv between Casts
  /// (compiler/plan/conv_function.h). So do the pools (own_sixteen_bit: X and Y 16-bit, the
  /// kernels widen them; compiler/plan/pool_function.h), whose float32 copies of X and Y the
  /// backward kept before (a ResNet's stem: 0.8 GiB at batch 64 x 224); and a loss on 16-bit
  /// scores (reads_sixteen_bit_scores).
  void sixteen_bit_own(ir::NodeId id) {
    graph_.node(id).domain = std::string(grad::kGradDomain);
    graph_.opset_imports[std::string(grad::kGradDomain)] = grad::kGradDomainVersion;
    retype_fused(id, *fused_sixteen_bit(graph_.node(id)));
  }

  /// A Cast to float32 in a node that runs in 16 bits becomes a Cast to the 16-bit type.
  void retype_cast(ir::NodeId id) {
    ir::Node& node = graph_.node(id);
    const ir::ValueId out = node.outputs[0];
    if (graph_.value(out).dtype != DType::kFloat32) return;
    for (auto& a : node.attributes)
      if (a.name() == "to") a.set_i(onnx_type(half_));
    graph_.value(out).dtype = half_;
    ++changed_;
  }

  void set_input(ir::NodeId id, std::size_t k, ir::ValueId to) {
    ir::Node& node = graph_.node(id);
    auto& readers = graph_.value(node.inputs[k]).consumers;
    readers.erase(std::find(readers.begin(), readers.end(), id));
    node.inputs[k] = to;
    graph_.value(to).consumers.push_back(id);
  }

  /// `value` as `dtype` in stage `stage_index`: one Cast per value, dtype and stage, in the
  /// stage of its readers (a weight read by two stages is cast in each: each holds its master).
  ir::ValueId cast_of(ir::ValueId value, DType dtype, int stage_index) {
    const auto key = std::make_tuple(value, dtype, stage_index);
    if (auto it = casts_.find(key); it != casts_.end()) return it->second;
    const ir::Value& from = graph_.value(value);
    const char* suffix =
        dtype == DType::kBFloat16 ? "bf16" : dtype == DType::kFloat16 ? "fp16" : "fp32";
    const std::string base = fmt::format("{}@{}", from.name, suffix);
    std::string name = base;
    for (int n = 1; graph_.find_value(name); ++n) name = fmt::format("{}.{}", base, n);
    ir::Value v;
    v.name = name;
    v.dtype = dtype;
    v.shape = from.shape;
    v.shape_known = from.shape_known;
    const ir::ValueId out = graph_.add_value(std::move(v));
    ir::Node cast;
    cast.name = "mixed/Cast(" + name + ")";
    cast.op_type = "Cast";
    cast.inputs = {value};
    cast.outputs = {out};
    cast.attributes.push_back(int_attribute("to", onnx_type(dtype)));
    const ir::NodeId id = graph_.add_node(std::move(cast));
    if (context_.stage_of) {
      if (context_.stage_of->size() <= static_cast<std::size_t>(id))
        context_.stage_of->resize(static_cast<std::size_t>(id) + 1, -1);
      (*context_.stage_of)[id] = stage_index;
    }
    casts_.emplace(key, out);
    ++changed_;
    return out;
  }

  ir::Graph& graph_;
  PassContext& context_;
  const DType half_;             ///< The 16-bit type: bfloat16 or float16.
  const std::string half_type_;  ///< Its schema type string.
  std::map<std::tuple<ir::ValueId, DType, int>, ir::ValueId> casts_;
  int64_t changed_ = 0;
};

}  // namespace

bool MixedPrecision::run(ir::Graph& graph, PassContext& context) const {
  return Rewriter(graph, context).run();
}

bool SixteenBitOperands::input(size_t k) const {
  return std::find(inputs.begin(), inputs.end(), k) != inputs.end();
}

bool SixteenBitOperands::output(size_t k) const {
  return std::find(outputs.begin(), outputs.end(), k) != outputs.end();
}

const SixteenBitOperands* fused_sixteen_bit(const ir::Node& node) {
  static const SixteenBitOperands attention{{0, 1, 2}, {0}}, gelu{{0}, {0}}, conv{{0, 1, 2}, {0}},
      loss{{0}, {}}, pool{{0}, {0}};
  if (node.domain != grad::kGradDomain) return nullptr;
  if (node.op_type == "Attention") return &attention;
  if (node.op_type == "Gelu") return &gelu;
  if (node.op_type == "Conv") return &conv;
  if (node.op_type == "SoftmaxCrossEntropyLoss") return &loss;
  if (node.op_type == "MaxPool" || node.op_type == "AveragePool" ||
      node.op_type == "GlobalAveragePool")
    return &pool;  // Y; MaxPool's Indices are int64
  return nullptr;
}

bool reads_sixteen_bit_scores(const ir::Graph& graph, const ir::Node& node) {
  if (node.op_type != "SoftmaxCrossEntropyLoss" || node.inputs.empty() ||
      node.inputs[0] == ir::kNoId)
    return false;
  if (node.domain == grad::kGradDomain) return true;
  if ((!node.domain.empty() && node.domain != "ai.onnx") || graph.opset < 13) return false;
  const ir::ValueId scores = node.inputs[0];
  const ir::NodeId producer = graph.value(scores).producer;
  return producer != ir::kNoId && !needs_float32(graph, graph.node(producer));
}

const SixteenBitOperands* sixteen_bit_operands(const ir::Graph& graph, const ir::Node& node) {
  static const SixteenBitOperands batch_norm{{0}, {0}};
  if (node.op_type == "BatchNormalization" && (node.domain.empty() || node.domain == "ai.onnx") &&
      graph.opset >= 15)
    return &batch_norm;
  return fused_sixteen_bit(node);
}

namespace {

/// The loss pass's Reshape or Transpose of the scores into SoftmaxCrossEntropyLoss's layout
/// (passes/loss.cpp), read by losses only, of scores a node running in 16 bits makes: it moves
/// them in 16 bits as they are. (Scores kept in float32, a graph output's, stay float32.)
bool loss_scores_view(const ir::Graph& graph, const ir::Node& node) {
  if ((node.op_type != "Reshape" && node.op_type != "Transpose") || node.outputs.empty() ||
      node.outputs[0] == ir::kNoId || node.inputs.empty() || node.inputs[0] == ir::kNoId)
    return false;
  const ir::NodeId source = graph.value(node.inputs[0]).producer;
  if (source == ir::kNoId || needs_float32(graph, graph.node(source))) return false;
  const ir::Value& out = graph.value(node.outputs[0]);
  if (out.is_graph_output || out.consumers.empty()) return false;
  return std::all_of(out.consumers.begin(), out.consumers.end(), [&](ir::NodeId r) {
    const ir::Node& reader = graph.node(r);
    return reader.op_type == "SoftmaxCrossEntropyLoss" && !reader.inputs.empty() &&
           reader.inputs[0] == node.outputs[0];
  });
}

}  // namespace

bool needs_float32(const ir::Graph& graph, const ir::Node& node) {
  if (!node.domain.empty() && node.domain != "ai.onnx" && !fused_sixteen_bit(node)) return true;
  if (node.op_type == "BatchNormalization" && !sixteen_bit_operands(graph, node)) return true;
  if (node.name.rfind("loss/", 0) == 0 && !loss_scores_view(graph, node)) return true;
  for (ir::ValueId out : node.outputs)
    if (out != ir::kNoId && graph.value(out).is_graph_output) return true;
  return false;
}

}  // namespace stagecraft::passes
