#include "tools/dump/view.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>

#include "runtime/format/error.h"
#include "runtime/format/json_reader.h"

namespace stagecraft::dump {
namespace fs = std::filesystem;

PlanView load_view(const std::string& plan_dir) {
  PlanView view;
  view.plan_dir = plan_dir;
  view.plan = plan::load_plan(plan_dir);
  const plan::Plan& plan = view.plan;
  view.shape = {plan.devices, plan.chunks, plan.microbatches, plan.training, plan.data_parallel};
  view.shape.shared_groups = plan::shared_weight_groups(plan);
  view.shape.placement = schedule::placement_of(plan.schedule);
  {
    const std::string plan_path = plan::plan_file(plan_dir, "plan.json");
    const nlohmann::json plan_json = read_json_file(plan_path);
    view.instruction_costs = plan::read_instruction_costs(JsonValue(plan_json, plan_path).object());
  }

  std::string path = plan::plan_file(plan_dir, "schedule.json");
  nlohmann::json body = read_json_file(path);
  // schedule_from_json names "schedule.json" itself; the plan directory goes in front.
  view.schedule = with_context(plan_dir, ErrorKind::kFormat,
                               [&] { return schedule::schedule_from_json(body); });
  with_context(path, ErrorKind::kPlan,
               [&] { schedule::validate_schedule(view.schedule, view.shape); });
  plan::check_schedule_hash(body, plan, path);
  return view;
}

std::vector<CutTensor> tensors_crossing(const plan::Plan& plan, int cut) {
  std::vector<CutTensor> crossing;
  for (int from = 0; from <= cut && from < static_cast<int>(plan.stages.size()); ++from) {
    for (const plan::StageTensor& output : plan.stages[from].outputs) {
      bool read_later = std::any_of(output.peer_stages.begin(), output.peer_stages.end(),
                                    [&](int peer) { return peer > cut; });
      if (read_later) crossing.push_back({&output, from});
    }
  }
  return crossing;
}

std::vector<schedule::TimelineEvent> compute_events(
    const std::vector<schedule::TimelineEvent>& timeline) {
  std::vector<schedule::TimelineEvent> events;
  for (const schedule::TimelineEvent& event : timeline) {
    bool compute = event.op == schedule::Op::kForward || event.op == schedule::Op::kBackward ||
                   event.op == schedule::Op::kBackwardInput ||
                   event.op == schedule::Op::kBackwardWeight ||
                   event.op == schedule::Op::kOptimizerStep;
    if (compute && event.end_s > event.start_s) events.push_back(event);
  }
  std::stable_sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.device != b.device ? a.device < b.device : a.start_s < b.start_s;
  });
  return events;
}

char event_letter(const schedule::TimelineEvent& event, int devices) {
  char letter = 'O';
  switch (event.op) {
    case schedule::Op::kForward:
      letter = 'F';
      break;
    case schedule::Op::kBackward:
    case schedule::Op::kBackwardInput:
      letter = 'B';
      break;
    case schedule::Op::kBackwardWeight:
      letter = 'W';
      break;
    default:
      break;
  }
  bool later_chunk = devices > 0 && event.stage >= devices;
  return later_chunk ? static_cast<char>(letter - 'A' + 'a') : letter;
}

std::string_view event_category(schedule::Op op) {
  switch (op) {
    case schedule::Op::kForward:
      return "forward";
    case schedule::Op::kBackward:
      return "backward";
    case schedule::Op::kBackwardInput:
      return "backward_input";
    case schedule::Op::kBackwardWeight:
      return "backward_weight";
    case schedule::Op::kOptimizerStep:
      return "optimizer";
    default:
      return "communication";
  }
}

std::string with_commas(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  std::string text;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) text += ',';
    text += digits[i];
  }
  return value < 0 ? "-" + text : text;
}

std::string_view stage_colour(int stage) {
  // ColorBrewer's Set3: twelve light colours that black text reads well on.
  constexpr std::array<std::string_view, 12> kColours = {
      "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
      "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"};
  return kColours[static_cast<size_t>(stage) % kColours.size()];
}

std::string plural(int64_t count, std::string_view noun, std::string_view plural_noun) {
  if (count == 1) return fmt::format("1 {}", noun);
  if (plural_noun.empty()) return fmt::format("{} {}s", with_commas(count), noun);
  return fmt::format("{} {}", with_commas(count), plural_noun);
}

std::string clip_words(const plan::Plan& plan) {
  const double clip = plan.training_config.clip_grad_norm;
  if (!plan.training || clip <= 0) return "";
  return fmt::format(" with gradients clipped to a global norm of at most {:g}", clip);
}

}  // namespace stagecraft::dump
