// Which nodes of a 16-bit plan the CUDA backend still runs widened (Backend::runs_widened: the
// 16-bit inputs cast to float32 copies, the float32 kernel, the results rounded back): each
// costs a cast launch and a float32 round trip per operand (issue 31: 844 cast launches in
// GPT-2 mixed's step on 2026-11-29). Host code: the backend's checks answer without a GPU.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <map>
#include <set>
#include <string>

#include "compiler/plan/planner.h"
#include "compiler/plan/stage_files.h"
#include "cost_models/device_spec.h"
#include "cost_models/roofline.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "tests/runtime/training_options.h"

namespace stagecraft {
namespace {

/// A mixed training plan of `file` on 1 device (an H100 spec).
plan::PlannedModel mixed_plan(const std::string& file) {
  const std::string path = std::string(STAGECRAFT_SAMPLES) + "/" + file;
  plan::PlanOptions o = testing::training_options(path, 1, "1f1b", "cross-entropy");
  o.model_path = path;
  o.devices = 1;
  o.batch = 2;
  o.microbatches = 1;
  if (file == "gpt_tiny.onnx") o.dims["seq"] = 16;
  o.device_spec = "h100";
  o.precision = Precision::kMixed;
  return plan::make_plan(o);
}

/// The nodes `planned` runs widened on `backend`, forward and backward, by op type and how many.
std::map<std::string, int> widened(const rt::Backend& backend, const plan::PlannedModel& planned) {
  std::map<std::string, int> out;
  const plan::Stage& stage = planned.plan.stages.at(0);
  const auto forward = rt::Program::from_model(
      plan::stage_model(planned.model.graph, planned.stage_of, 0), backend, "forward");
  const auto backward = rt::Program::from_model(
      plan::backward_stage_model(planned.model.graph, planned.stage_of, stage,
                                 planned.plan.training_config.loss_output),
      backend, "backward");
  for (const rt::Program* p : {&forward, &backward})
    for (const std::string& node : p->widened_ops()) ++out[node.substr(0, node.find('('))];
  return out;
}

TEST_CASE("a mixed GPT's and CNN's training step: what CUDA still runs widened") {
#ifdef STAGECRAFT_WITH_CUDA
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  // What is left, and should shrink: the embeddings' GatherGrad (GPT), Gemm and its gradient
  // (the CNN's classifier; CUDA's Gemm is float32). Before 2026-11-30 also every Conv (then
  // float32 between Casts), ReluGrad, GeluGrad, CastGrad into a 16-bit input, and
  // LayerNormalization and its gradient.
  // Since 2026-11-30 also the pools and their gradients (before, float32 between Casts, their
  // float32 copies kept for the backward; now 16-bit nodes whose X and Y the CUDA kernels
  // widen: the same arithmetic, and the backward keeps the 16-bit tensors).
  const std::map<std::string, std::set<std::string>> expected = {
      {"gpt_tiny.onnx", {"GatherGrad"}},
      {"resnet_small.onnx",
       {"Gemm", "GemmGrad", "GlobalAveragePool", "GlobalAveragePoolGrad", "MaxPool",
        "MaxPoolGrad"}}};
  for (const auto& [file, left] : expected) {
    CAPTURE(file);
    const plan::PlannedModel planned = mixed_plan(file);
    const std::map<std::string, int> ops = widened(*cuda, planned);
    std::string list;
    std::set<std::string> names;
    for (const auto& [op, n] : ops) {
      list += fmt::format(" {} x{}", op, n);
      names.insert(op);
    }
    const std::string line = fmt::format("{} widened on CUDA:{}", file, list);
    MESSAGE(line);
    CHECK(names == left);
    // The roofline prices each forward node that computes on 16-bit tensors as CUDA runs it:
    // at 16 bits where the kernel takes them, widened (with its casts) where it does not.
    const cost::RooflineCostModel roofline(*cost::device_preset("h100"), Precision::kMixed);
    const ir::Graph& g = planned.model.graph;
    int priced = 0;
    for (ir::NodeId id : g.topological_order()) {
      const ir::Node& n = g.node(id);
      if (n.op_type == "Cast" || n.outputs.empty() || n.outputs[0] == ir::kNoId ||
          !is_16bit_float(g.value(n.outputs[0]).dtype))
        continue;
      CAPTURE(n.name);
      CHECK(roofline.runs_16_bit(n) == !names.count(n.op_type));
      ++priced;
    }
    CHECK(priced > 0);
  }
#endif
}

}  // namespace
}  // namespace stagecraft
