// The graph adapter on the checked-in samples: cut bytes count every tensor crossing a cut
// (skip connections included), and solutions are valid pipelines.
#include <doctest/doctest.h>

#include "compiler/import.h"
#include "compiler/partition/graph_problem.h"
#include "cost_models/op_cost.h"
#include "runtime/format/error.h"

namespace stagecraft::partition {
namespace {

ImportedModel load(const std::string& name, int64_t batch, std::map<std::string, int64_t> dims = {}) {
  ImportOptions options;
  options.batch = batch;
  options.dims = std::move(dims);
  return import_model(std::string(STAGECRAFT_SAMPLES) + "/" + name, options);
}

PositionCost flops_cost(const ir::Graph& g, const ir::Node& n) {
  auto work = cost::forward_work(g, n);
  double out = 0;
  for (ir::ValueId v : n.outputs) out += v == ir::kNoId ? 0 : static_cast<double>(g.value(v).bytes());
  return {work.flops * 1e-9 + 1e-6, 0, out};
}

GraphProblem flops_problem(const ir::Graph& g) {
  auto order = g.topological_order();
  std::vector<PositionCost> costs;
  for (ir::NodeId id : order) costs.push_back(flops_cost(g, g.node(id)));
  return make_graph_problem(g, order, std::move(costs));
}

/// Bytes crossing a cut after `pos`, computed the slow way: every tensor written at or before
/// `pos` and read after it.
double slow_cut_bytes(const ir::Graph& g, const GraphProblem& gp, int pos) {
  double total = 0;
  for (const auto& v : g.values()) {
    if (v.producer == ir::kNoId || v.is_initializer() || v.is_graph_input) continue;
    if (gp.position_of[v.producer] > pos) continue;
    bool read_after = false;
    for (ir::NodeId u : v.consumers) read_after |= gp.position_of[u] > pos;
    if (read_after) total += static_cast<double>(v.bytes());
  }
  return total;
}

TEST_CASE("cut bytes count every crossing tensor, residual streams included") {
  for (const auto& [name, dims] : std::vector<std::pair<std::string, std::map<std::string, int64_t>>>{
           {"resnet_small.onnx", {}}, {"gpt_tiny.onnx", {{"seq", 16}}}}) {
    CAPTURE(name);
    auto model = load(name, 2, dims);
    auto gp = flops_problem(model.graph);
    REQUIRE(gp.problem.positions.size() == model.graph.live_nodes());
    int wider = 0;
    for (int pos = 0; pos + 1 < static_cast<int>(gp.order.size()); ++pos) {
      double slow = slow_cut_bytes(model.graph, gp, pos);
      CHECK(gp.problem.cut_bytes[pos] == doctest::Approx(slow));
      // A cut inside a residual block sends the block's input as well as the current tensor.
      const ir::Node& node = model.graph.node(gp.order[pos]);
      double own = static_cast<double>(model.graph.value(node.outputs[0]).bytes());
      if (slow > own) ++wider;
    }
    CHECK(wider > 0);
  }
}

TEST_CASE("solutions on real graphs are valid pipelines for 1 to 8 stages") {
  auto model = load("gpt_tiny.onnx", 2, {{"seq", 16}});
  auto gp = flops_problem(model.graph);
  for (int stages : {1, 2, 4, 8}) {
    gp.problem.stages = stages;
    Solution s = solve(gp.problem);
    REQUIRE(s.feasible);
    auto stage_of = stage_of_nodes(gp, s, model.graph.num_nodes());
    CHECK_NOTHROW(validate_assignment(model.graph, stage_of, stages));
  }
}

TEST_CASE("the validator names a backwards edge and an empty stage") {
  auto model = load("toy.onnx", 2);
  auto order = model.graph.topological_order();
  REQUIRE(order.size() == 3);
  std::vector<int> backwards(model.graph.num_nodes(), 0);
  backwards[order[0]] = 1;
  CHECK_THROWS_WITH_AS(validate_assignment(model.graph, backwards, 2), doctest::Contains("written in later stage 1"),
                       Error);
  std::vector<int> empty(model.graph.num_nodes(), 0);
  CHECK_THROWS_WITH_AS(validate_assignment(model.graph, empty, 2), doctest::Contains("stage 1 of 2 has no ops"), Error);
}

}  // namespace
}  // namespace stagecraft::partition

#include <onnx/checker.h>

#include <set>

#include "compiler/plan/stage_files.h"

namespace stagecraft::partition {
namespace {

TEST_CASE("stage files are valid ONNX models that together hold every node once") {
  for (const auto& [name, dims] : std::vector<std::pair<std::string, std::map<std::string, int64_t>>>{
           {"resnet_small.onnx", {}}, {"gpt_tiny.onnx", {{"seq", 8}}}, {"mnist_cnn.onnx", {}}}) {
    CAPTURE(name);
    auto model = load(name, 2, dims);
    auto gp = flops_problem(model.graph);
    gp.problem.stages = 3;
    auto stage_of = stage_of_nodes(gp, solve(gp.problem), model.graph.num_nodes());
    auto interfaces = plan::stage_interfaces(model.graph, stage_of);
    std::multiset<std::string> nodes_seen;
    for (int k = 0; k < 3; ++k) {
      auto stage = plan::stage_model(model.graph, stage_of, k);
      CHECK_NOTHROW(onnx::checker::check_model(stage));
      for (const auto& n : stage.graph().node()) nodes_seen.insert(n.name());
      std::set<std::string> inputs, outputs;
      for (const auto& i : stage.graph().input()) inputs.insert(i.name());
      for (const auto& o : stage.graph().output()) outputs.insert(o.name());
      for (const auto& cut : interfaces.cut_tensors) {
        bool reads = std::count(cut.consumer_stages.begin(), cut.consumer_stages.end(), k) > 0;
        CHECK(inputs.count(cut.name) == (reads ? 1u : 0u));
        CHECK(outputs.count(cut.name) == (cut.producer_stage == k ? 1u : 0u));
      }
    }
    CHECK(nodes_seen.size() == model.graph.live_nodes());
    for (const auto& n : model.graph.nodes()) CHECK(nodes_seen.count(n.name) == 1);
  }
}

}  // namespace
}  // namespace stagecraft::partition
