#pragma once
/// \file
/// stagecraft's graph IR: a DAG of ONNX-style nodes over values (tensors) with a dtype and a
/// static shape. Built from an ONNX model once every symbolic dimension is bound, so shapes are
/// concrete numbers everywhere the partitioner and cost models look.
///
/// Values and nodes live in vectors and are named by dense ids. Passes mark nodes dead with
/// `remove_node` and call `compact()` at the end, which renumbers everything.

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "compiler/ir/weights.h"
#include "runtime/format/dtype.h"

namespace stagecraft::ir {

using ValueId = int32_t;
using NodeId = int32_t;
inline constexpr int32_t kNoId = -1;

/// Number of elements of a static shape; throws `Error(kShape)` on a negative dim or when the
/// count overflows int64.
int64_t checked_numel(const std::vector<int64_t>& shape, std::string_view what);

/// "[8,3,224,224]".
std::string shape_string(const std::vector<int64_t>& shape);

/// One tensor: a graph input, an initializer (weight or folded constant) or a node output.
struct Value {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;  ///< Meaningful only when `shape_known`.
  bool shape_known = false;    ///< Rank and every dim are known (all dims >= 0).
  NodeId producer = kNoId;     ///< The node that writes it; kNoId for inputs and initializers.
  std::vector<NodeId> consumers;  ///< Nodes that read it (a node reading it twice appears twice).
  std::shared_ptr<const WeightData> initializer;  ///< Set for weights and folded constants.
  /// A floating-point initializer of the model file: a weight that training may update. Folding
  /// never consumes weights, so they stay in the graph as the user's exporter wrote them.
  bool is_weight = false;
  /// A weight training leaves as it is (stagec --freeze): no gradient, no optimizer state.
  bool frozen = false;
  /// Rows (along axis 0) of an embedding table that nn.Embedding's padding_idx keeps: the
  /// Gathers that read this table pass them no gradient (GatherGrad's kPaddingRowsAttr), so
  /// they stay as they are unless another use of the weight (a tied output head) trains them.
  std::vector<int64_t> padding_rows;
  bool is_graph_input = false;
  bool is_graph_output = false;

  bool is_initializer() const { return initializer != nullptr; }
  int64_t numel() const;  ///< Requires `shape_known`.
  int64_t bytes() const;  ///< numel * element size.
};

/// One operator application. Attributes stay ONNX `AttributeProto`s so that a stage file
/// written back out is exactly what the user's exporter produced.
struct Node {
  std::string name;
  std::string op_type;
  std::string domain;             ///< "" for the default ONNX domain.
  std::vector<ValueId> inputs;    ///< kNoId marks an omitted optional input.
  std::vector<ValueId> outputs;   ///< kNoId marks an omitted optional output.
  std::vector<onnx::AttributeProto> attributes;
  bool dead = false;

  const onnx::AttributeProto* attribute(std::string_view name) const;
  int64_t attr_int(std::string_view name, int64_t fallback) const;
  float attr_float(std::string_view name, float fallback) const;
  std::vector<int64_t> attr_ints(std::string_view name) const;
  std::string attr_string(std::string_view name, std::string_view fallback) const;
  /// "node 'name' (Op)" for messages; uses the first output name when the node has no name.
  std::string describe(const class Graph& graph) const;
};

/// The model: nodes, values, weights, graph inputs and outputs, and model metadata.
class Graph {
 public:
  std::string name;
  std::string source_path;       ///< The model file it came from, for messages.
  std::string producer_name;
  int64_t ir_version = 8;
  int64_t opset = 17;            ///< Opset of the default domain.
  std::map<std::string, int64_t> opset_imports;  ///< Every domain the model imports.

  std::vector<ValueId> inputs;   ///< Graph inputs that are not initializers, in model order.
  std::vector<ValueId> outputs;  ///< Graph outputs in model order.

  /// Adds a value; its name must be new. Returns its id.
  ValueId add_value(Value value);
  /// Adds a node and links producers/consumers. Returns its id.
  NodeId add_node(Node node);

  Value& value(ValueId id) { return values_.at(static_cast<std::size_t>(id)); }
  const Value& value(ValueId id) const { return values_.at(static_cast<std::size_t>(id)); }
  Node& node(NodeId id) { return nodes_.at(static_cast<std::size_t>(id)); }
  const Node& node(NodeId id) const { return nodes_.at(static_cast<std::size_t>(id)); }
  std::size_t num_values() const { return values_.size(); }
  std::size_t num_nodes() const { return nodes_.size(); }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Value>& values() const { return values_; }

  /// The id of the value called `name`, or nullopt.
  std::optional<ValueId> find_value(std::string_view name) const;
  /// `base` when no live node is called so, else base#2, base#3, ... (as import makes repeated
  /// names unique): plans name nodes, so a pass that adds one names it with this.
  std::string fresh_node_name(const std::string& base) const;

  /// Marks a node dead and unlinks it from its inputs' consumer lists; its outputs keep their
  /// ids until `compact()`.
  void remove_node(NodeId id);
  /// Removes node `id`'s read of its input k (the consumer entry goes, the slot becomes kNoId;
  /// omitted inputs at the end are dropped).
  void drop_input(NodeId id, std::size_t k);
  /// Makes every reader of `from` (nodes and graph outputs) read `to` instead.
  void replace_all_uses(ValueId from, ValueId to);
  /// Drops dead nodes and values nothing refers to; renumbers ids densely.
  void compact();

  /// Live nodes in an order where every producer comes before its consumers (stable: ties keep
  /// model order). Throws `Error(kModel)` naming a node on the cycle when there is one.
  std::vector<NodeId> topological_order() const;

  /// Number of live nodes.
  std::size_t live_nodes() const;

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, ValueId> by_name_;
};

}  // namespace stagecraft::ir
