#include "runtime/format/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <optional>
#include <utility>

#include "runtime/format/error.h"

namespace stagecraft::schedule {
namespace {

constexpr std::array<std::pair<Op, std::string_view>, 11> kOpNames = {{
    {Op::kRecvAct, "RECV_ACT"},
    {Op::kForward, "FWD"},
    {Op::kSendAct, "SEND_ACT"},
    {Op::kRecvGrad, "RECV_GRAD"},
    {Op::kBackward, "BWD"},
    {Op::kBackwardInput, "BWD_INPUT"},
    {Op::kBackwardWeight, "BWD_WEIGHT"},
    {Op::kSendGrad, "SEND_GRAD"},
    {Op::kAllReduce, "ALLREDUCE"},
    {Op::kAllReduceShared, "ALLREDUCE_SHARED"},
    {Op::kOptimizerStep, "OPT_STEP"},
}};

[[noreturn]] void json_error(const std::string& field, const std::string& problem) {
  fail(ErrorKind::kFormat, "schedule.json: field '{}' {}", field, problem);
}

/// The integer field `name` of `object` (at `path`), or `fallback` when it is absent.
int int_field(const nlohmann::json& object, const char* name, const std::string& path,
              std::optional<int> fallback) {
  auto it = object.find(name);
  if (it == object.end()) {
    if (!fallback) json_error(path + name, "is missing");
    return *fallback;
  }
  if (!it->is_number_integer()) {
    json_error(path + name, fmt::format("must be an integer, not {}", it->dump()));
  }
  return it->get<int>();
}

/// The op named `name`, or a format error naming the field `field`.
Op op_named(const std::string& name, const std::string& field) {
  for (const auto& [value, known] : kOpNames) {
    if (known == name) return value;
  }
  json_error(field, fmt::format("is not a known op: '{}'", name));
}

}  // namespace

bool holds_shared(const PipelineShape& shape, int stage) {
  for (const std::vector<int>& group : shape.shared_groups)
    if (std::find(group.begin(), group.end(), stage) != group.end()) return true;
  return false;
}

void check_shared_groups(const PipelineShape& shape, ErrorKind kind) {
  int stages = stage_count(shape);
  for (size_t g = 0; g < shape.shared_groups.size(); ++g) {
    const std::vector<int>& group = shape.shared_groups[g];
    bool ordered = group.size() >= 2 && group.front() >= 0 && group.back() < stages;
    for (size_t i = 1; i < group.size(); ++i) ordered &= group[i - 1] < group[i];
    if (!ordered)
      fail(kind, "shared weight group {} is [{}]; it needs two or more stages of 0..{}, ascending",
           g, fmt::join(group, ","), stages - 1);
  }
}

std::vector<int> shared_partners(const PipelineShape& shape, int stage) {
  std::vector<int> partners;
  for (const std::vector<int>& group : shape.shared_groups)
    if (std::find(group.begin(), group.end(), stage) != group.end())
      partners.insert(partners.end(), group.begin(), group.end());
  std::sort(partners.begin(), partners.end());
  partners.erase(std::unique(partners.begin(), partners.end()), partners.end());
  return partners;
}

void check_schedule_shape(ScheduleKind kind, const PipelineShape& shape, ErrorKind error) {
  std::string_view name = to_string(kind);
  auto at_least_one = [error](int value, const char* what) {
    if (value < 1) fail(error, "pipeline needs at least 1 {}, not {}", what, value);
  };
  at_least_one(shape.devices, "device");
  at_least_one(shape.chunks, "chunk per device");
  at_least_one(shape.microbatches, "microbatch");
  at_least_one(shape.data_parallel, "data-parallel replica");
  if (kind == ScheduleKind::kCustom) {
    // Any order of forwards and backwards over any chunk count: validate_schedule checks it.
    check_shared_groups(shape, error);
    return;
  }
  if (fixed_chunks(kind) == 2 && shape.chunks != 2) {
    fail(error,
         "schedule '{}' runs 2 chunks per device (device i holds stages i and 2P-1-i), not {}",
         name, shape.chunks);
  }
  if (fixed_chunks(kind) == 1 && shape.chunks != 1) {
    fail(error, "schedule '{}' runs 1 chunk per device, not {}; use 'interleaved'", name,
         shape.chunks);
  }
  if (shape.placement != placement_of(kind)) {
    fail(error, "schedule '{}' places its stages {}, but the pipeline's placement is {}", name,
         placement_of(kind) == Placement::kV ? "in a V" : "round-robin",
         shape.placement == Placement::kV ? "a V" : "round-robin");
  }
  if (kind == ScheduleKind::kInterleaved && shape.microbatches % shape.devices != 0) {
    fail(error,
         "schedule 'interleaved' needs the microbatches (M={}) to be a multiple of the devices "
         "(P={})",
         shape.microbatches, shape.devices);
  }
  if (kind == ScheduleKind::kInference && shape.training) {
    fail(error,
         "schedule 'inference' runs forwards only; a training plan needs {}, {}, {}, {}, {} or {}",
         to_string(ScheduleKind::kGPipe), to_string(ScheduleKind::k1F1B),
         to_string(ScheduleKind::kInterleaved), to_string(ScheduleKind::kZBH1),
         to_string(ScheduleKind::kZBV), to_string(ScheduleKind::kDualPipeV));
  }
  if (kind != ScheduleKind::kInference && !shape.training) {
    fail(error, "schedule '{}' is for training; an inference plan uses 'inference'", name);
  }
  if (kind == ScheduleKind::kDualPipeV && shape.microbatches / 2 < shape.devices) {
    // DeepSeek's DualPipeV and torch's ScheduleDualPipeV both need M >= 2P: device 0 warms up
    // with 2P - 1 forwards before its first backward, and the order has no slots to leave idle.
    fail(error,
         "schedule 'dualpipev' needs at least twice as many microbatches as devices (M >= 2P = "
         "{}), not M={} on P={}",
         2 * int64_t{shape.devices}, shape.microbatches, shape.devices);
  }
  check_shared_groups(shape, error);
}

int stage_count(const PipelineShape& shape) { return shape.devices * shape.chunks; }

int link_capacity(const PipelineShape& shape) { return shape.training ? kTrainingLinkCapacity : 1; }

Placement placement_of(ScheduleKind kind) {
  return kind == ScheduleKind::kZBV || kind == ScheduleKind::kDualPipeV ? Placement::kV
                                                                        : Placement::kRoundRobin;
}

int fixed_chunks(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kInterleaved:
    case ScheduleKind::kCustom:
      return 0;
    case ScheduleKind::kZBV:
    case ScheduleKind::kDualPipeV:
      return 2;
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B:
    case ScheduleKind::kZBH1:
    case ScheduleKind::kInference:
      return 1;
  }
  return 1;
}

int device_of_stage(int stage, int devices, ScheduleKind kind) {
  PipelineShape shape{devices, fixed_chunks(kind), 1, true};
  shape.placement = placement_of(kind);
  return device_of_stage(stage, shape);
}

int stage_of_chunk(int device, int chunk, const PipelineShape& shape) {
  if (shape.placement == Placement::kV && chunk == 1) return 2 * shape.devices - 1 - device;
  return chunk * shape.devices + device;
}

std::string to_string(Op op) {
  for (const auto& [value, name] : kOpNames) {
    if (value == op) return std::string(name);
  }
  return "UNKNOWN_OP";
}

Op parse_op(std::string_view name) {
  for (const auto& [value, known] : kOpNames) {
    if (known == name) return value;
  }
  fail(ErrorKind::kFormat, "unknown schedule op '{}'", name);
}

std::string to_string(const Instruction& instruction) {
  std::string text = fmt::format("{} stage {}", to_string(instruction.op), instruction.stage);
  if (!is_step_level(instruction.op)) text += fmt::format(" mb {}", instruction.microbatch);
  if (instruction.op == Op::kRecvAct || instruction.op == Op::kRecvGrad) {
    text += fmt::format(" from stage {}", instruction.peer_stage);
  } else if (instruction.op == Op::kSendAct || instruction.op == Op::kSendGrad) {
    text += fmt::format(" to stage {}", instruction.peer_stage);
  }
  return text;
}

nlohmann::json to_json(const Schedule& schedule) {
  nlohmann::json devices = nlohmann::json::array();
  for (size_t device = 0; device < schedule.size(); ++device) {
    nlohmann::json instructions = nlohmann::json::array();
    for (const Instruction& instruction : schedule[device]) {
      nlohmann::json entry = {{"op", to_string(instruction.op)}, {"stage", instruction.stage}};
      if (!is_step_level(instruction.op)) entry["mb"] = instruction.microbatch;
      if (is_transfer(instruction.op)) entry["peer"] = instruction.peer_stage;
      instructions.push_back(std::move(entry));
    }
    devices.push_back({{"device", device}, {"instructions", std::move(instructions)}});
  }
  return {{"devices", std::move(devices)}};
}

Schedule schedule_from_json(const nlohmann::json& body) {
  auto devices = body.find("devices");
  if (!body.is_object() || devices == body.end() || !devices->is_array()) {
    json_error("devices", "must be an array of devices");
  }
  Schedule schedule(devices->size());
  for (size_t index = 0; index < devices->size(); ++index) {
    const nlohmann::json& device = (*devices)[index];
    std::string path = fmt::format("devices[{}].", index);
    if (!device.is_object()) json_error(path, "must be an object");
    if (int_field(device, "device", path, std::nullopt) != static_cast<int>(index)) {
      json_error(path + "device", fmt::format("must be {} (devices are listed in order)", index));
    }
    auto instructions = device.find("instructions");
    if (instructions == device.end() || !instructions->is_array()) {
      json_error(path + "instructions", "must be an array");
    }
    for (size_t position = 0; position < instructions->size(); ++position) {
      const nlohmann::json& entry = (*instructions)[position];
      std::string at = fmt::format("{}instructions[{}].", path, position);
      auto op = entry.is_object() ? entry.find("op") : entry.end();
      if (op == entry.end() || !op->is_string()) json_error(at + "op", "must be a string");
      Instruction instruction{op_named(op->get<std::string>(), at + "op"),
                              int_field(entry, "stage", at, std::nullopt), -1, -1};
      instruction.microbatch = int_field(
          entry, "mb", at, is_step_level(instruction.op) ? std::optional(-1) : std::nullopt);
      instruction.peer_stage = int_field(
          entry, "peer", at, is_transfer(instruction.op) ? std::nullopt : std::optional(-1));
      schedule[index].push_back(instruction);
    }
  }
  return schedule;
}

}  // namespace stagecraft::schedule
