// The --trace view: Chrome's Trace Event Format.
#include <filesystem>

#include "tools/dump/render.h"
#include "tools/json_formats.h"

namespace stagecraft::dump {

nlohmann::ordered_json trace_json(const std::vector<schedule::TimelineEvent>& events, int devices,
                                  const std::string& process) {
  using ordered = nlohmann::ordered_json;
  ordered trace = ordered::array();
  trace.push_back({{"name", "process_name"},
                   {"ph", "M"},
                   {"pid", 0},
                   {"tid", 0},
                   {"args", {{"name", process}}}});
  for (int device = 0; device < devices; ++device) {
    trace.push_back({{"name", "thread_name"},
                     {"ph", "M"},
                     {"pid", 0},
                     {"tid", device},
                     {"args", {{"name", "device " + std::to_string(device)}}}});
    trace.push_back({{"name", "thread_sort_index"},
                     {"ph", "M"},
                     {"pid", 0},
                     {"tid", device},
                     {"args", {{"sort_index", device}}}});
  }
  for (const schedule::TimelineEvent& event : events) {
    // Upper-case letters: the category and args carry the chunk (stage) already.
    std::string name(1, event_letter(event, 0));
    if (event.microbatch >= 0) name += std::to_string(event.microbatch);
    trace.push_back({{"name", name},
                     {"cat", event_category(event.op)},
                     {"ph", "X"},
                     {"ts", event.start_s * 1e6},
                     {"dur", (event.end_s - event.start_s) * 1e6},
                     {"pid", 0},
                     {"tid", event.device},
                     {"args", {{"stage", event.stage}, {"microbatch", event.microbatch}}}});
  }
  return {{"traceEvents", std::move(trace)},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"format_version", tools::kTraceJsonVersion}}}};
}

nlohmann::ordered_json render_trace(const PlanView& view) {
  std::string name =
      "predicted: " + std::filesystem::path(view.plan_dir).lexically_normal().string();
  nlohmann::ordered_json trace =
      trace_json(compute_events(view.plan.timeline), view.plan.devices, name);
  // One counter track per device: its predicted memory over the step, whose highest value is
  // the device's predicted peak.
  for (const plan::DevicePeak& d : view.plan.device_memory) {
    for (size_t i = 0; i < d.time_ms.size(); ++i) {
      trace["traceEvents"].push_back({{"name", "memory device " + std::to_string(d.device)},
                                      {"ph", "C"},
                                      {"ts", d.time_ms[i] * 1e3},
                                      {"pid", 0},
                                      {"args", {{"bytes", d.bytes[i]}}}});
    }
  }
  return trace;
}

}  // namespace stagecraft::dump
