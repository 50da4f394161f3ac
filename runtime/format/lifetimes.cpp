#include "runtime/format/lifetimes.h"

#include <string_view>

#include "runtime/format/error.h"

namespace stagecraft::plan {

namespace {

// Per value, the node producing it; -1 for inputs, weights and values no node writes.
std::vector<int> producers(const ProgramGraph& graph) {
  std::vector<int> producer(static_cast<size_t>(graph.values), -1);
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    for (int v : graph.nodes[n].outputs)
      if (v >= 0) producer[v] = static_cast<int>(n);
  return producer;
}

}  // namespace

bool is_view_node(const ProgramNode& node, std::size_t* source) {
  static constexpr std::string_view kViews[] = {"Reshape", "Flatten", "Squeeze", "Unsqueeze",
                                                "Identity"};
  const std::string_view op = node.op_type;
  for (std::string_view view : kViews) {
    if (op == view && !node.inputs.empty()) {
      *source = 0;
      return true;
    }
    // The gradient: x..., y0, dy0 (grad_ops.h); dx0 is dy0 in x0's shape.
    if (op.size() == view.size() + 4 && op.starts_with(view) && op.ends_with("Grad") &&
        node.inputs.size() >= 3) {
      *source = node.inputs.size() - 1;
      return true;
    }
  }
  return false;
}

Intermediates intermediate_lifetimes(const ProgramGraph& graph, const std::vector<int64_t>& bytes,
                                     const std::vector<bool>& is_output) {
  if (bytes.size() != static_cast<size_t>(graph.values) ||
      is_output.size() != static_cast<size_t>(graph.values))
    fail(ErrorKind::kInternal, "lifetimes of {} values given {} sizes and {} output flags",
         graph.values, bytes.size(), is_output.size());
  Intermediates out;
  std::vector<int> index(static_cast<size_t>(graph.values), -1);  // value -> intermediate
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const int step = static_cast<int>(n);
    const ProgramNode& node = graph.nodes[n];
    for (int v : node.inputs) {
      if (v < 0 || index[v] < 0) continue;
      out.lifetimes[index[v]].last = step;
      if (const int root = out.alias[index[v]]; root >= 0) out.lifetimes[root].last = step;
    }
    std::size_t source = 0;
    const bool view = is_view_node(node, &source);
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const int v = node.outputs[k];
      if (v < 0 || is_output[v]) continue;
      index[v] = static_cast<int>(out.values.size());
      out.values.push_back(v);
      const int from = view && k == 0 ? node.inputs[source] : -1;
      if (from >= 0 && index[from] >= 0 && bytes[from] == bytes[v] && bytes[v] > 0) {
        const int entry = index[from];
        out.alias.push_back(out.alias[entry] >= 0 ? out.alias[entry] : entry);
        out.lifetimes.push_back({0, step, step});
      } else {
        out.alias.push_back(-1);
        out.lifetimes.push_back({bytes[v], step, step});
      }
    }
  }
  return out;
}

std::vector<bool> weight_gradient_nodes(const ProgramGraph& graph) {
  const std::vector<int> producer = producers(graph);
  const size_t count = graph.nodes.size();
  std::vector<bool> w(count, false);
  for (size_t n = 0; n < count; ++n) {
    const ProgramNode& node = graph.nodes[n];
    if (node.weight_gradients) {
      w[n] = true;
      continue;
    }
    // An Add of weight-gradient parts is part of W too.
    bool any = false, all = true;
    for (int v : node.inputs) {
      if (v < 0) continue;
      bool from_w = producer[v] >= 0 && w[producer[v]];
      any |= from_w;
      all &= from_w || producer[v] < 0;  // program inputs (received gradients) are neutral
    }
    w[n] = node.op_type == "Add" && any && all;
  }
  for (size_t n = 0; n < count; ++n)
    if (!w[n])
      for (int v : graph.nodes[n].inputs)
        if (v >= 0 && producer[v] >= 0 && w[producer[v]]) return std::vector<bool>(count, false);
  return w;
}

std::vector<bool> crossing_values(const ProgramGraph& graph, const std::vector<bool>& part) {
  std::vector<bool> read_outside(static_cast<size_t>(graph.values), false);
  std::vector<bool> made_inside(static_cast<size_t>(graph.values), false);
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    for (int v : part[n] ? graph.nodes[n].outputs : graph.nodes[n].inputs)
      if (v >= 0) (part[n] ? made_inside : read_outside)[v] = true;
  for (size_t v = 0; v < read_outside.size(); ++v)
    read_outside[v] = read_outside[v] && made_inside[v];
  return read_outside;
}

int64_t deferred_bytes(const ProgramGraph& graph, const std::vector<int64_t>& bytes) {
  std::vector<bool> b_part = weight_gradient_nodes(graph);
  b_part.flip();
  const std::vector<bool> crossing = crossing_values(graph, b_part);
  int64_t total = 0;
  for (size_t v = 0; v < crossing.size(); ++v)
    if (crossing[v]) total += bytes[v];
  return total;
}

}  // namespace stagecraft::plan
