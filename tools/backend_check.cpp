#include "tools/backend_check.h"

#include <onnx/onnx_pb.h>

#include <vector>

#include "runtime/format/error.h"

namespace stagecraft {

void check_backend_supports(const ir::Graph& graph, const rt::Backend& backend) {
  for (const ir::Node& node : graph.nodes()) {
    if (node.dead) continue;
    std::vector<DType> inputs, outputs;
    for (ir::ValueId v : node.inputs)
      inputs.push_back(v == ir::kNoId ? DType::kUndefined : graph.value(v).dtype);
    for (ir::ValueId v : node.outputs)
      outputs.push_back(v == ir::kNoId ? DType::kUndefined : graph.value(v).dtype);
    onnx::NodeProto proto;
    for (const onnx::AttributeProto& a : node.attributes) *proto.add_attribute() = a;
    rt::Attrs attrs(proto);
    std::string why = backend.check(rt::OpSignature{node.op_type, inputs, outputs, attrs});
    if (!why.empty())
      fail(ErrorKind::kUnsupported, "{}: {} ({} backend)", node.describe(graph), why,
           backend.name());
  }
}

}  // namespace stagecraft
