#include "tests/plan_format/sample_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "compiler/schedule/build_schedule.h"
#include "compiler/schedule/device_peak.h"
#include "compiler/schedule/simulator.h"

namespace stagecraft::testing {
namespace {

plan::StageTensor tensor(const std::string& name, const std::string& dtype,
                         std::vector<int64_t> shape, int64_t bytes) {
  plan::StageTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes = bytes;
  return t;
}

plan::Prediction prediction(int devices, int stages, double step_ms, double bubble, int64_t peak) {
  plan::Prediction p;
  p.step_ms = step_ms;
  p.bubble_fraction = bubble;
  p.samples_per_s = step_ms > 0 ? 8 / (step_ms / 1e3) : 0;
  p.peak_memory_bytes = peak;
  p.device_busy_ms.assign(devices, step_ms * (1 - bubble));
  p.device_peak_bytes.assign(devices, peak);
  for (int k = 0; k + 1 < stages; ++k) p.split_after.push_back(fmt::format("s{}_b", k));
  return p;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace

plan::Plan sample_plan(const std::string& schedule, int devices, int chunks, int microbatches) {
  plan::Plan p;
  p.generator = "stagecraft tests";
  p.model_path = "model.onnx";
  p.model_hash = "fnv1a64:0123456789abcdef";
  p.objective = Objective::kSpeed;
  p.schedule = parse_schedule(schedule);
  p.devices = devices;
  p.placement = plan::pipeline_major_placement(1, devices);
  p.chunks = chunks;
  p.microbatches = microbatches;
  p.microbatch_size = 2;
  p.batch = microbatches * 2;
  p.training = schedule != "inference";
  p.optimizer = p.training ? OptimizerKind::kAdamW : OptimizerKind::kNone;
  p.precision = Precision::kFp32;
  p.cost_model = "roofline(test, fp32)";
  p.device = {"test", DeviceKind::kGpu, 1'000'000'000};
  p.cluster = {8, {100e9, 1e-6}, {10e9, 1e-5}};

  int stages = devices * chunks;
  for (int k = 0; k < stages; ++k) {
    plan::Stage s;
    s.index = k;
    s.device = schedule::device_of_stage(k, devices, parse_schedule(schedule));
    s.chunk = k / devices;
    s.file = fmt::format("stage_{}.onnx", k);
    s.nodes = {fmt::format("s{}_a", k), fmt::format("s{}_b", k)};
    s.params = 1000 * (k + 1);
    if (k == 0) s.inputs.push_back(tensor("x", "float32", {2, 16}, 128));
    if (k > 0) {
      s.inputs.push_back(tensor(fmt::format("act{}", k - 1), "float32", {2, 16}, 128));
      s.inputs.back().peer_stage = k - 1;
    }
    if (k + 1 < stages) {
      s.outputs.push_back(tensor(fmt::format("act{}", k), "float32", {2, 16}, 128));
      s.outputs.back().peer_stages = {k + 1};
    }
    if (k == stages - 1) {
      if (stages > 1) {
        s.inputs.push_back(tensor("skip", "float32", {2, 16}, 128));
        s.inputs.back().peer_stage = 0;
      }
      s.inputs.push_back(tensor("labels", "int64", {2}, 16));
      s.outputs.push_back(tensor("loss", "float32", {}, 4));
      s.outputs.back().graph_output = true;
    }
    s.fwd_ms = 1;
    s.bwd_ms = p.training ? 2 : 0;
    s.backward_input_ms = s.bwd_ms / 2;
    s.backward_weight_ms = s.bwd_ms / 2;
    s.in_flight = std::min(stages - k, microbatches);
    s.memory = {4000 * (k + 1),
                p.training ? 4000 * (k + 1) : 0,
                p.training ? 8000 * (k + 1) : 0,
                1024 * s.in_flight,
                512,
                256};
    s.why = k + 1 < stages ? "balances predicted time" : "last stage";
    p.stages.push_back(std::move(s));
  }
  if (stages > 1) {
    plan::StageTensor skip = tensor("skip", "float32", {2, 16}, 128);
    skip.peer_stages = {stages - 1};
    p.stages[0].outputs.push_back(skip);
  }
  for (const plan::Stage& s : p.stages) {
    for (const std::string& node : s.nodes) {
      p.ops.push_back({node, node.back() == 'a' ? "MatMul" : "Add", s.index, 0.5,
                       p.training ? 1.0 : 0.0, 1e6, 4000, 128});
    }
  }
  // The prediction and its timeline as the planner makes them: the schedule simulated with the
  // stage times (1F1B: (M + P - 1) * 3 ms, bubble (P - 1) / (M + P - 1)).
  schedule::PipelineShape shape{devices, chunks, microbatches, p.training};
  shape.placement = schedule::placement_of(p.schedule);
  schedule::SimResult sim = schedule::simulate(
      schedule::build_schedule(parse_schedule(schedule), shape), shape, stage_costs(p));
  double step = sim.step_s * 1e3;
  p.predicted = prediction(devices, stages, step, sim.bubble_fraction, 30000);
  // Each device's predicted peak as the planner makes it (compiler/schedule/device_peak.h).
  p.device_memory = schedule::device_peaks(sim, p.stages, devices);
  schedule::set_peaks(p.predicted, p.device_memory);
  p.timeline = std::move(sim.events);
  p.processors.processor_of = plan::processor_of_devices(devices, 1);
  p.processors.separate_step_ms = step;
  p.baseline_parameters = prediction(devices, stages, step * 1.25, 0.3, 32000);
  p.baseline_uniform = prediction(devices, stages, step * 1.1, 0.25, 31000);
  p.baseline_uniform.fits = false;
  return p;
}

schedule::StageCosts stage_costs(const plan::Plan& plan) {
  schedule::StageCosts costs;
  for (const plan::Stage& stage : plan.stages) {
    costs.forward_s.push_back(stage.fwd_ms / 1e3);
    costs.backward_input_s.push_back(stage.backward_input_ms / 1e3);
    costs.backward_weight_s.push_back(stage.backward_weight_ms / 1e3);
    costs.optimizer_s = std::max(costs.optimizer_s, stage.optimizer_ms / 1e3);
    costs.send_s.push_back(stage.send_ms / 1e3);
    costs.shared_allreduce_s.push_back(stage.shared_exchange_ms / 1e3);
    costs.activation_bytes.push_back(static_cast<double>(stage.memory.activations) /
                                     static_cast<double>(stage.in_flight));
    costs.static_bytes.push_back(static_cast<double>(stage.memory.weights + stage.memory.gradients +
                                                     stage.memory.optimizer));
  }
  return costs;
}

plan::Plan write_plan_dir(plan::Plan plan, const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  for (plan::Stage& stage : plan.stages) {
    std::string path = (fs::path(dir) / stage.file).string();
    write_text(path, fmt::format("stage {} bytes (not a real ONNX model)", stage.index));
    stage.file_hash = plan::file_hash(path);
  }
  schedule::PipelineShape shape{plan.devices, plan.chunks, plan.microbatches, plan.training};
  shape.placement = schedule::placement_of(plan.schedule);
  schedule::Schedule steps = schedule::build_schedule(plan.schedule, shape);
  const std::string schedule_text = schedule::to_json(steps).dump(1) + "\n";
  plan.schedule_hash = plan::json_hash(nlohmann::json::parse(schedule_text));
  write_text((fs::path(dir) / "plan.json").string(), plan::plan_json_text(plan::to_json(plan)));
  write_text((fs::path(dir) / "schedule.json").string(), schedule_text);
  return plan;
}

void edit_file(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::string content = text.str();
  size_t at = content.find(from);
  if (at == std::string::npos) throw std::runtime_error("'" + from + "' is not in " + path);
  content.replace(at, from.size(), to);
  write_text(path, content);
}

}  // namespace stagecraft::testing
