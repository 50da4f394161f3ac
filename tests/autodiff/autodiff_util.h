#pragma once
/// \file
/// Helpers shared by the autodiff tests: graphs built in code or imported from the samples, the
/// stage specs the planner would write, and the structural invariants of every backward program.

#include <onnx/onnx_pb.h>

#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/graph.h"
#include "passes/autodiff.h"

namespace stagecraft::autodiff_test {

inline constexpr int32_t kFloat = onnx::TensorProto::FLOAT;
inline constexpr int32_t kInt64 = onnx::TensorProto::INT64;

/// The path of samples/models/`name`.
std::string sample(const std::string& name);

/// An empty opset-17 model to build graphs in.
onnx::ModelProto empty_model();

/// A loss stage: x [4,6] -> Gemm (W [6,5], b [5]) -> scores -> SoftmaxCrossEntropyLoss with int64
/// labels [4] -> scalar loss.
onnx::ModelProto loss_stage_model();

/// `model` imported as stagec would (written to a temporary file first).
ir::Graph import_proto(const onnx::ModelProto& model);

/// The id of the value called `name`; fails the test when there is none.
ir::ValueId value(const ir::Graph& g, const std::string& name);

/// The whole graph as one stage: every live node, in topological order.
passes::BackwardSpec whole_graph_spec(const ir::Graph& g);

/// The node of `m` called `name`, or null.
const onnx::NodeProto* find_node(const onnx::ModelProto& m, const std::string& name);

/// Integer attribute `name` of `n`, or `fallback`.
int64_t int_attr(const onnx::NodeProto& n, std::string_view name, int64_t fallback);

/// The strings of a name list.
std::vector<std::string> names(const google::protobuf::RepeatedPtrField<std::string>& list);

/// The names of a value_info list.
std::vector<std::string> names(
    const google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>& list);

/// The static dims of a typed tensor; fails the test on a dim without a value.
std::vector<int64_t> dims(const onnx::ValueInfoProto& info);

/// The forward value a backward tensor is the gradient of ("h@grad.1" -> h), or the value itself.
std::string forward_name(const std::string& name);

/// Checks the invariants every backward program holds: it passes the ONNX checker; every node
/// input is a graph input, an initializer or an earlier node's output; every tensor is typed with
/// a static shape equal to its forward value's; gradient nodes follow the grad_ops.h arity; the
/// outputs are "W@grad" for the wanted values that get a gradient.
void check_structure(const ir::Graph& g, const passes::BackwardSpec& spec,
                     const onnx::ModelProto& m, const std::vector<ir::ValueId>& no_gradient);

/// The nodes of `m` of type `op_type`, in order.
std::vector<const onnx::NodeProto*> nodes_of(const onnx::ModelProto& m, const std::string& op_type);

/// Stage `s` of `stage_of` as the planner would describe it: seeds at the float values a later
/// stage (or the graph's outputs) reads; wanted: float values from other stages, then weights.
passes::BackwardSpec stage_spec(const ir::Graph& g, const std::vector<int>& stage_of, int s);

/// Node i of the topological order goes to stage 0 in the first half, stage 1 after.
std::vector<int> two_stages(const ir::Graph& g);

}  // namespace stagecraft::autodiff_test
