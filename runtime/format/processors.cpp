// plan.json's `processors`: which processor each pipeline device runs on (processors.h).
#include "runtime/format/processors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "runtime/format/error.h"

namespace stagecraft::plan {

std::vector<int> processor_of_devices(int devices, int devices_per_processor) {
  if (devices < 1 || devices_per_processor < 1 || devices_per_processor > devices)
    fail(ErrorKind::kUsage,
         "{} devices per processor for a pipeline of {} devices: it must be "
         "from 1 to the pipeline's devices",
         devices_per_processor, devices);
  const int processors = (devices + devices_per_processor - 1) / devices_per_processor;
  std::vector<int> of(devices);
  for (int d = 0; d < devices; ++d) of[d] = d % processors;
  return of;
}

bool shares_processors(const ProcessorSharing& sharing) {
  std::map<int, int> devices;
  for (int p : sharing.processor_of)
    if (++devices[p] > 1) return true;
  return false;
}

std::string describe_sharing(const Plan& plan) {
  const ProcessorSharing& sharing = plan.processors;
  if (!shares_processors(sharing)) return "";
  std::map<int, std::vector<int>> devices;  // by processor
  for (size_t d = 0; d < sharing.processor_of.size(); ++d)
    devices[sharing.processor_of[d]].push_back(static_cast<int>(d));
  std::vector<std::string> groups;
  for (const auto& [processor, on] : devices) {
    if (on.size() < 2) continue;
    std::vector<std::string> names;
    for (int d : on) names.push_back(std::to_string(d));
    const std::string last = names.back();
    names.pop_back();
    groups.push_back(fmt::format("{}{} and {} share processor {}", groups.empty() ? "devices " : "",
                                 fmt::join(names, ", "), last, processor));
  }
  const double step = plan.predicted.step_ms, separate = sharing.separate_step_ms;
  return fmt::format(
      "{} ({} per processor, overlap {:g}): predicted step {:.3f} ms, {:.3f} ms if each had its "
      "own ({:+.1f}%)",
      fmt::join(groups, ", "), plan.cluster.devices_per_processor, sharing.overlap, step, separate,
      separate > 0 ? 100 * (step / separate - 1) : 0.0);
}

nlohmann::ordered_json processors_json(const ProcessorSharing& sharing) {
  return {{"processor_of", sharing.processor_of},
          {"overlap", sharing.overlap},
          {"separate_step_ms", sharing.separate_step_ms}};
}

ProcessorSharing read_processors(const JsonObject& top) {
  JsonObject f = top.object("processors", {"processor_of", "overlap", "separate_step_ms"});
  ProcessorSharing sharing;
  sharing.processor_of = f.at("processor_of").int32s();
  sharing.overlap = f.number("overlap");
  sharing.separate_step_ms = f.number("separate_step_ms");
  return sharing;
}

void check_processors(const Plan& plan, const std::string& source) {
  auto fault = [&](std::string_view field, const std::string& problem) {
    throw Error(ErrorKind::kPlan, fmt::format("field '{}' {}", field, problem)).in(source);
  };
  const int k = plan.cluster.devices_per_processor;
  if (k < 1 || k > std::max(plan.devices, 1))
    fault("cluster.devices_per_processor",
          fmt::format("is {}; it must be from 1 to the pipeline's {} devices", k, plan.devices));
  if (k > 1 && plan.data_parallel > 1)
    fault("cluster.devices_per_processor",
          fmt::format("is {} with {} data-parallel replicas: devices that share a processor are "
                      "planned for one pipeline only",
                      k, plan.data_parallel));
  const ProcessorSharing& sharing = plan.processors;
  if (plan.devices >= 1) {
    const std::vector<int> expected = processor_of_devices(plan.devices, k);
    if (sharing.processor_of != expected)
      fault("processors.processor_of",
            fmt::format("is [{}]; {} devices at {} per processor run on [{}] (device d on "
                        "processor d mod {})",
                        fmt::join(sharing.processor_of, ", "), plan.devices, k,
                        fmt::join(expected, ", "), (plan.devices + k - 1) / k));
  }
  if (!(sharing.overlap >= 0 && sharing.overlap < 1))
    fault("processors.overlap", fmt::format("is {}; it must be in [0, 1)", sharing.overlap));
  if (!std::isfinite(sharing.separate_step_ms) || sharing.separate_step_ms < 0)
    fault("processors.separate_step_ms",
          fmt::format("is {}; it must be finite and >= 0", sharing.separate_step_ms));
}

}  // namespace stagecraft::plan
