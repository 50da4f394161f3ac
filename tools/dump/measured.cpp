// Reading a measured run (stagedump --measured RUN) and splitting a traced run into its steps.
#include "tools/dump/measured.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "runtime/format/error.h"
#include "tools/dump/render.h"
#include "tools/json_formats.h"

namespace stagecraft::dump {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, "cannot open --measured file").in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The op a trace slice stands for: its args.op (this format), else its category (version 1).
std::optional<schedule::Op> slice_op(const nlohmann::json& slice) {
  const nlohmann::json& args = slice["args"];
  if (args.is_object() && args.contains("op") && args["op"].is_string()) {
    try {
      return schedule::parse_op(args["op"].get<std::string>());
    } catch (const Error&) {
      return std::nullopt;
    }
  }
  static const std::map<std::string, schedule::Op> kByCategory = {
      {"forward", schedule::Op::kForward},
      {"backward", schedule::Op::kBackward},
      {"backward_input", schedule::Op::kBackwardInput},
      {"backward_weight", schedule::Op::kBackwardWeight},
      {"optimizer", schedule::Op::kOptimizerStep},
      {"communication", schedule::Op::kAllReduce}};
  if (!slice.contains("cat") || !slice["cat"].is_string()) return std::nullopt;
  auto at = kByCategory.find(slice["cat"].get<std::string>());
  return at == kByCategory.end() ? std::nullopt : std::optional(at->second);
}

/// The timed events of a trace document, each with its index in traceEvents; the processes named
/// "predicted ..." (a trace stagedump wrote) are left out.
std::vector<std::pair<size_t, schedule::TimelineEvent>> trace_events(const nlohmann::json& doc,
                                                                     const std::string& path) {
  if (!doc["traceEvents"].is_array())
    throw Error(ErrorKind::kFormat, "field 'traceEvents' must be an array").in(path);
  const nlohmann::json& all = doc["traceEvents"];
  std::map<int64_t, bool> predicted;  // pid -> a predicted process
  for (const nlohmann::json& e : all) {
    if (e.is_object() && e.value("ph", "") == "M" && e.value("name", "") == "process_name" &&
        e["pid"].is_number_integer() && e["args"].is_object() && e["args"]["name"].is_string())
      predicted[e["pid"].get<int64_t>()] =
          e["args"]["name"].get<std::string>().starts_with("predicted");
  }
  std::vector<std::pair<size_t, schedule::TimelineEvent>> events;
  for (size_t i = 0; i < all.size(); ++i) {
    const nlohmann::json& e = all[i];
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    std::string at = fmt::format("traceEvents[{}]", i);
    for (const char* field : {"ts", "dur", "pid", "tid", "args"})
      if (!e.contains(field))
        throw Error(ErrorKind::kFormat, fmt::format("field '{}.{}' is missing", at, field))
            .in(path);
    if (predicted[e["pid"].get<int64_t>()]) continue;
    std::optional<schedule::Op> op = slice_op(e);
    if (!op || !(is_timed(*op) || is_receive(*op) || is_send(*op))) continue;
    const nlohmann::json& args = e["args"];
    if (!args.is_object() || !args["stage"].is_number_integer() ||
        !args["microbatch"].is_number_integer() || !e["ts"].is_number() || !e["dur"].is_number() ||
        !e["tid"].is_number_integer())
      throw Error(ErrorKind::kFormat,
                  fmt::format("field '{}' needs numbers ts, dur, tid, args.stage and "
                              "args.microbatch",
                              at))
          .in(path);
    int device = args.contains("device") && args["device"].is_number_integer()
                     ? args["device"].get<int>()
                     : e["tid"].get<int>();
    double start = e["ts"].get<double>() / 1e6;
    events.push_back({i,
                      {device, *op, args["stage"].get<int>(), args["microbatch"].get<int>(), start,
                       start + e["dur"].get<double>() / 1e6}});
  }
  return events;
}

/// The measured processes' memory counters ("memory device N", args {bytes}) of a trace.
std::vector<MeasuredMemory> trace_memory(const nlohmann::json& doc, const std::string& path,
                                         int devices) {
  const nlohmann::json& all = doc["traceEvents"];
  std::map<int64_t, bool> measured;  // pid -> a measured process
  for (const nlohmann::json& e : all)
    if (e.is_object() && e.value("ph", "") == "M" && e.value("name", "") == "process_name" &&
        e["pid"].is_number_integer() && e["args"].is_object() && e["args"]["name"].is_string())
      measured[e["pid"].get<int64_t>()] =
          e["args"]["name"].get<std::string>().starts_with("measured");
  std::vector<MeasuredMemory> memory;
  for (size_t i = 0; i < all.size(); ++i) {
    const nlohmann::json& e = all[i];
    if (!e.is_object() || e.value("ph", "") != "C" || !e["pid"].is_number_integer() ||
        !measured[e["pid"].get<int64_t>()])
      continue;
    int device = -1;
    const std::string name = e.value("name", "");
    if (name.starts_with("memory device ")) {
      std::istringstream number(name.substr(14));
      if (!(number >> device) || !number.eof()) device = -1;
    }
    if (device < 0 || !e["ts"].is_number() || !e["args"].is_object() ||
        !e["args"]["bytes"].is_number_integer())
      throw Error(ErrorKind::kFormat,
                  fmt::format("field 'traceEvents[{}]' is a counter but not 'memory device N' "
                              "with numbers ts and args.bytes",
                              i))
          .in(path);
    if (device >= devices)
      throw Error(ErrorKind::kPlan,
                  fmt::format("traceEvents[{}] is on device {}, but the plan has {} devices: a "
                              "run of another plan",
                              i, device, devices))
          .in(path);
    memory.push_back({device, e["ts"].get<double>() / 1e6, e["args"]["bytes"].get<int64_t>()});
  }
  return memory;
}

/// The last record of JSON Lines `text` whose "type" is "summary" (stagerun --json).
nlohmann::json json_lines_summary(const std::string& text, const std::string& path) {
  std::istringstream in(text);
  nlohmann::json summary;
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.is_object())
      throw Error(ErrorKind::kFormat,
                  fmt::format("line {} is not a JSON object: not stagerun --json (JSON Lines) "
                              "nor a stagerun --trace file",
                              line_number))
          .in(path);
    if (record.value("type", "") == "summary") summary = std::move(record);
  }
  if (summary.is_null())
    throw Error(ErrorKind::kFormat,
                "no record with \"type\": \"summary\": not the output of stagerun --json")
        .in(path);
  return summary;
}

MeasuredRun from_summary(const nlohmann::json& s, const std::string& path, const PlanView& view) {
  const plan::Plan& plan = view.plan;
  auto fail_field = [&](const std::string& field, const std::string& problem) {
    throw Error(ErrorKind::kPlan, fmt::format("field '{}' {}", field, problem)).in(path);
  };
  auto integer = [&](const char* field) {
    if (!s.contains(field) || !s[field].is_number_integer())
      throw Error(ErrorKind::kFormat, fmt::format("field '{}' must be an integer", field)).in(path);
    return s[field].get<int64_t>();
  };
  if (integer("format_version") != tools::kRunJsonVersion)
    fail_field("format_version", fmt::format("is {}; this stagedump reads version {}",
                                             s["format_version"].dump(), tools::kRunJsonVersion));
  const int64_t devices = static_cast<int64_t>(plan.devices) * plan.data_parallel;
  if (integer("devices") != devices)
    fail_field("devices",
               fmt::format("is {}, but the plan {} has {} devices: a run of another plan",
                           s["devices"].dump(), view.plan_dir, devices));
  if (integer("microbatches") != plan.microbatches)
    fail_field("microbatches",
               fmt::format("is {}, but the plan {} has {}: a run of another plan",
                           s["microbatches"].dump(), view.plan_dir, plan.microbatches));
  const std::string schedule(to_string(plan.schedule));
  if (s.contains("schedule") && s["schedule"] != schedule)
    fail_field("schedule", fmt::format("is {}, but the plan {} runs {}: a run of another plan",
                                       s["schedule"].dump(), view.plan_dir, schedule));
  if (!s.contains("predicted_step_ms") || !s["predicted_step_ms"].is_number())
    throw Error(ErrorKind::kFormat, "field 'predicted_step_ms' must be a number").in(path);
  const double predicted = s["predicted_step_ms"].get<double>();
  if (std::abs(predicted - plan.predicted.step_ms) > 1e-9 * std::max(1.0, plan.predicted.step_ms))
    fail_field("predicted_step_ms",
               fmt::format("is {}, but the plan {} predicts {} ms: a run of another plan",
                           predicted, view.plan_dir, plan.predicted.step_ms));
  MeasuredRun run;
  run.path = path;
  run.devices = static_cast<int>(devices);
  if (!s.contains("step_ms") || !s["step_ms"].is_array() || s["step_ms"].empty())
    throw Error(ErrorKind::kFormat, "field 'step_ms' must be a list of the steps' times").in(path);
  for (const nlohmann::json& ms : s["step_ms"]) {
    if (!ms.is_number())
      throw Error(ErrorKind::kFormat, "field 'step_ms' has a non-number").in(path);
    run.step_ms.push_back(ms.get<double>());
  }
  run.reported_step = median_step(run.step_ms);
  if (s.contains("bubble") && s["bubble"].is_object() && s["bubble"]["measured"].is_number())
    run.bubble_fraction = s["bubble"]["measured"].get<double>();
  if (!s.contains("device") || !s["device"].is_array() ||
      s["device"].size() != static_cast<size_t>(devices))
    fail_field("device", fmt::format("must list the {} devices of the plan", devices));
  for (const nlohmann::json& d : s["device"]) {
    if (!d.is_object() || !d["busy_fraction"].is_number() || !d["peak_bytes"].is_number_integer())
      throw Error(ErrorKind::kFormat, "field 'device' needs busy_fraction and peak_bytes").in(path);
    run.device.push_back({d["busy_fraction"].get<double>(), d["peak_bytes"].get<int64_t>()});
  }
  return run;
}

void add_event(MeasuredStep& step, const MeasuredEvent& event) {
  if (step.events.empty() || event.event.start_s < step.start_s) step.start_s = event.event.start_s;
  step.end_s = std::max(step.end_s, event.event.end_s);
  step.events.push_back(event);
}

}  // namespace

bool is_receive(schedule::Op op) {
  return op == schedule::Op::kRecvAct || op == schedule::Op::kRecvGrad;
}

bool is_send(schedule::Op op) {
  return op == schedule::Op::kSendAct || op == schedule::Op::kSendGrad;
}

bool is_timed(schedule::Op op) {
  return op == schedule::Op::kForward || op == schedule::Op::kBackward ||
         op == schedule::Op::kBackwardInput || op == schedule::Op::kBackwardWeight ||
         op == schedule::Op::kOptimizerStep || op == schedule::Op::kAllReduce;
}

int median_step(const std::vector<double>& step_ms) {
  if (step_ms.size() <= 1) return 0;
  std::vector<int> order;
  for (int s = 1; s < static_cast<int>(step_ms.size()); ++s) order.push_back(s);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return step_ms[a] < step_ms[b]; });
  return order[(order.size() - 1) / 2];
}

std::vector<MeasuredStep> split_steps(const std::vector<schedule::TimelineEvent>& events,
                                      const plan::Plan& plan, const schedule::Schedule& schedule,
                                      const std::string& source,
                                      const std::function<std::string(size_t)>& where) {
  const int devices = plan.devices * plan.data_parallel;
  // Every device's events in time order, with their index in `events`.
  std::vector<std::vector<size_t>> by_device(static_cast<size_t>(devices));
  for (size_t i = 0; i < events.size(); ++i) {
    int d = events[i].device;
    if (d < 0 || d >= devices)
      throw Error(ErrorKind::kPlan,
                  fmt::format("{} is on device {}, but the plan has {} devices: a run of another "
                              "plan",
                              where(i), d, devices))
          .in(source);
    by_device[static_cast<size_t>(d)].push_back(i);
  }
  std::vector<MeasuredStep> steps;
  std::vector<int> device_steps(static_cast<size_t>(devices), 0);
  for (int d = 0; d < devices; ++d) {
    auto& order = by_device[static_cast<size_t>(d)];
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return events[a].start_s < events[b].start_s; });
    std::vector<schedule::Instruction> timed;
    for (const schedule::Instruction& ins : schedule.at(static_cast<size_t>(d % plan.devices)))
      if (is_timed(ins.op)) timed.push_back(ins);
    if (timed.empty() && !order.empty())
      throw Error(ErrorKind::kPlan,
                  fmt::format("device {} has events, but the plan's schedule.json times nothing "
                              "on it",
                              d))
          .in(source);
    if (order.empty() && !timed.empty())
      throw Error(ErrorKind::kPlan,
                  fmt::format("device {} has no events, but the plan has {} devices", d, devices))
          .in(source);
    size_t next = 0;
    int step = 0;
    for (size_t i : order) {
      const schedule::TimelineEvent& e = events[i];
      if (!is_timed(e.op)) {  // a receive's wait or a send: in the step, not matched
        // A send after the step's last timed instruction (the step count has moved on) is
        // that step's.
        const int in = is_send(e.op) && next == 0 && step > 0 ? step - 1 : step;
        if (static_cast<int>(steps.size()) <= in) steps.resize(static_cast<size_t>(in) + 1);
        add_event(steps[static_cast<size_t>(in)], {e, false});
        continue;
      }
      if (static_cast<int>(steps.size()) <= step) steps.emplace_back();
      const schedule::Instruction& want = timed[next];
      bool recompute =
          e.op == schedule::Op::kForward &&
          (want.op == schedule::Op::kBackward || want.op == schedule::Op::kBackwardInput ||
           want.op == schedule::Op::kBackwardWeight) &&
          e.stage == want.stage && e.microbatch == want.microbatch &&
          want.stage < static_cast<int>(plan.stages.size()) &&
          plan.stages[static_cast<size_t>(want.stage)].recompute;
      if (!recompute && (e.op != want.op || e.stage != want.stage ||
                         (want.microbatch >= 0 && e.microbatch != want.microbatch))) {
        schedule::Instruction got{e.op, e.stage, e.microbatch};
        throw Error(
            ErrorKind::kPlan,
            fmt::format("{} is {} on device {} in step {}, but the plan's schedule.json "
                        "has {} there: a run of another plan",
                        where(i), schedule::to_string(got), d, step + 1, schedule::to_string(want)))
            .in(source);
      }
      add_event(steps[static_cast<size_t>(step)], {e, recompute});
      if (!recompute && ++next == timed.size()) {
        next = 0;
        ++step;
      }
    }
    if (next != 0)
      throw Error(ErrorKind::kPlan,
                  fmt::format("device {} stops after {} of the {} timed instructions of step {}: "
                              "a cut-off run or another plan",
                              d, next, timed.size(), step + 1))
          .in(source);
    device_steps[static_cast<size_t>(d)] = step;
  }
  for (int d = 1; d < devices; ++d)
    if (device_steps[static_cast<size_t>(d)] != device_steps[0])
      throw Error(ErrorKind::kPlan,
                  fmt::format("device {} ran {} steps but device 0 ran {}", d,
                              device_steps[static_cast<size_t>(d)], device_steps[0]))
          .in(source);
  return steps;
}

MeasuredRun load_measured(const std::string& path, const PlanView& view) {
  const std::string text = read_text(path);
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("traceEvents"))
    return from_summary(json_lines_summary(text, path), path, view);

  // A trace: its version, then every device's timed instructions against schedule.json.
  const nlohmann::json& other = doc["otherData"];
  if (!other.is_object() || !other["format_version"].is_number_integer())
    throw Error(ErrorKind::kFormat, "field 'otherData.format_version' is missing").in(path);
  const int version = other["format_version"].get<int>();
  if (version < 1 || version > tools::kTraceJsonVersion)
    throw Error(ErrorKind::kFormat,
                fmt::format("field 'otherData.format_version' is {}; this stagedump reads 1..{}",
                            version, tools::kTraceJsonVersion))
        .in(path);
  auto indexed = trace_events(doc, path);
  if (indexed.empty())
    throw Error(ErrorKind::kFormat, "no measured compute slices in 'traceEvents'").in(path);
  std::vector<schedule::TimelineEvent> events;
  for (const auto& [index, event] : indexed) events.push_back(event);
  MeasuredRun run;
  run.path = path;
  run.traced = true;
  run.devices = view.plan.devices * view.plan.data_parallel;
  run.steps = split_steps(events, view.plan, view.schedule, path, [&](size_t i) {
    return fmt::format("traceEvents[{}]", indexed[i].first);
  });
  if (other.contains("step_ms")) {  // the runtime's step lengths (absent in older traces)
    const nlohmann::json& lengths = other["step_ms"];
    if (!lengths.is_array() || lengths.size() != run.steps.size())
      throw Error(ErrorKind::kFormat,
                  fmt::format("field 'otherData.step_ms' must list the {} traced steps' lengths",
                              run.steps.size()))
          .in(path);
    for (size_t k = 0; k < lengths.size(); ++k) {
      if (!lengths[k].is_number() || !(lengths[k].get<double>() >= 0))
        throw Error(ErrorKind::kFormat,
                    fmt::format("field 'otherData.step_ms[{}]' must be a number >= 0", k))
            .in(path);
      run.steps[k].runtime_ms = lengths[k].get<double>();
    }
  }
  // A step's length: the runtime's where the trace keeps it (what stagerun reports), else the
  // span of its events.
  for (const MeasuredStep& s : run.steps)
    run.step_ms.push_back(s.runtime_ms >= 0 ? s.runtime_ms : (s.end_s - s.start_s) * 1e3);
  run.reported_step = median_step(run.step_ms);
  run.memory = trace_memory(doc, path, run.devices);
  return run;
}

MeasuredRun with_summary(MeasuredRun traced, const MeasuredRun& summary) {
  if (!traced.traced || summary.traced)
    fail(ErrorKind::kUsage,
         "--measured {} and {}: two runs are one stagerun --trace file and one stagerun --json "
         "output, not two of the same kind",
         traced.path, summary.path);
  traced.device = summary.device;
  traced.bubble_fraction = summary.bubble_fraction;
  traced.summary_path = summary.path;
  traced.summary_step_ms = summary.reported_step_ms();
  return traced;
}

}  // namespace stagecraft::dump
