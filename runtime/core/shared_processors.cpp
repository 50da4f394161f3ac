// The plan's processors against the run's GPUs (shared_processors.h).
#include "runtime/core/shared_processors.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

namespace stagecraft::rt {

std::string processor_warning(const plan::Plan& plan, const Backend& backend,
                              std::span<const int> devices) {
  if (backend.name() == "cpu" || devices.empty() || plan.devices < 1 ||
      plan.processors.processor_of.size() != static_cast<size_t>(plan.devices))
    return "";
  // Per GPU, the plan processors of the devices on it; per plan processor, the GPUs.
  std::map<int, std::set<int>> planned_on_gpu, gpus_of_processor;
  for (int g : devices) {
    const int gpu = backend.physical_device(g).index;
    const int processor = plan.processors.processor_of[static_cast<size_t>(g % plan.devices)];
    planned_on_gpu[gpu].insert(processor);
    gpus_of_processor[processor].insert(gpu);
  }
  const int processors = static_cast<int>(
      std::set<int>(plan.processors.processor_of.begin(), plan.processors.processor_of.end())
          .size());
  const bool split_here = std::any_of(planned_on_gpu.begin(), planned_on_gpu.end(),
                                      [](const auto& on) { return on.second.size() > 1; });
  if (split_here) {
    const int per_gpu =
        static_cast<int>((devices.size() + planned_on_gpu.size() - 1) / planned_on_gpu.size());
    return fmt::format(
        "{}; its predicted step {:.3f} ms has them compute on {} processor{} at once, which no "
        "longer holds here (stagec --devices-per-processor {} predicts this sharing)",
        shared_device_warning(backend, devices), plan.predicted.step_ms, processors,
        processors == 1 ? "" : "s", std::min(plan.devices, per_gpu));
  }
  const bool shared_in_plan = std::any_of(gpus_of_processor.begin(), gpus_of_processor.end(),
                                          [](const auto& on) { return on.second.size() > 1; });
  if (!shared_in_plan) return "";
  return fmt::format(
      "the plan has {} devices per processor, but here its devices run on {} GPUs, each on its "
      "own: its predicted step {:.3f} ms counts turns that are not taken; expect nearer {:.3f} ms "
      "(stagec --devices-per-processor 1 predicts this machine)",
      plan.cluster.devices_per_processor, planned_on_gpu.size(), plan.predicted.step_ms,
      plan.processors.separate_step_ms);
}

}  // namespace stagecraft::rt
