#pragma once
/// \file
/// Turns an imported graph into the numbers the partition solver works on: a topological
/// order of the nodes, per-node costs, and the bytes a cut after each position must send.

#include <vector>

#include "compiler/ir/graph.h"
#include "compiler/partition/partitioner.h"

namespace stagecraft::partition {

/// The graph in the solver's terms. The graph's shapes are per microbatch (import binds the
/// batch dim to the microbatch size), so every byte count is per microbatch.
struct GraphProblem {
  std::vector<ir::NodeId> order;  ///< Live nodes in topological order; position -> node.
  std::vector<int> position_of;   ///< node -> position (-1 for dead nodes).
  Problem problem;                ///< positions, cut_bytes and tensors filled; the caller sets the rest.
};

/// The order the solver cuts: the graph's topological order, except that a node computed from
/// weights and constants alone (no graph input upstream: an exporter's Transpose of a Linear
/// weight, a cast of an embedding) comes right before its first reader instead of wherever it
/// became ready. Otherwise such a node lands in the first stage and its output, a weight, is
/// sent to the stage that reads it on every microbatch, and its gradient sent back.
std::vector<ir::NodeId> partition_order(const ir::Graph& graph);

/// Builds the problem for the live nodes in `order` (a topological order) with their costs
/// (`costs[i]` for `order[i]`). A tensor crosses every cut between its producer's position and
/// its last reader's; graph inputs are routed straight to the stages that read them and weights
/// live with their readers, so neither is ever sent between stages. The allowed cuts leave out
/// the positions right after a node computed from weights alone (see partition_order).
GraphProblem make_graph_problem(const ir::Graph& graph, std::vector<ir::NodeId> order,
                                std::vector<PositionCost> costs);

/// The stage (0-based) of each node for a solution (indexed by node id; -1 for dead nodes).
std::vector<int> stage_of_nodes(const GraphProblem& gp, const Solution& solution, std::size_t num_nodes);

/// Checks a node-to-stage assignment the way the plan validator must: every live node in
/// exactly one stage, every stage non-empty, every tensor read in the stage that writes it or
/// a later one (so the stage graph is acyclic and each stage convex). Throws `Error(kPlan)`
/// naming the node and the stages otherwise.
void validate_assignment(const ir::Graph& graph, const std::vector<int>& stage_of, int stages);

}  // namespace stagecraft::partition
