// The --trace view: Chrome's Trace Event Format, for chrome://tracing and ui.perfetto.dev.
//
// Every device of a run is a process, "predicted / device 0" or "measured / device 0" (pids
// kPredictedPid + d and kMeasuredPid + d; sorted so that each device's predicted and measured
// runs lie together), with threads "steps" (one slice per step), "compute" (F, B, W, the
// optimizer step, all-reduces), "receive / wait" (a receive: the wait from the device being free
// to the data's arrival) and "send" lanes (a send: the transfer on its link; sends that overlap
// take further lanes). Every device carries its memory as a counter ("memory device N"): the
// predicted one the planner's simulation, the measured one the runtime's meter after every
// instruction. A measured run has what the runtime times: compute, all-reduces, receives' waits
// and sends (from the send's start to the tensors handed to the link).
#include <fmt/format.h>

#include <filesystem>

#include "tools/dump/measured.h"
#include "tools/dump/render.h"
#include "tools/json_formats.h"

namespace stagecraft::dump {
namespace {

using ordered = nlohmann::ordered_json;

constexpr int kPredictedPid = 1;
constexpr int kMeasuredPid = 1001;
constexpr int kStepsTid = 0, kComputeTid = 1, kWaitTid = 2, kSendTid = 3;

ordered metadata(std::string_view name, int pid, int tid, ordered args) {
  return {{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

/// One process per device with its threads; `sends` lanes of sends.
void add_process(ordered& out, std::string_view run, int pid, int device, int sort_index,
                 int sends) {
  out.push_back(
      metadata("process_name", pid, 0, {{"name", fmt::format("{} / device {}", run, device)}}));
  out.push_back(metadata("process_sort_index", pid, 0, {{"sort_index", sort_index}}));
  std::vector<std::pair<int, std::string>> threads = {
      {kStepsTid, "steps"}, {kComputeTid, "compute"}, {kWaitTid, "receive / wait"}};
  for (int lane = 0; lane < sends; ++lane)
    threads.emplace_back(kSendTid + lane, sends > 1 ? fmt::format("send {}", lane) : "send");
  for (const auto& [tid, name] : threads) {
    out.push_back(metadata("thread_name", pid, tid, {{"name", name}}));
    out.push_back(metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}));
  }
}

/// The slice's name: "F3", "B3 chunk 1" (interleaved), "send act 3 to stage 2", "allreduce".
std::string slice_name(const schedule::TimelineEvent& event, int devices, int chunks,
                       bool recompute) {
  using schedule::Op;
  const int mb = event.microbatch;
  const std::string chunk =
      chunks > 1 && devices > 0 ? fmt::format(" chunk {}", event.stage / devices) : "";
  switch (event.op) {
    case Op::kRecvAct:
      return fmt::format("recv act {} from stage {}", mb, event.stage - 1);
    case Op::kRecvGrad:
      return fmt::format("recv grad {} from stage {}", mb, event.stage + 1);
    case Op::kSendAct:
      return fmt::format("send act {} to stage {}", mb, event.stage + 1);
    case Op::kSendGrad:
      return fmt::format("send grad {} to stage {}", mb, event.stage - 1);
    case Op::kAllReduce:
      return "allreduce" + chunk;
    case Op::kAllReduceShared:
      return "allreduce shared" + chunk;
    default:
      break;
  }
  std::string name(1, event_letter(event, 0));
  if (mb >= 0) name += std::to_string(mb);
  return name + chunk + (recompute ? " (recompute)" : "");
}

std::string_view slice_category(schedule::Op op) {
  using schedule::Op;
  switch (op) {
    case Op::kRecvAct:
    case Op::kRecvGrad:
      return "receive";
    case Op::kSendAct:
    case Op::kSendGrad:
      return "send";
    case Op::kAllReduce:
    case Op::kAllReduceShared:
      return "allreduce";
    default:
      return event_category(op);
  }
}

/// The slices of one device's events (shifted by `offset_s`), sends spread over lanes so that
/// none overlaps another on its thread; returns the lanes used.
int add_slices(ordered& out, int pid, const std::vector<schedule::TimelineEvent>& events,
               const std::vector<bool>& recompute, const std::vector<int>& step_of, int devices,
               int chunks, double offset_s) {
  std::vector<double> lane_free;  // when each send lane is free again
  for (size_t i = 0; i < events.size(); ++i) {
    const schedule::TimelineEvent& e = events[i];
    int tid = kComputeTid;
    if (e.op == schedule::Op::kRecvAct || e.op == schedule::Op::kRecvGrad) tid = kWaitTid;
    if (e.op == schedule::Op::kSendAct || e.op == schedule::Op::kSendGrad) {
      size_t lane = 0;
      while (lane < lane_free.size() && lane_free[lane] > e.start_s + 1e-12) ++lane;
      if (lane == lane_free.size()) lane_free.push_back(0);
      lane_free[lane] = e.end_s;
      tid = kSendTid + static_cast<int>(lane);
    }
    ordered args = {{"device", e.device},
                    {"stage", e.stage},
                    {"microbatch", e.microbatch},
                    {"op", schedule::to_string(e.op)}};
    if (chunks > 1) args["chunk"] = e.stage / devices;
    if (!step_of.empty()) args["step"] = step_of[i];
    if (recompute[i]) args["recompute"] = true;
    out.push_back({{"name", slice_name(e, devices, chunks, recompute[i])},
                   {"cat", slice_category(e.op)},
                   {"ph", "X"},
                   {"ts", (e.start_s + offset_s) * 1e6},
                   {"dur", (e.end_s - e.start_s) * 1e6},
                   {"pid", pid},
                   {"tid", tid},
                   {"args", std::move(args)}});
  }
  return static_cast<int>(lane_free.size());
}

ordered step_slice(int pid, const std::string& name, double start_s, double end_s, int step) {
  return {{"name", name},
          {"cat", "step"},
          {"ph", "X"},
          {"ts", start_s * 1e6},
          {"dur", (end_s - start_s) * 1e6},
          {"pid", pid},
          {"tid", kStepsTid},
          {"args", {{"step", step}}}};
}

/// A memory counter sample of process `pid`.
ordered memory_counter(int pid, int device, double ts_s, int64_t bytes) {
  return {{"name", fmt::format("memory device {}", device)},
          {"ph", "C"},
          {"ts", ts_s * 1e6},
          {"pid", pid},
          {"args", {{"bytes", bytes}}}};
}

/// The measured run's processes: every device's events of every step, one step slice each, and
/// its memory counter.
void add_measured(ordered& out, const plan::Plan& plan, const std::vector<MeasuredStep>& steps,
                  int reported, const std::vector<MeasuredMemory>& memory) {
  const int devices = plan.devices * plan.data_parallel;
  for (int d = 0; d < devices; ++d) {
    std::vector<schedule::TimelineEvent> events;
    std::vector<bool> recompute;
    std::vector<int> step_of;
    const int pid = kMeasuredPid + d;
    ordered slices = ordered::array();
    for (size_t s = 0; s < steps.size(); ++s) {
      for (const MeasuredEvent& m : steps[s].events) {
        if (m.event.device != d) continue;
        events.push_back(m.event);
        recompute.push_back(m.recompute);
        step_of.push_back(static_cast<int>(s) + 1);
      }
      std::string name = fmt::format("step {}", s + 1);
      if (s == 0 && steps.size() > 1) name += " (warm-up)";
      if (static_cast<int>(s) == reported) name += " (median)";
      slices.push_back(
          step_slice(pid, name, steps[s].start_s, steps[s].end_s, static_cast<int>(s) + 1));
    }
    int lanes = add_slices(slices, pid, events, recompute, step_of, plan.devices, plan.chunks, 0);
    const int pipeline = d % plan.devices;
    add_process(out, "measured", pid, d, d < plan.devices ? 2 * pipeline + 1 : 2 * plan.devices + d,
                lanes);
    for (auto& slice : slices) out.push_back(std::move(slice));
    for (const MeasuredMemory& m : memory)
      if (m.device == d) out.push_back(memory_counter(pid, d, m.time_s, m.bytes));
  }
}

ordered document(ordered events, const std::vector<MeasuredStep>& steps = {}) {
  ordered other{{"format_version", tools::kTraceJsonVersion}};
  // The runtime's step lengths, where every step has one (stagerun --trace).
  ordered step_ms = ordered::array();
  for (const MeasuredStep& s : steps)
    if (s.runtime_ms >= 0) step_ms.push_back(s.runtime_ms);
  if (!steps.empty() && step_ms.size() == steps.size()) other["step_ms"] = std::move(step_ms);
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", other}};
}

}  // namespace

nlohmann::ordered_json measured_trace(const plan::Plan& plan,
                                      const std::vector<MeasuredStep>& steps,
                                      const std::vector<MeasuredMemory>& memory) {
  std::vector<double> step_ms;
  for (const MeasuredStep& s : steps) step_ms.push_back((s.end_s - s.start_s) * 1e3);
  ordered out = ordered::array();
  add_measured(out, plan, steps, median_step(step_ms), memory);
  return document(std::move(out), steps);
}

nlohmann::ordered_json render_trace(const PlanView& view, const MeasuredRun* measured) {
  const plan::Plan& plan = view.plan;
  ordered out = ordered::array();
  // The predicted step lies over the measured median step when there is one.
  const double offset_s =
      measured != nullptr && measured->traced
          ? measured->steps[static_cast<size_t>(measured->reported_step)].start_s
          : 0.0;
  for (int d = 0; d < plan.devices; ++d) {
    const int pid = kPredictedPid + d;
    std::vector<schedule::TimelineEvent> events;
    for (const schedule::TimelineEvent& e : plan.timeline)
      if (e.device == d) events.push_back(e);
    ordered slices = ordered::array();
    slices.push_back(
        step_slice(pid, "step (predicted)", offset_s, offset_s + plan.predicted.step_ms / 1e3, 1));
    int lanes = add_slices(slices, pid, events, std::vector<bool>(events.size(), false), {},
                           plan.devices, plan.chunks, offset_s);
    add_process(out, "predicted", pid, d, 2 * d, lanes);
    for (auto& slice : slices) out.push_back(std::move(slice));
    // The device's predicted memory over the step; its highest value is the predicted peak.
    if (d < static_cast<int>(plan.device_memory.size())) {
      const plan::DevicePeak& peak = plan.device_memory[static_cast<size_t>(d)];
      for (size_t i = 0; i < peak.time_ms.size(); ++i)
        out.push_back(memory_counter(pid, d, offset_s + peak.time_ms[i] / 1e3, peak.bytes[i]));
    }
  }
  if (measured != nullptr && measured->traced)
    add_measured(out, plan, measured->steps, measured->reported_step, measured->memory);
  return document(std::move(out));
}

}  // namespace stagecraft::dump
