#include "compiler/partition/graph_problem.h"

#include <algorithm>

#include "runtime/format/error.h"

namespace stagecraft::partition {

namespace {

/// Per node id: whether a graph input reaches it. `order` is topological (producers first).
std::vector<bool> fed_by_inputs(const ir::Graph& graph, const std::vector<ir::NodeId>& order) {
  std::vector<bool> fed(graph.num_nodes(), false);
  for (ir::NodeId n : order) {
    for (ir::ValueId in : graph.node(n).inputs) {
      if (in == ir::kNoId) continue;
      const ir::Value& v = graph.value(in);
      if (v.is_graph_input || (v.producer != ir::kNoId && fed[v.producer])) fed[n] = true;
    }
  }
  return fed;
}

}  // namespace

std::vector<ir::NodeId> partition_order(const ir::Graph& graph) {
  const std::vector<ir::NodeId> topological = graph.topological_order();
  const std::vector<bool> fed = fed_by_inputs(graph, topological);
  std::vector<bool> placed(graph.num_nodes(), false);
  std::vector<ir::NodeId> order;
  order.reserve(topological.size());
  // A node, after the weight-only producers it reads that are not placed yet (theirs first).
  auto place = [&](auto& self, ir::NodeId n) -> void {
    if (placed[n]) return;
    for (ir::ValueId in : graph.node(n).inputs) {
      if (in == ir::kNoId) continue;
      const ir::NodeId p = graph.value(in).producer;
      if (p != ir::kNoId && !fed[p]) self(self, p);
    }
    placed[n] = true;
    order.push_back(n);
  };
  for (ir::NodeId n : topological)
    if (fed[n]) place(place, n);
  for (ir::NodeId n : topological) place(place, n);  // weight-only nodes nothing fed reads
  return order;
}

GraphProblem make_graph_problem(const ir::Graph& graph, std::vector<ir::NodeId> order,
                                std::vector<PositionCost> costs) {
  if (costs.size() != order.size()) {
    fail(ErrorKind::kInternal, "{} costs for {} positions", costs.size(), order.size());
  }
  GraphProblem gp;
  gp.order = std::move(order);
  gp.position_of.assign(graph.num_nodes(), -1);
  for (std::size_t i = 0; i < gp.order.size(); ++i)
    gp.position_of[gp.order[i]] = static_cast<int>(i);
  const auto n = static_cast<int>(gp.order.size());
  gp.problem.positions = std::move(costs);

  // A difference array: +bytes at the producer's position, -bytes at the last reader's.
  std::vector<double> delta(n + 1, 0.0);
  for (const ir::Value& v : graph.values()) {
    if (v.producer == ir::kNoId || v.is_initializer() || v.is_graph_input) continue;
    int from = gp.position_of[v.producer];
    if (from < 0) continue;
    Tensor tensor{from, {}, static_cast<double>(v.bytes())};
    for (ir::NodeId user : v.consumers)
      if (gp.position_of[user] > from) tensor.readers.push_back(gp.position_of[user]);
    if (tensor.readers.empty()) continue;
    std::sort(tensor.readers.begin(), tensor.readers.end());
    tensor.readers.erase(std::unique(tensor.readers.begin(), tensor.readers.end()),
                         tensor.readers.end());
    delta[from] += tensor.bytes;
    delta[tensor.readers.back()] -= tensor.bytes;
    gp.problem.tensors.push_back(std::move(tensor));
  }
  // No cut right after a node computed from weights alone: it would send a weight to the next
  // stage every microbatch (partition_order puts such a node just before its first reader).
  const std::vector<bool> fed = fed_by_inputs(graph, gp.order);
  std::vector<int> allowed;
  for (int i = 0; i + 1 < n; ++i)
    if (fed[gp.order[i]]) allowed.push_back(i);
  if (!allowed.empty() && static_cast<int>(allowed.size()) < n - 1)
    gp.problem.allowed_cuts = std::move(allowed);
  gp.problem.cut_bytes.assign(std::max(0, n - 1), 0.0);
  double running = 0;
  for (int i = 0; i + 1 < n; ++i) {
    running += delta[i];
    gp.problem.cut_bytes[i] = running;
  }
  return gp;
}

std::vector<int> stage_of_nodes(const GraphProblem& gp, const Solution& solution,
                                std::size_t num_nodes) {
  std::vector<int> stage(num_nodes, -1);
  for (std::size_t k = 0; k < solution.stages.size(); ++k) {
    for (int pos = solution.stages[k].first; pos <= solution.stages[k].last; ++pos) {
      stage[gp.order[pos]] = static_cast<int>(k);
    }
  }
  return stage;
}

void validate_assignment(const ir::Graph& graph, const std::vector<int>& stage_of, int stages) {
  std::vector<int> count(stages, 0);
  for (std::size_t i = 0; i < graph.num_nodes(); ++i) {
    const ir::Node& node = graph.node(static_cast<ir::NodeId>(i));
    if (node.dead) continue;
    int s = i < stage_of.size() ? stage_of[i] : -1;
    if (s < 0 || s >= stages) {
      fail(ErrorKind::kPlan, "{} is in no stage (stage {} of {})", node.describe(graph), s, stages);
    }
    ++count[s];
    for (ir::ValueId in : node.inputs) {
      if (in == ir::kNoId || graph.value(in).producer == ir::kNoId) continue;
      int from = stage_of[graph.value(in).producer];
      if (from > s) {
        fail(ErrorKind::kPlan, "{} in stage {} reads tensor '{}' written in later stage {}",
             node.describe(graph), s, graph.value(in).name, from);
      }
    }
  }
  for (int k = 0; k < stages; ++k) {
    if (count[k] == 0) fail(ErrorKind::kPlan, "stage {} of {} has no ops", k, stages);
  }
}

}  // namespace stagecraft::partition
