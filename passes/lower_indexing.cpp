// lower-indexing: ScatterElements and OneHot rewritten into ops the backends run, once their
// operands' shapes are static, so each gets its gradient from ops that have one.
//
// ScatterElements(data, indices, updates, axis, reduction) is the ScatterND whose index tuples
// are each indices element's own coordinates with the one on `axis` replaced by the element:
// tuples = Concat(coordinate grids (constants) and Unsqueeze(indices, -1), axis -1), then
// ScatterND(data, tuples, updates) with the same reduction (torch's scatter_ and scatter_add_,
// a one-hot by scatter, MoE routing). The grids hold numel(indices) int64 per dim: over 2^24
// elements in all (128 MiB) the node is refused naming the sizes.
//
// OneHot(indices, depth, values, axis) is Where(Equal(Unsqueeze(i, axis), Range(depth)), on,
// off) over the output's shape, where i is the indices as int64 with negative ones counted from
// the back (i + depth) and on, off are values[1], values[0]: an index outside [-depth, depth)
// matches no class and gives all off, as ONNX says (F.one_hot). depth must be a constant.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "passes/attributes.h"
#include "passes/graph_builder.h"
#include "passes/host_tensor.h"
#include "passes/passes.h"
#include "runtime/format/error.h"

namespace stagecraft::passes {
namespace {

constexpr int64_t kMaxGridElements = int64_t{1} << 24;

/// A GraphBuilder with the two steps both rewrites take.
class Builder : public GraphBuilder {
 public:
  Builder(ir::Graph& g, const std::string& prefix) : GraphBuilder(g, prefix, "lowered") {}

  /// `x` as int64 (a Cast where it is not).
  ir::ValueId as_int64(ir::ValueId x) {
    const ir::Value& v = graph().value(x);
    if (v.dtype == DType::kInt64) return x;
    return add("Cast", {x}, DType::kInt64, v.shape,
               {int_attribute("to", static_cast<int64_t>(DType::kInt64))});
  }

  /// Unsqueeze of `x` at `axis` (of the result's rank), as the graph's opset writes it.
  ir::ValueId unsqueeze(ir::ValueId x, int64_t axis) {
    const ir::Value& v = graph().value(x);
    std::vector<int64_t> shape = v.shape;
    shape.insert(shape.begin() + axis, 1);
    const DType dtype = v.dtype;
    if (graph().opset < 13)
      return add("Unsqueeze", {x}, dtype, shape, {ints_attribute("axes", {axis})});
    return add("Unsqueeze", {x, int64_constant({axis}, {1})}, dtype, shape);
  }
};

/// Whether every operand `node` reads has a static shape.
bool shapes_known(const ir::Graph& g, const ir::Node& node) {
  for (ir::ValueId v : node.inputs)
    if (v != ir::kNoId && !g.value(v).shape_known) return false;
  return true;
}

bool lower_scatter_elements(ir::Graph& g, ir::NodeId id) {
  const ir::Node node = g.node(id);
  if (node.inputs.size() != 3 || !shapes_known(g, node)) return false;
  const ir::Value& indices = g.value(node.inputs[1]);
  const auto rank = static_cast<int64_t>(indices.shape.size());
  int64_t axis = node.attr_int("axis", 0);
  if (axis < -rank || axis >= rank || rank == 0)
    refuse_rewrite(g, node, fmt::format("axis {} is out of range for rank {}", axis, rank));
  if (axis < 0) axis += rank;
  const int64_t n = ir::checked_numel(indices.shape, node.name);
  if (n * (rank - 1) > kMaxGridElements)
    refuse_rewrite(
        g, node,
        fmt::format("indices {} of rank {} would need {} int64 coordinates (at most {})",
                    ir::shape_string(indices.shape), rank, n * (rank - 1), kMaxGridElements));
  const std::vector<int64_t> shape = indices.shape;
  std::vector<int64_t> column = shape;
  column.push_back(1);
  std::vector<int64_t> tuples_shape = shape;
  tuples_shape.push_back(rank);

  const ir::ValueId output = node.outputs[0];
  g.remove_node(id);
  Builder b(g, node.name);
  std::vector<ir::ValueId> parts;
  for (int64_t d = 0; d < rank; ++d) {
    if (d == axis) {
      parts.push_back(b.unsqueeze(b.as_int64(node.inputs[1]), rank));
      continue;
    }
    // Coordinate d of every element of the indices, in row-major order.
    std::vector<int64_t> grid(static_cast<size_t>(n));
    int64_t inner = 1;
    for (int64_t k = d + 1; k < rank; ++k) inner *= shape[k];
    for (int64_t e = 0; e < n; ++e) grid[e] = (e / inner) % shape[d];
    parts.push_back(b.int64_constant(grid, column));
  }
  const ir::ValueId tuples =
      b.add("Concat", parts, DType::kInt64, tuples_shape, {int_attribute("axis", -1)});
  std::vector<onnx::AttributeProto> attrs;
  for (const auto& a : node.attributes)
    if (a.name() == "reduction") attrs.push_back(a);
  b.add("ScatterND", {node.inputs[0], tuples, node.inputs[2]}, g.value(output).dtype,
        g.value(output).shape, attrs, output);
  return true;
}

bool lower_one_hot(ir::Graph& g, ir::NodeId id) {
  const ir::Node node = g.node(id);
  if (node.inputs.size() != 3 || !shapes_known(g, node)) return false;
  const ir::Value& depth_value = g.value(node.inputs[1]);
  auto depth_tensor = HostTensor::from_value(depth_value);
  if (!depth_tensor) {
    if (depth_value.is_graph_input)
      refuse_rewrite(
          g, node,
          fmt::format("its depth '{}' is a graph input: the output's size would follow its "
                      "value (a data-dependent shape, which a static plan cannot size)",
                      depth_value.name));
    return false;  // computed: it may fold in a later round
  }
  if (depth_tensor->numel() != 1) refuse_rewrite(g, node, "its depth is not one value");
  const auto depth = static_cast<int64_t>(depth_tensor->is_real() ? depth_tensor->real_at(0)
                                                                  : depth_tensor->int_at(0));
  if (depth < 1) refuse_rewrite(g, node, fmt::format("depth {} is not positive", depth));
  const ir::Value& indices = g.value(node.inputs[0]);
  const ir::Value& values = g.value(node.inputs[2]);
  if (values.shape.size() != 1 || values.shape[0] != 2)
    refuse_rewrite(g, node,
                   fmt::format("values {} are not [off, on]", ir::shape_string(values.shape)));
  const auto rank = static_cast<int64_t>(indices.shape.size()) + 1;
  int64_t axis = node.attr_int("axis", -1);
  if (axis < -rank || axis >= rank)
    refuse_rewrite(g, node,
                   fmt::format("axis {} is out of range for the output's rank {}", axis, rank));
  if (axis < 0) axis += rank;
  const std::vector<int64_t> index_shape = indices.shape;
  std::vector<int64_t> out_shape = index_shape;
  out_shape.insert(out_shape.begin() + axis, depth);
  const DType dtype = values.dtype;

  const ir::ValueId output = node.outputs[0];
  g.remove_node(id);
  Builder b(g, node.name);
  const ir::ValueId i = b.as_int64(node.inputs[0]);
  // Negative indices from the back: i + depth where i < 0.
  const ir::ValueId zero = b.int64_constant({0}, {});
  const ir::ValueId d = b.int64_constant({depth}, {});
  const ir::ValueId negative = b.add("Less", {i, zero}, DType::kBool, index_shape);
  const ir::ValueId shifted = b.add("Add", {i, d}, DType::kInt64, index_shape);
  const ir::ValueId wrapped = b.add("Where", {negative, shifted, i}, DType::kInt64, index_shape);
  std::vector<int64_t> classes(static_cast<size_t>(depth));
  for (int64_t k = 0; k < depth; ++k) classes[k] = k;
  std::vector<int64_t> class_shape(static_cast<size_t>(rank - axis), 1);
  class_shape[0] = depth;
  const ir::ValueId hit =
      b.add("Equal", {b.unsqueeze(wrapped, axis), b.int64_constant(classes, class_shape)},
            DType::kBool, out_shape);
  const ir::ValueId on = b.add("Gather", {node.inputs[2], b.int64_constant({1}, {})}, dtype, {});
  const ir::ValueId off = b.add("Gather", {node.inputs[2], b.int64_constant({0}, {})}, dtype, {});
  b.add("Where", {hit, on, off}, dtype, out_shape, {}, output);
  return true;
}

}  // namespace

bool LowerIndexing::run(ir::Graph& graph, PassContext& context) const {
  bool changed = false;
  for (ir::NodeId id = 0; id < static_cast<ir::NodeId>(graph.num_nodes()); ++id) {
    const ir::Node& node = graph.node(id);
    if (node.dead || !node.domain.empty()) continue;
    bool lowered = false;
    if (node.op_type == "ScatterElements")
      lowered = lower_scatter_elements(graph, id);
    else if (node.op_type == "OneHot")
      lowered = lower_one_hot(graph, id);
    if (lowered) {
      changed = true;
      ++context.counters[std::string(name())];
    }
  }
  return changed;
}

}  // namespace stagecraft::passes
