// The --json view of stagedump (schema at the top of tools/stagedump.cpp and in
// docs/schemas/stagedump.schema.json).
#include "tools/dump/render.h"
#include "tools/json_formats.h"

namespace stagecraft::dump {
namespace {

using ordered = nlohmann::ordered_json;

/// A stage's anatomy: parts, no total (a device's peak is in "devices").
ordered memory_json(const plan::MemoryBytes& m) {
  return {{"weights", m.weights},     {"gradients", m.gradients},
          {"optimizer", m.optimizer}, {"activations", m.activations},
          {"temporary", m.temporary}, {"communication", m.communication}};
}

/// The one memory figure per device and the parts it holds at that instant (plan.json's
/// device_memory, without the memory over the step, which --trace draws).
ordered devices_json(const plan::Plan& plan) {
  ordered devices = ordered::array();
  for (const plan::DevicePeak& d : plan.device_memory) {
    const plan::PeakParts& p = d.parts;
    ordered stages = ordered::array();
    for (const plan::Stage& stage : plan.stages)
      if (stage.device == d.device) stages.push_back(stage.index);
    devices.push_back({{"device", d.device},
                       {"stages", std::move(stages)},
                       {"peak_bytes", d.peak_bytes},
                       {"peak_ms", d.peak_ms},
                       {"in_flight", d.in_flight},
                       {"parts",
                        {{"weights", p.weights},
                         {"gradients", p.gradients},
                         {"optimizer", p.optimizer},
                         {"activations", p.activations},
                         {"recomputed", p.recomputed},
                         {"deferred", p.deferred},
                         {"arena", p.arena},
                         {"communication", p.communication}}}});
  }
  return devices;
}

ordered shared_json(const plan::Stage& stage) {
  ordered list = ordered::array();
  for (const plan::SharedWeight& w : stage.shared_weights)
    list.push_back(
        {{"name", w.name}, {"dtype", w.dtype}, {"shape", w.shape}, {"stages", w.stages}});
  return list;
}

ordered stage_json(const plan::Stage& stage) {
  return {{"index", stage.index},
          {"device", stage.device},
          {"chunk", stage.chunk},
          {"nodes", stage.nodes.size()},
          {"first_node", stage.nodes.front()},
          {"last_node", stage.nodes.back()},
          {"params", stage.params},
          {"fwd_ms", stage.fwd_ms},
          {"bwd_ms", stage.bwd_ms},
          {"send_ms", stage.send_ms},
          {"in_flight", stage.in_flight},
          {"memory_bytes", memory_json(stage.memory)},
          {"shared_weights", shared_json(stage)},
          {"shared_exchange_ms", stage.shared_exchange_ms},
          {"allreduce_ms", stage.allreduce_ms},
          {"allgather_ms", stage.allgather_ms},
          {"optimizer_shards", stage.optimizer_shards},
          {"why", stage.why}};
}

ordered cuts_json(const plan::Plan& plan) {
  ordered cuts = ordered::array();
  for (int cut = 0; cut + 1 < static_cast<int>(plan.stages.size()); ++cut) {
    ordered tensors = ordered::array();
    int64_t total = 0;
    for (const CutTensor& c : tensors_crossing(plan, cut)) {
      tensors.push_back({{"name", c.tensor->name},
                         {"dtype", c.tensor->dtype},
                         {"shape", c.tensor->shape},
                         {"from", c.from},
                         {"to", c.tensor->peer_stages},
                         {"bytes", c.tensor->bytes}});
      total += c.tensor->bytes;
    }
    cuts.push_back({{"after_stage", cut}, {"bytes", total}, {"tensors", std::move(tensors)}});
  }
  return cuts;
}

ordered prediction_json(const plan::Prediction& p) {
  return {{"step_ms", p.step_ms},
          {"bubble_fraction", p.bubble_fraction},
          {"samples_per_s", p.samples_per_s},
          {"peak_memory_bytes", p.peak_memory_bytes},
          {"device_peak_bytes", p.device_peak_bytes},
          {"fits", p.fits}};
}

ordered baseline_json(const plan::Prediction& baseline, const plan::Prediction& ours) {
  ordered json = prediction_json(baseline);
  json["step_ratio"] = baseline.step_ms > 0 ? ordered(ours.step_ms / baseline.step_ms) : ordered();
  return json;
}

/// plan.json's search record, with the chosen split's step gain over the slowest-stage optimum
/// (1 - ours / theirs; null when there is none to compare, as for a manual split).
ordered search_json(const plan::Plan& plan) {
  const plan::SplitSearch& search = plan.search;
  const bool compared = search.bottleneck_step_ms > 0;
  return {{"candidates", search.candidates},
          {"pruned", search.pruned},
          {"bottleneck_step_ms", compared ? ordered(search.bottleneck_step_ms) : ordered()},
          {"bottleneck_fits", search.bottleneck_fits},
          {"bottleneck_split_after", search.bottleneck_split_after},
          {"step_gain",
           compared ? ordered(1 - plan.predicted.step_ms / search.bottleneck_step_ms) : ordered()}};
}

/// The figures of the timeline drawn: since plan format 4 the planner's own (kept under this
/// key for readers of the schema from when stagedump re-simulated the schedule).
ordered simulated_json(const PlanView& view) {
  const plan::Prediction& p = view.plan.predicted;
  return {{"step_ms", p.step_ms},
          {"bubble_fraction", p.bubble_fraction},
          {"samples_per_s", p.samples_per_s},
          {"device_busy_ms", p.device_busy_ms},
          {"device_peak_bytes", p.device_peak_bytes}};
}

/// The compute events of the predicted timeline, in device then time order.
ordered timeline_json(const PlanView& view) {
  ordered events = ordered::array();
  for (const schedule::TimelineEvent& e : compute_events(view.plan.timeline)) {
    events.push_back({{"device", e.device},
                      {"op", event_category(e.op)},
                      {"stage", e.stage},
                      {"microbatch", e.microbatch},
                      {"start_ms", e.start_s * 1e3},
                      {"end_ms", e.end_s * 1e3}});
  }
  return events;
}

}  // namespace

nlohmann::ordered_json render_json(const PlanView& view) {
  const plan::Plan& plan = view.plan;
  ordered stages = ordered::array();
  for (const plan::Stage& stage : plan.stages) stages.push_back(stage_json(stage));
  ordered ops = ordered::array();
  for (const plan::OpRecord& op : plan.ops) {
    ops.push_back({{"name", op.name},
                   {"op_type", op.op_type},
                   {"stage", op.stage},
                   {"fwd_ms", op.fwd_ms},
                   {"bwd_ms", op.bwd_ms},
                   {"flops", op.flops}});
  }
  return {{"format_version", tools::kDumpJsonVersion},
          {"plan",
           {{"dir", view.plan_dir},
            {"format_version", plan.format_version},
            {"generator", plan.generator},
            {"model_path", plan.model_path},
            {"objective", std::string(to_string(plan.objective))},
            {"schedule", std::string(to_string(plan.schedule))},
            {"devices", plan.devices},
            {"chunks", plan.chunks},
            {"microbatches", plan.microbatches},
            {"data_parallel", plan.data_parallel},
            {"placement", plan.placement},
            {"shard_optimizer", plan.shard_optimizer},
            {"microbatch_size", plan.microbatch_size},
            {"batch", plan.batch},
            {"training", plan.training},
            {"optimizer", std::string(to_string(plan.optimizer))},
            {"clip_grad_norm", plan.training ? plan.training_config.clip_grad_norm : 0.0},
            {"precision", std::string(to_string(plan.precision))},
            {"cost_model", plan.cost_model}}},
          {"devices", devices_json(plan)},
          {"stages", std::move(stages)},
          {"cuts", cuts_json(plan)},
          {"predicted", prediction_json(plan.predicted)},
          {"simulated", simulated_json(view)},
          {"timeline", timeline_json(view)},
          {"baselines",
           {{"parameters", baseline_json(plan.baseline_parameters, plan.predicted)},
            {"uniform", baseline_json(plan.baseline_uniform, plan.predicted)}}},
          {"search", search_json(plan)},
          {"auto_search", plan::auto_search_json(plan.auto_search)},
          // What the text view's "instruction costs" and "calibrated from" lines show, as
          // plan.json has it; null for a plan that charged none.
          {"instruction_costs", view.instruction_costs.empty()
                                    ? ordered()
                                    : plan::instruction_costs_json(view.instruction_costs)},
          {"ops", std::move(ops)}};
}

}  // namespace stagecraft::dump
