#pragma once
/// \file
/// Adding the nodes of one rewrite to a graph (passes/lower_einsum.cpp, lower_indexing.cpp):
/// values and nodes named after the node they replace ("PREFIX/TAG_WHAT_K" values, "PREFIX/OP_K"
/// nodes, K counting within the rewrite), int64 constants as initializers, every new value with
/// its type and static shape.

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "compiler/ir/graph.h"
#include "runtime/format/error.h"

namespace stagecraft::passes {

/// `Error(kUnsupported)` for a node a rewrite cannot take: "node 'name' (Op): why" (the import
/// puts the model's path first).
[[noreturn]] inline void refuse_rewrite(const ir::Graph& g, const ir::Node& node,
                                        const std::string& why) {
  fail(ErrorKind::kUnsupported, "{}: {}", node.describe(g), why);
}

class GraphBuilder {
 public:
  /// `prefix`: the replaced node's name; `tag`: what the rewrite is ("einsum", "lowered").
  GraphBuilder(ir::Graph& g, std::string prefix, std::string tag)
      : g_(g), prefix_(std::move(prefix)), tag_(std::move(tag)) {}

  ir::Graph& graph() { return g_; }

  /// An int64 initializer of `values` and `shape`.
  ir::ValueId int64_constant(const std::vector<int64_t>& values, std::vector<int64_t> shape) {
    ir::Value v;
    v.name = fresh("const");
    v.dtype = DType::kInt64;
    v.shape = std::move(shape);
    v.shape_known = true;
    v.initializer = ir::WeightData::owned(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t)));
    return g_.add_value(std::move(v));
  }

  /// op(inputs) with `attrs`, writing `out` (given its `dtype` and `shape`) or, when kNoId, a
  /// new value of them.
  ir::ValueId add(const std::string& op, std::vector<ir::ValueId> inputs, DType dtype,
                  std::vector<int64_t> shape, std::vector<onnx::AttributeProto> attrs = {},
                  ir::ValueId out = ir::kNoId) {
    if (out == ir::kNoId) {
      ir::Value v;
      v.name = fresh(op);
      out = g_.add_value(std::move(v));
    }
    ir::Value& v = g_.value(out);
    v.dtype = dtype;
    v.shape = std::move(shape);
    v.shape_known = true;
    ir::Node n;
    n.name = fmt::format("{}/{}_{}", prefix_, op, count_);
    n.op_type = op;
    n.inputs = std::move(inputs);
    n.outputs = {out};
    n.attributes = std::move(attrs);
    g_.add_node(std::move(n));
    return out;
  }

  /// A value name no tensor of the graph has yet.
  std::string fresh(const std::string& what) {
    for (;;) {
      std::string name = fmt::format("{}/{}_{}_{}", prefix_, tag_, what, ++count_);
      if (!g_.find_value(name)) return name;
    }
  }

 private:
  ir::Graph& g_;
  std::string prefix_, tag_;
  int count_ = 0;
};

}  // namespace stagecraft::passes
