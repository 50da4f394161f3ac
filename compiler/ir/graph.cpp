#include "compiler/ir/graph.h"

#include <algorithm>
#include <queue>
#include <string_view>
#include <unordered_set>

#include "runtime/format/error.h"

namespace stagecraft::ir {

int64_t checked_numel(const std::vector<int64_t>& shape, std::string_view what) {
  int64_t n = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    int64_t d = shape[i];
    if (d < 0) fail(ErrorKind::kShape, "{}: dim {} is negative ({})", what, i, d);
    if (d != 0 && n > INT64_MAX / d) {
      fail(ErrorKind::kShape, "{}: element count of shape {} overflows int64", what,
           shape_string(shape));
    }
    n *= d;
  }
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t Value::numel() const { return checked_numel(shape, "tensor '" + name + "'"); }

int64_t Value::bytes() const {
  int64_t n = numel();
  int64_t size = dtype_size(dtype);
  if (size != 0 && n > INT64_MAX / size) {
    fail(ErrorKind::kShape, "tensor '{}': byte size of shape {} overflows int64", name,
         shape_string(shape));
  }
  return n * size;
}

const onnx::AttributeProto* Node::attribute(std::string_view attr_name) const {
  for (const auto& a : attributes) {
    if (a.name() == attr_name) return &a;
  }
  return nullptr;
}

int64_t Node::attr_int(std::string_view attr_name, int64_t fallback) const {
  const auto* a = attribute(attr_name);
  return a ? a->i() : fallback;
}

float Node::attr_float(std::string_view attr_name, float fallback) const {
  const auto* a = attribute(attr_name);
  return a ? a->f() : fallback;
}

std::vector<int64_t> Node::attr_ints(std::string_view attr_name) const {
  const auto* a = attribute(attr_name);
  if (!a) return {};
  return {a->ints().begin(), a->ints().end()};
}

std::string Node::attr_string(std::string_view attr_name, std::string_view fallback) const {
  const auto* a = attribute(attr_name);
  return a ? a->s() : std::string(fallback);
}

std::string Node::describe(const Graph& graph) const {
  std::string label = name;
  if (label.empty()) {
    for (ValueId o : outputs) {
      if (o != kNoId) {
        label = "producing " + graph.value(o).name;
        break;
      }
    }
  }
  return fmt::format("node '{}' ({})", label, op_type);
}

ValueId Graph::add_value(Value value) {
  auto id = static_cast<ValueId>(values_.size());
  auto [it, inserted] = by_name_.emplace(value.name, id);
  if (!inserted) fail(ErrorKind::kModel, "tensor '{}' is defined more than once", value.name);
  values_.push_back(std::move(value));
  return id;
}

NodeId Graph::add_node(Node node) {
  auto id = static_cast<NodeId>(nodes_.size());
  for (ValueId in : node.inputs) {
    if (in != kNoId) value(in).consumers.push_back(id);
  }
  for (ValueId out : node.outputs) {
    if (out == kNoId) continue;
    Value& v = value(out);
    if (v.producer != kNoId || v.is_initializer() || v.is_graph_input) {
      fail(ErrorKind::kModel, "tensor '{}' has more than one producer (node '{}' writes it again)",
           v.name, node.name);
    }
    v.producer = id;
  }
  nodes_.push_back(std::move(node));
  return id;
}

std::optional<ValueId> Graph::find_value(std::string_view value_name) const {
  auto it = by_name_.find(std::string(value_name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::string Graph::fresh_node_name(const std::string& base) const {
  std::unordered_set<std::string_view> taken;
  for (const Node& n : nodes_)
    if (!n.dead) taken.insert(n.name);
  std::string name = base;
  for (int k = 2; taken.count(name); ++k) name = base + "#" + std::to_string(k);
  return name;
}

void Graph::remove_node(NodeId id) {
  Node& n = node(id);
  if (n.dead) return;
  n.dead = true;
  for (ValueId in : n.inputs) {
    if (in == kNoId) continue;
    auto& c = value(in).consumers;
    auto it = std::find(c.begin(), c.end(), id);
    if (it != c.end()) c.erase(it);
  }
  for (ValueId out : n.outputs) {
    if (out != kNoId && value(out).producer == id) value(out).producer = kNoId;
  }
}

void Graph::drop_input(NodeId id, std::size_t k) {
  Node& n = node(id);
  const ValueId v = n.inputs.at(k);
  n.inputs[k] = kNoId;
  if (v != kNoId) {
    auto& c = value(v).consumers;
    if (auto it = std::find(c.begin(), c.end(), id); it != c.end()) c.erase(it);
  }
  while (!n.inputs.empty() && n.inputs.back() == kNoId) n.inputs.pop_back();
}

void Graph::replace_all_uses(ValueId from, ValueId to) {
  if (from == to) return;
  for (NodeId user : value(from).consumers) {
    for (ValueId& in : node(user).inputs) {
      if (in == from) in = to;
    }
    value(to).consumers.push_back(user);
  }
  value(from).consumers.clear();
  for (ValueId& out : outputs) {
    if (out == from) {
      out = to;
      value(to).is_graph_output = true;
      value(from).is_graph_output = false;
    }
  }
}

void Graph::compact() {
  std::vector<bool> keep_value(values_.size(), false);
  for (ValueId v : inputs) keep_value[v] = true;
  for (ValueId v : outputs) keep_value[v] = true;
  for (const Node& n : nodes_) {
    if (n.dead) continue;
    for (ValueId v : n.inputs) {
      if (v != kNoId) keep_value[v] = true;
    }
    for (ValueId v : n.outputs) {
      if (v != kNoId) keep_value[v] = true;
    }
  }
  std::vector<ValueId> value_map(values_.size(), kNoId);
  std::vector<Value> new_values;
  for (std::size_t i = 0; i < values_.size(); ++i) {
    if (!keep_value[i]) continue;
    value_map[i] = static_cast<ValueId>(new_values.size());
    new_values.push_back(std::move(values_[i]));
  }
  std::vector<Node> new_nodes;
  for (Node& n : nodes_) {
    if (!n.dead) new_nodes.push_back(std::move(n));
  }
  auto remap = [&](ValueId v) { return v == kNoId ? kNoId : value_map[v]; };
  for (ValueId& v : inputs) v = remap(v);
  for (ValueId& v : outputs) v = remap(v);
  for (Value& v : new_values) {
    v.producer = kNoId;
    v.consumers.clear();
  }
  values_ = std::move(new_values);
  nodes_.clear();
  by_name_.clear();
  for (std::size_t i = 0; i < values_.size(); ++i) by_name_.emplace(values_[i].name, i);
  for (Node& n : new_nodes) {
    for (ValueId& v : n.inputs) v = remap(v);
    for (ValueId& v : n.outputs) v = remap(v);
    add_node(std::move(n));
  }
}

std::vector<NodeId> Graph::topological_order() const {
  std::vector<int> pending(nodes_.size(), 0);
  std::size_t live = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].dead) continue;
    ++live;
    for (ValueId in : nodes_[i].inputs) {
      if (in != kNoId && values_[in].producer != kNoId) ++pending[i];
    }
  }
  // A min-heap on node id keeps model order among ready nodes.
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<>> ready;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    if (!nodes_[i].dead && pending[i] == 0) ready.push(static_cast<NodeId>(i));
  }
  std::vector<NodeId> order;
  order.reserve(live);
  while (!ready.empty()) {
    NodeId n = ready.top();
    ready.pop();
    order.push_back(n);
    for (ValueId out : nodes_[n].outputs) {
      if (out == kNoId) continue;
      for (NodeId user : values_[out].consumers) {
        if (--pending[user] == 0) ready.push(user);
      }
    }
  }
  if (order.size() != live) {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (!nodes_[i].dead && pending[i] > 0) {
        fail(ErrorKind::kModel, "the graph has a cycle through {}", nodes_[i].describe(*this));
      }
    }
  }
  return order;
}

std::size_t Graph::live_nodes() const {
  return static_cast<std::size_t>(
      std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return !n.dead; }));
}

}  // namespace stagecraft::ir
