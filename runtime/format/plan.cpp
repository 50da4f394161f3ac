// The plan format: plan.json written and read field by field, and the loader that validates it
// (plan_validate.cpp) and checks the stage files against their recorded hashes.
//
// Reading is strict (runtime/format/json_reader.h): every field of plan.h is required, an
// unknown field is refused (a misspelt one would otherwise read as a default), and each error
// names the file and the field path ("stages[2].inputs[0].shape[1]").
#include "runtime/format/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "runtime/format/bytes.h"
#include "runtime/format/error.h"
#include "runtime/format/instruction_costs.h"
#include "runtime/format/json_reader.h"
#include "runtime/format/processors.h"
#include "runtime/format/weights_hash.h"

namespace stagecraft::plan {
namespace {

namespace fs = std::filesystem;

/// The vocabulary value `field` names ("field 'schedule' is 'pipedream'; valid: gpipe, ...").
template <typename Kind>
Kind read_name(const JsonObject& f, std::string_view field,
               std::optional<Kind> (*find)(std::string_view),
               const std::vector<std::string_view>& valid) {
  std::string name = f.string(field);
  std::optional<Kind> kind = find(name);
  if (!kind) f.fail(field, fmt::format("is '{}'; valid: {}", name, fmt::join(valid, ", ")));
  return *kind;
}
using ordered = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------
// Writing

/// A stage's anatomy: parts without a total (the figure to add up is a device's, below).
ordered memory_json(const MemoryBytes& memory) {
  return {{"weights", memory.weights},     {"gradients", memory.gradients},
          {"optimizer", memory.optimizer}, {"activations", memory.activations},
          {"temporary", memory.temporary}, {"communication", memory.communication}};
}

ordered peak_parts_json(const PeakParts& parts) {
  return {{"weights", parts.weights},       {"gradients", parts.gradients},
          {"optimizer", parts.optimizer},   {"activations", parts.activations},
          {"recomputed", parts.recomputed}, {"deferred", parts.deferred},
          {"arena", parts.arena},           {"communication", parts.communication}};
}

ordered device_memory_json(const std::vector<DevicePeak>& devices) {
  ordered list = ordered::array();
  for (const DevicePeak& d : devices)
    list.push_back({{"device", d.device},
                    {"peak_bytes", d.peak_bytes},
                    {"peak_ms", d.peak_ms},
                    {"in_flight", d.in_flight},
                    {"parts", peak_parts_json(d.parts)},
                    {"time_ms", d.time_ms},
                    {"bytes", d.bytes}});
  return list;
}

/// Inputs carry `peer_stage`; outputs carry `peer_stages` and `graph_output`.
ordered tensor_json(const StageTensor& tensor, bool is_input) {
  ordered json = {{"name", tensor.name}, {"dtype", tensor.dtype}, {"shape", tensor.shape}};
  if (is_input) {
    json["peer_stage"] = tensor.peer_stage;
  } else {
    json["peer_stages"] = tensor.peer_stages;
    json["graph_output"] = tensor.graph_output;
  }
  json["bytes"] = tensor.bytes;
  return json;
}

ordered tensors_json(const std::vector<StageTensor>& tensors, bool is_input) {
  ordered list = ordered::array();
  for (const StageTensor& tensor : tensors) list.push_back(tensor_json(tensor, is_input));
  return list;
}

ordered training_json(const TrainingConfig& c) {
  ordered json = {{"loss", c.loss},
                  {"loss_output", c.loss_output},
                  {"labels", c.labels},
                  {"lr", c.lr},
                  {"lr_scaling", c.lr_scaling},
                  {"base_lr", c.base_lr},
                  {"weight_decay", c.weight_decay},
                  {"momentum", c.momentum},
                  {"beta1", c.beta1},
                  {"beta2", c.beta2},
                  {"epsilon", c.epsilon},
                  {"lr_schedule", c.lr_schedule},
                  {"warmup_steps", c.warmup_steps},
                  {"total_steps", c.total_steps}};
  if (c.clip_grad_norm > 0) json["clip_grad_norm"] = c.clip_grad_norm;
  return json;
}

ordered arena_json(const Stage& stage) {
  ordered tensors = ordered::array();
  for (const ArenaTensor& t : stage.arena)
    tensors.push_back({{"name", t.name}, {"offset", t.offset}, {"bytes", t.bytes}});
  return {{"bytes", stage.arena_bytes}, {"tensors", tensors}};
}

ordered shared_json(const std::vector<SharedWeight>& shared) {
  ordered list = ordered::array();
  for (const SharedWeight& w : shared)
    list.push_back(
        {{"name", w.name}, {"dtype", w.dtype}, {"shape", w.shape}, {"stages", w.stages}});
  return list;
}

ordered device_json(const DeviceSpec& device) {
  ordered j{{"name", device.name},
            {"kind", to_string(device.kind)},
            {"memory_bytes", device.memory_bytes}};
  if (device.memory_bandwidth > 0) {
    j["peak_flops_fp32"] = device.peak_flops_fp32;
    j["peak_flops_fp16"] = device.peak_flops_fp16;
    j["memory_bandwidth"] = device.memory_bandwidth;
  }
  return j;
}

ordered cluster_json(const ClusterSpec& cluster) {
  auto link = [](const LinkSpec& l) {
    return ordered{{"bandwidth", l.bandwidth}, {"latency_s", l.latency_s}};
  };
  return {{"devices_per_node", cluster.devices_per_node},
          {"intra_node", link(cluster.intra_node)},
          {"inter_node", link(cluster.inter_node)},
          {"devices_per_processor", cluster.devices_per_processor}};
}

ordered timeline_json(const std::vector<schedule::TimelineEvent>& events) {
  ordered list = ordered::array();
  for (const schedule::TimelineEvent& e : events) {
    list.push_back({{"device", e.device},
                    {"op", schedule::to_string(e.op)},
                    {"stage", e.stage},
                    {"microbatch", e.microbatch},
                    {"start_ms", e.start_s * 1e3},
                    {"end_ms", e.end_s * 1e3}});
  }
  return list;
}

ordered stage_json(const Stage& stage) {
  return {{"index", stage.index},
          {"device", stage.device},
          {"chunk", stage.chunk},
          {"file", stage.file},
          {"file_hash", stage.file_hash},
          {"backward_file", stage.backward_file},
          {"backward_file_hash", stage.backward_file_hash},
          {"weights_bytes", stage.weights_bytes},
          {"weights_hash", stage.weights_hash},
          {"nodes", stage.nodes},
          {"params", stage.params},
          {"inputs", tensors_json(stage.inputs, true)},
          {"outputs", tensors_json(stage.outputs, false)},
          {"fwd_ms", stage.fwd_ms},
          {"bwd_ms", stage.bwd_ms},
          {"backward_input_ms", stage.backward_input_ms},
          {"backward_weight_ms", stage.backward_weight_ms},
          {"optimizer_ms", stage.optimizer_ms},
          {"send_ms", stage.send_ms},
          {"in_flight", stage.in_flight},
          {"recompute", stage.recompute},
          {"memory", memory_json(stage.memory)},
          {"arena", arena_json(stage)},
          {"backward_arena_bytes", stage.backward_arena_bytes},
          {"shared_weights", shared_json(stage.shared_weights)},
          {"shared_exchange_ms", stage.shared_exchange_ms},
          {"allreduce_ms", stage.allreduce_ms},
          {"optimizer_shards", stage.optimizer_shards},
          {"allgather_ms", stage.allgather_ms},
          {"why", stage.why}};
}

ordered op_json(const OpRecord& op) {
  return {{"name", op.name},
          {"op_type", op.op_type},
          {"stage", op.stage},
          {"fwd_ms", op.fwd_ms},
          {"bwd_ms", op.bwd_ms},
          {"flops", op.flops},
          {"param_bytes", op.param_bytes},
          {"output_bytes", op.output_bytes}};
}

ordered prediction_json(const Prediction& prediction) {
  return {{"step_ms", prediction.step_ms},
          {"bubble_fraction", prediction.bubble_fraction},
          {"samples_per_s", prediction.samples_per_s},
          {"peak_memory_bytes", prediction.peak_memory_bytes},
          {"device_busy_ms", prediction.device_busy_ms},
          {"device_peak_bytes", prediction.device_peak_bytes},
          {"split_after", prediction.split_after},
          {"fits", prediction.fits}};
}

ordered search_json(const SplitSearch& search) {
  return {{"candidates", search.candidates},
          {"pruned", search.pruned},
          {"bottleneck_step_ms", search.bottleneck_step_ms},
          {"bottleneck_fits", search.bottleneck_fits},
          {"bottleneck_split_after", search.bottleneck_split_after}};
}

// ---------------------------------------------------------------------------------------------
// Reading

MemoryBytes read_memory(const JsonObject& stage) {
  JsonObject f = stage.object(
      "memory", {"weights", "gradients", "optimizer", "activations", "temporary", "communication"});
  return {f.int64("weights"),     f.int64("gradients"), f.int64("optimizer"),
          f.int64("activations"), f.int64("temporary"), f.int64("communication")};
}

DevicePeak read_device_peak(const JsonValue& value) {
  JsonObject f =
      value.object({"device", "peak_bytes", "peak_ms", "in_flight", "parts", "time_ms", "bytes"});
  DevicePeak d;
  d.device = f.int32("device");
  d.peak_bytes = f.int64("peak_bytes");
  d.peak_ms = f.number("peak_ms");
  d.in_flight = f.int64("in_flight");
  JsonObject p = f.object("parts", {"weights", "gradients", "optimizer", "activations",
                                    "recomputed", "deferred", "arena", "communication"});
  d.parts = {p.int64("weights"),     p.int64("gradients"),    p.int64("optimizer"),
             p.int64("activations"), p.int64("recomputed"),   p.int64("deferred"),
             p.int64("arena"),       p.int64("communication")};
  d.time_ms = f.at("time_ms").numbers();
  d.bytes = f.at("bytes").int64s();
  return d;
}

StageTensor read_tensor(const JsonValue& value, bool is_input) {
  JsonObject f =
      is_input ? value.object({"name", "dtype", "shape", "peer_stage", "bytes"})
               : value.object({"name", "dtype", "shape", "peer_stages", "graph_output", "bytes"});
  StageTensor tensor;
  tensor.name = f.string("name");
  tensor.dtype = f.string("dtype");
  tensor.shape = f.at("shape").int64s();
  if (is_input) {
    tensor.peer_stage = f.int32("peer_stage");
  } else {
    tensor.peer_stages = f.at("peer_stages").int32s();
    tensor.graph_output = f.boolean("graph_output");
  }
  tensor.bytes = f.int64("bytes");
  return tensor;
}

SharedWeight read_shared(const JsonValue& value) {
  JsonObject s = value.object({"name", "dtype", "shape", "stages"});
  return SharedWeight{s.string("name"), s.string("dtype"), s.at("shape").int64s(),
                      s.at("stages").int32s()};
}

Stage read_stage(const JsonValue& value) {
  JsonObject f = value.object({"index",
                               "device",
                               "chunk",
                               "file",
                               "file_hash",
                               "backward_file",
                               "backward_file_hash",
                               "weights_bytes",
                               "weights_hash",
                               "nodes",
                               "params",
                               "inputs",
                               "outputs",
                               "fwd_ms",
                               "bwd_ms",
                               "backward_input_ms",
                               "backward_weight_ms",
                               "optimizer_ms",
                               "send_ms",
                               "in_flight",
                               "recompute",
                               "memory",
                               "arena",
                               "backward_arena_bytes",
                               "shared_weights",
                               "shared_exchange_ms",
                               "allreduce_ms",
                               "optimizer_shards",
                               "allgather_ms",
                               "why"});
  Stage stage;
  stage.index = f.int32("index");
  stage.device = f.int32("device");
  stage.chunk = f.int32("chunk");
  stage.file = f.string("file");
  stage.file_hash = f.string("file_hash");
  stage.backward_file = f.string("backward_file");
  stage.backward_file_hash = f.string("backward_file_hash");
  stage.weights_bytes = f.int64("weights_bytes");
  stage.weights_hash = f.string("weights_hash");
  stage.nodes = f.at("nodes").strings();
  stage.params = f.int64("params");
  stage.inputs = f.array("inputs", [](const JsonValue& v) { return read_tensor(v, true); });
  stage.outputs = f.array("outputs", [](const JsonValue& v) { return read_tensor(v, false); });
  stage.fwd_ms = f.number("fwd_ms");
  stage.bwd_ms = f.number("bwd_ms");
  stage.backward_input_ms = f.number("backward_input_ms");
  stage.backward_weight_ms = f.number("backward_weight_ms");
  stage.optimizer_ms = f.number("optimizer_ms");
  stage.send_ms = f.number("send_ms");
  stage.in_flight = f.int64("in_flight");
  stage.recompute = f.boolean("recompute");
  stage.memory = read_memory(f);
  JsonObject arena = f.object("arena", {"bytes", "tensors"});
  stage.arena_bytes = arena.int64("bytes");
  stage.arena = arena.array("tensors", [](const JsonValue& v) {
    JsonObject t = v.object({"name", "offset", "bytes"});
    return ArenaTensor{t.string("name"), t.int64("offset"), t.int64("bytes")};
  });
  stage.backward_arena_bytes = f.int64("backward_arena_bytes");
  stage.shared_weights = f.array("shared_weights", read_shared);
  stage.shared_exchange_ms = f.number("shared_exchange_ms");
  stage.allreduce_ms = f.number("allreduce_ms");
  stage.optimizer_shards = f.at("optimizer_shards").int64s();
  stage.allgather_ms = f.number("allgather_ms");
  stage.why = f.string("why");
  return stage;
}

OpRecord read_op(const JsonValue& value) {
  JsonObject f = value.object(
      {"name", "op_type", "stage", "fwd_ms", "bwd_ms", "flops", "param_bytes", "output_bytes"});
  return {f.string("name"),   f.string("op_type"), f.int32("stage"),       f.number("fwd_ms"),
          f.number("bwd_ms"), f.number("flops"),   f.int64("param_bytes"), f.int64("output_bytes")};
}

Prediction read_prediction(const JsonObject& top, std::string_view name) {
  JsonObject f =
      top.object(name, {"step_ms", "bubble_fraction", "samples_per_s", "peak_memory_bytes",
                        "device_busy_ms", "device_peak_bytes", "split_after", "fits"});
  Prediction prediction;
  prediction.step_ms = f.number("step_ms");
  prediction.bubble_fraction = f.number("bubble_fraction");
  prediction.samples_per_s = f.number("samples_per_s");
  prediction.peak_memory_bytes = f.int64("peak_memory_bytes");
  prediction.device_busy_ms = f.at("device_busy_ms").numbers();
  prediction.device_peak_bytes = f.at("device_peak_bytes").int64s();
  prediction.split_after = f.at("split_after").strings();
  prediction.fits = f.boolean("fits");
  return prediction;
}

SplitSearch read_search(const JsonObject& top) {
  SplitSearch search;
  JsonObject f = top.object(
      "search",
      {"candidates", "pruned", "bottleneck_step_ms", "bottleneck_fits", "bottleneck_split_after"});
  search.candidates = f.int64("candidates");
  if (f.has("pruned")) search.pruned = f.int64("pruned");
  search.bottleneck_step_ms = f.number("bottleneck_step_ms");
  search.bottleneck_fits = f.boolean("bottleneck_fits");
  search.bottleneck_split_after = f.at("bottleneck_split_after").strings();
  return search;
}

schedule::TimelineEvent read_event(const JsonValue& value) {
  JsonObject f = value.object({"device", "op", "stage", "microbatch", "start_ms", "end_ms"});
  JsonValue op = f.at("op");
  const std::string name = op.string();
  schedule::Op parsed{};
  try {
    parsed = schedule::parse_op(name);
  } catch (const Error&) {
    op.fail(fmt::format("is '{}', not a schedule op", name));
  }
  return {f.int32("device"),          parsed,
          f.int32("stage"),           f.int32("microbatch"),
          f.number("start_ms") / 1e3, f.number("end_ms") / 1e3};
}

DeviceSpec read_device(const JsonObject& top) {
  JsonObject f = top.object("device", {"name", "kind", "memory_bytes", "peak_flops_fp32",
                                       "peak_flops_fp16", "memory_bandwidth"});
  DeviceSpec device{f.string("name"), read_name(f, "kind", find_device_kind, device_kind_names()),
                    f.int64("memory_bytes")};
  // The rates come together or not at all (plans before them have none).
  if (f.has("memory_bandwidth") || f.has("peak_flops_fp32") || f.has("peak_flops_fp16")) {
    device.peak_flops_fp32 = f.positive_number("peak_flops_fp32");
    device.peak_flops_fp16 = f.positive_number("peak_flops_fp16");
    device.memory_bandwidth = f.positive_number("memory_bandwidth");
  }
  return device;
}

ClusterSpec read_cluster(const JsonObject& top) {
  JsonObject f = top.object(
      "cluster", {"devices_per_node", "intra_node", "inter_node", "devices_per_processor"});
  auto link = [&](std::string_view name) {
    JsonObject l = f.object(name, {"bandwidth", "latency_s"});
    return LinkSpec{l.number("bandwidth"), l.number("latency_s")};
  };
  return {f.int32("devices_per_node"), link("intra_node"), link("inter_node"),
          f.int32("devices_per_processor")};
}

TrainingConfig read_training(const JsonObject& top) {
  JsonObject t = top.object("training_config",
                            {"loss", "loss_output", "labels", "lr", "lr_scaling", "base_lr",
                             "weight_decay", "momentum", "beta1", "beta2", "epsilon", "lr_schedule",
                             "warmup_steps", "total_steps", "clip_grad_norm"});
  TrainingConfig c;
  c.loss = t.string("loss");
  c.loss_output = t.string("loss_output");
  c.labels = t.string("labels");
  c.lr = t.number("lr");
  c.lr_scaling =
      std::string(to_string(read_name(t, "lr_scaling", find_lr_scaling, lr_scaling_names())));
  c.base_lr = t.number("base_lr");
  c.weight_decay = t.number("weight_decay");
  c.momentum = t.number("momentum");
  c.beta1 = t.number("beta1");
  c.beta2 = t.number("beta2");
  c.epsilon = t.number("epsilon");
  c.lr_schedule = t.string("lr_schedule");
  c.warmup_steps = t.int64("warmup_steps");
  c.total_steps = t.int64("total_steps");
  // Optional (plans without clipping leave it out); when present, a finite C > 0.
  if (t.has("clip_grad_norm")) c.clip_grad_norm = t.positive_number("clip_grad_norm");
  return c;
}

}  // namespace

int64_t PeakParts::total() const {
  int64_t sum = 0;
  for (int64_t part :
       {weights, gradients, optimizer, activations, recomputed, deferred, arena, communication}) {
    if (__builtin_add_overflow(sum, part, &sum)) {
      fail(ErrorKind::kPlan, "memory total overflows int64");
    }
  }
  return sum;
}

std::string describe_parts(const DevicePeak& peak) {
  const PeakParts& p = peak.parts;
  std::vector<std::string> parts;
  auto add = [&](const char* what, int64_t bytes, const std::string& suffix = "") {
    if (bytes != 0)
      parts.push_back(
          fmt::format("{} {}{}", what, format_bytes(static_cast<double>(bytes)), suffix));
  };
  add("weights", p.weights);
  add("gradients", p.gradients);
  add("optimizer", p.optimizer);
  add("activations", p.activations, fmt::format(" for {} in flight", peak.in_flight));
  add("recomputed", p.recomputed);
  add("deferred", p.deferred);
  add("arena", p.arena);
  add("communication", p.communication);
  return parts.empty() ? "nothing" : fmt::format("{}", fmt::join(parts, ", "));
}

int64_t MemoryBytes::total() const {
  int64_t sum = 0;
  for (int64_t part : {weights, gradients, optimizer, activations, temporary, communication}) {
    if (__builtin_add_overflow(sum, part, &sum)) {
      fail(ErrorKind::kPlan, "memory total overflows int64");
    }
  }
  return sum;
}

nlohmann::ordered_json to_json(const Plan& plan) {
  ordered stages = ordered::array();
  for (const Stage& stage : plan.stages) stages.push_back(stage_json(stage));
  ordered ops = ordered::array();
  for (const OpRecord& op : plan.ops) ops.push_back(op_json(op));
  ordered weight_files = ordered::array();
  for (const WeightFile& w : plan.weight_files)
    weight_files.push_back({{"location", w.location}, {"path", w.path}, {"bytes", w.bytes}});
  ordered out{{"format_version", plan.format_version},
              {"generator", plan.generator},
              {"model_path", plan.model_path},
              {"model_hash", plan.model_hash},
              {"schedule_hash", plan.schedule_hash},
              {"objective", std::string(to_string(plan.objective))},
              {"schedule", std::string(to_string(plan.schedule))},
              {"devices", plan.devices},
              {"chunks", plan.chunks},
              {"microbatches", plan.microbatches},
              {"data_parallel", plan.data_parallel},
              {"placement", plan.placement},
              {"shard_optimizer", plan.shard_optimizer},
              {"batch", plan.batch},
              {"microbatch_size", plan.microbatch_size},
              {"training", plan.training},
              {"optimizer", std::string(to_string(plan.optimizer))},
              {"training_config", training_json(plan.training_config)},
              {"precision", std::string(to_string(plan.precision))},
              {"cost_model", plan.cost_model},
              {"device", device_json(plan.device)},
              {"cluster", cluster_json(plan.cluster)},
              {"processors", processors_json(plan.processors)},
              {"predicted", prediction_json(plan.predicted)},
              {"baseline_parameters", prediction_json(plan.baseline_parameters)},
              {"baseline_uniform", prediction_json(plan.baseline_uniform)},
              {"search", search_json(plan.search)},
              {"stages", std::move(stages)},
              {"weight_files", std::move(weight_files)},
              {"ops", std::move(ops)},
              {"device_memory", device_memory_json(plan.device_memory)},
              {"timeline", timeline_json(plan.timeline)}};
  if (!plan.auto_search.empty()) out["auto_search"] = auto_search_json(plan.auto_search);
  return out;
}

Plan plan_from_json(const nlohmann::json& json, const std::string& source) {
  JsonObject f = JsonValue(json, source).object();
  // The version first: a newer plan may differ in any other field.
  Plan plan;
  plan.format_version = f.int32("format_version");
  check_format_version(plan.format_version, source);
  f.only({"format_version",
          "plan_hash",
          "schedule_hash",
          "generator",
          "model_path",
          "model_hash",
          "objective",
          "schedule",
          "devices",
          "chunks",
          "microbatches",
          "data_parallel",
          "placement",
          "shard_optimizer",
          "batch",
          "microbatch_size",
          "training",
          "optimizer",
          "training_config",
          "precision",
          "cost_model",
          "device",
          "cluster",
          "processors",
          "predicted",
          "baseline_parameters",
          "baseline_uniform",
          "search",
          "auto_search",
          "instruction_costs",
          "stages",
          "weight_files",
          "ops",
          "device_memory",
          "timeline"});
  plan.generator = f.string("generator");
  plan.model_path = f.string("model_path");
  plan.model_hash = f.string("model_hash");
  plan.schedule_hash = f.string("schedule_hash");
  plan.objective = read_name(f, "objective", find_objective, objective_names());
  plan.schedule = read_name(f, "schedule", find_schedule, schedule_names());
  plan.devices = f.int32("devices");
  plan.chunks = f.int32("chunks");
  plan.microbatches = f.int32("microbatches");
  plan.data_parallel = f.int32("data_parallel");
  plan.placement = f.array("placement", [](const JsonValue& v) { return v.int32(); });
  plan.shard_optimizer = f.boolean("shard_optimizer");
  plan.batch = f.int64("batch");
  plan.microbatch_size = f.int64("microbatch_size");
  plan.training = f.boolean("training");
  plan.optimizer = read_name(f, "optimizer", find_optimizer, optimizer_names());
  plan.training_config = read_training(f);
  plan.precision = read_name(f, "precision", find_precision, precision_names());
  plan.cost_model = f.string("cost_model");
  plan.device = read_device(f);
  plan.cluster = read_cluster(f);
  plan.processors = read_processors(f);
  plan.predicted = read_prediction(f, "predicted");
  plan.baseline_parameters = read_prediction(f, "baseline_parameters");
  plan.baseline_uniform = read_prediction(f, "baseline_uniform");
  plan.search = read_search(f);
  plan.auto_search = read_auto_search(f);
  // Checked here; the compiler writes it, stagedump shows it; the timeline check reads this.
  plan.step_overhead_ms = read_instruction_costs(f).step_overhead_ms;
  plan.device_memory = f.array("device_memory", read_device_peak);
  plan.stages = f.array("stages", read_stage);
  plan.weight_files = f.array("weight_files", [](const JsonValue& v) {
    JsonObject w = v.object({"location", "path", "bytes"});
    return WeightFile{w.string("location"), w.string("path"), w.int64("bytes")};
  });
  plan.ops = f.array("ops", read_op);
  plan.timeline = f.array("timeline", read_event);
  return plan;
}

std::vector<int> pipeline_major_placement(int replicas, int devices) {
  std::vector<int> ranks;
  for (int g = 0; g < replicas * devices; ++g) ranks.push_back(g);
  return ranks;
}

std::vector<int> replica_major_placement(int replicas, int devices) {
  std::vector<int> ranks;
  for (int r = 0; r < replicas; ++r)
    for (int d = 0; d < devices; ++d) ranks.push_back(d * replicas + r);
  return ranks;
}

std::vector<int64_t> even_shards(int64_t elements, int replicas) {
  std::vector<int64_t> bounds;
  for (int r = 0; r <= replicas; ++r)
    bounds.push_back(elements / replicas * r + elements % replicas * r / replicas);  // no overflow
  return bounds;
}

void check_format_version(int version, const std::string& source) {
  if (version == kPlanFormatVersion) return;
  // An older plan lacks what this runtime checks (its device, the predicted timeline): the
  // model and the flags that made it make it again.
  throw Error(
      ErrorKind::kUnsupported,
      fmt::format("field 'format_version' is {}; this build reads version {}{}", version,
                  kPlanFormatVersion,
                  version < kPlanFormatVersion ? " (re-run stagec to write the plan again)" : ""))
      .in(source);
}

namespace {

/// Each of the plan's external weight files is where it was, at the size it had.
void check_weight_files(const Plan& plan, const std::string& source) {
  for (size_t i = 0; i < plan.weight_files.size(); ++i) {
    const WeightFile& w = plan.weight_files[i];
    std::error_code ec;
    const std::string field = fmt::format("weight_files[{}]", i);
    if (!fs::is_regular_file(w.path, ec))
      throw Error(ErrorKind::kIo,
                  fmt::format("{} (the model's external data, named by {}'s {}): the plan "
                              "reads the model's weights where they were when it was written; "
                              "plan with stagec --copy-weights to take them along",
                              fs::exists(w.path, ec) ? "is not a regular file" : "is missing",
                              source, field))
          .in(w.path);
    const auto size = static_cast<int64_t>(fs::file_size(w.path, ec));
    if (ec || size != w.bytes)
      throw Error(ErrorKind::kPlan,
                  fmt::format("is {} bytes but {}'s {} recorded {} when the plan was written: the "
                              "model's weights changed since; re-run stagec",
                              ec ? -1 : size, source, field, w.bytes))
          .in(w.path);
  }
}

}  // namespace

std::string plan_file(const std::string& plan_dir, std::string_view name) {
  return (fs::path(plan_dir) / name).string();
}

Plan load_plan(const std::string& plan_dir) {
  fs::path dir(plan_dir);
  std::string path = plan_file(plan_dir, "plan.json");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw Error(ErrorKind::kIo,
                fs::exists(dir, ec) ? "is not a plan directory" : "no such plan directory")
        .in(plan_dir);
  }
  nlohmann::json json = read_json_file(path);
  Plan plan = plan_from_json(json, path);
  validate_plan(plan, path);
  // After the checks that name a field, so an edit they catch is told as precisely as they can;
  // the hash refuses every other change made after stagec wrote the file.
  if (!json.contains("plan_hash") || !json["plan_hash"].is_string()) {
    throw Error(ErrorKind::kPlan,
                "field 'plan_hash' is missing or not a string: stagec writes it; re-run stagec "
                "to write the plan again")
        .in(path);
  }
  const std::string recorded = json["plan_hash"].get<std::string>();
  if (const std::string actual = plan_json_hash(json); actual != recorded) {
    throw Error(ErrorKind::kPlan,
                fmt::format("the content hashes to {} but its field 'plan_hash' is {}: the file "
                            "was changed after stagec wrote it; re-run stagec to make a plan "
                            "from the model and the flags you want",
                            actual, recorded))
        .in(path);
  }

  check_weight_files(plan, path);
  for (const Stage& stage : plan.stages) {
    std::string file = (dir / stage.file).string();
    if (!fs::is_regular_file(file, ec)) {
      throw Error(
          ErrorKind::kIo,
          fmt::format("{} (named by plan.json's stages[{}].file)",
                      fs::exists(file, ec) ? "is not a regular file" : "is missing", stage.index))
          .in(file);
    }
    if (!stage.file_hash.empty()) {
      std::string actual = file_hash(file);
      if (actual != stage.file_hash) {
        throw Error(ErrorKind::kPlan,
                    fmt::format("hash {} does not match plan.json's {}", actual, stage.file_hash))
            .in(file);
      }
    }
    if (stage.backward_file.empty()) continue;
    std::string bwd = (dir / stage.backward_file).string();
    if (!fs::is_regular_file(bwd, ec))
      throw Error(
          ErrorKind::kIo,
          fmt::format("is missing (named by plan.json's stages[{}].backward_file)", stage.index))
          .in(bwd);
    if (file_hash(bwd) != stage.backward_file_hash)
      throw Error(ErrorKind::kPlan, fmt::format("hash {} does not match plan.json's {}",
                                                file_hash(bwd), stage.backward_file_hash))
          .in(bwd);
  }
  return plan;
}

std::string bytes_hash(std::string_view bytes) {
  return fmt::format("{}{:016x}", kHashPrefix,
                     fnv1a(kFnvBasis, reinterpret_cast<const unsigned char*>(bytes.data()),
                           bytes.size()));
}

std::string json_hash(const nlohmann::json& json) { return bytes_hash(json.dump()); }

std::string plan_json_hash(nlohmann::json json) {
  if (json.is_object()) json.erase("plan_hash");
  return json_hash(json);
}

std::string plan_json_text(const nlohmann::ordered_json& json) {
  nlohmann::ordered_json sealed = json;
  sealed.erase("plan_hash");
  const std::string hash = plan_json_hash(nlohmann::json::parse(sealed.dump()));
  // The hash goes right after the version, where a reader sees it first.
  nlohmann::ordered_json out;
  for (auto it = sealed.begin(); it != sealed.end(); ++it) {
    out[it.key()] = it.value();
    if (it.key() == "format_version") out["plan_hash"] = hash;
  }
  if (!out.contains("plan_hash")) out["plan_hash"] = hash;
  return out.dump(1) + "\n";
}

void check_schedule_hash(const nlohmann::json& schedule, const Plan& plan,
                         const std::string& path) {
  const std::string actual = json_hash(schedule);
  if (actual == plan.schedule_hash) return;
  throw Error(ErrorKind::kPlan,
              fmt::format("the content hashes to {} but plan.json's field 'schedule_hash' is {}: "
                          "the file was changed after stagec wrote it; re-run stagec",
                          actual, plan.schedule_hash.empty() ? "empty" : plan.schedule_hash))
      .in(path);
}

std::string file_hash(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  if (!file) {
    throw Error(ErrorKind::kIo, fmt::format("cannot open ({})", std::strerror(errno))).in(path);
  }
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<unsigned char> buffer(kChunk);
  uint64_t hash = kFnvBasis;
  while (size_t read = std::fread(buffer.data(), 1, kChunk, file.get()))
    hash = fnv1a(hash, buffer.data(), read);
  if (std::ferror(file.get())) {
    throw Error(ErrorKind::kIo, fmt::format("read error ({})", std::strerror(errno))).in(path);
  }
  return fmt::format("{}{:016x}", kHashPrefix, hash);
}

}  // namespace stagecraft::plan