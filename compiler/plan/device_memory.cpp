#include "compiler/plan/device_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "compiler/model_info.h"
#include "compiler/schedule/simulator.h"
#include "cost_models/memory.h"
#include "runtime/format/error.h"

namespace stagecraft::plan {

int64_t stage_input_bytes(const Stage& stage) {
  int64_t bytes = 0;
  for (const StageTensor& t : stage.inputs) bytes += t.bytes;
  return bytes;
}

int64_t DeviceMemory::total() const {
  return weights + gradients + optimizer + communication + temporary + activations;
}

namespace {

/// Devices [first, last) of `stages` (one pointer per stage of the pipeline).
/// `peaks(kept, rebuilt, only_device)`: schedule::activation_peaks of the schedule.
template <typename Peaks>
std::vector<DeviceMemory> devices_of(const std::vector<const Stage*>& stages,
                                     const schedule::PipelineShape& shape, int only_device,
                                     const Peaks& peaks_of) {
  if (static_cast<int>(stages.size()) != schedule::stage_count(shape)) {
    fail(ErrorKind::kInternal, "device memory: {} stages for a pipeline of {}", stages.size(),
         schedule::stage_count(shape));
  }
  std::vector<DeviceMemory> devices(shape.devices);
  std::vector<double> kept(stages.size(), 0.0), rebuilt(stages.size(), 0.0);
  for (int d = 0; d < shape.devices; ++d) devices[d].device = d;
  auto add = [&](std::size_t k) {
    const int device = schedule::device_of_stage(static_cast<int>(k), shape);
    const Stage& st = *stages[k];
    DeviceMemory& dm = devices[device];
    dm.stages.push_back(static_cast<int>(k));
    dm.weights += st.memory.weights;
    dm.gradients += st.memory.gradients;
    dm.optimizer += st.memory.optimizer;
    dm.communication += st.memory.communication;
    dm.temporary = std::max(dm.temporary, st.memory.temporary);
    // The anatomy's activations are in_flight x kept (+ one microbatch rebuilt when it
    // recomputes, cost::stage_memory); take them apart again.
    const auto in_flight = static_cast<double>(std::max<int64_t>(st.in_flight, 1));
    const auto activations = static_cast<double>(st.memory.activations);
    if (st.recompute) {
      kept[k] = static_cast<double>(stage_input_bytes(st));
      rebuilt[k] = std::max(0.0, activations - in_flight * kept[k]);
    } else {
      kept[k] = activations / in_flight;
    }
  };
  if (only_device >= 0) {  // its chunks' stages only, ascending
    for (int chunk = 0; chunk < shape.chunks; ++chunk)
      add(static_cast<std::size_t>(schedule::stage_of_chunk(only_device, chunk, shape)));
  } else {
    for (std::size_t k = 0; k < stages.size(); ++k) add(k);
  }
  const std::vector<double> peaks = peaks_of(kept, rebuilt, only_device);
  for (DeviceMemory& dm : devices) dm.activations = std::llround(std::ceil(peaks[dm.device]));
  return devices;
}

/// The peaks of `schedule`'s walk.
auto walk(const schedule::Schedule& schedule, const schedule::PipelineShape& shape) {
  return [&schedule, &shape](const std::vector<double>& kept, const std::vector<double>& rebuilt,
                             int only_device) {
    return schedule::activation_peaks(schedule, shape, kept, rebuilt, only_device);
  };
}

/// The peaks of precomputed moments.
auto at_moments(const schedule::ActivationMoments& moments) {
  return [&moments](const std::vector<double>& kept, const std::vector<double>& rebuilt,
                    int only_device) {
    return schedule::activation_peaks(moments, kept, rebuilt, only_device);
  };
}

void check_device(int device, const schedule::PipelineShape& shape) {
  if (device < 0 || device >= shape.devices) {
    fail(ErrorKind::kInternal, "device memory: device {} of a pipeline of {}", device,
         shape.devices);
  }
}

}  // namespace

std::vector<DeviceMemory> device_memory(const std::vector<Stage>& stages,
                                        const schedule::Schedule& schedule,
                                        const schedule::PipelineShape& shape) {
  std::vector<const Stage*> pointers;
  for (const Stage& st : stages) pointers.push_back(&st);
  return devices_of(pointers, shape, -1, walk(schedule, shape));
}

std::vector<DeviceMemory> device_memory(const std::vector<const Stage*>& stages,
                                        const schedule::Schedule& schedule,
                                        const schedule::PipelineShape& shape) {
  return devices_of(stages, shape, -1, walk(schedule, shape));
}

DeviceMemory device_memory(int device, const std::vector<const Stage*>& stages,
                           const schedule::Schedule& schedule,
                           const schedule::PipelineShape& shape) {
  check_device(device, shape);
  return devices_of(stages, shape, device, walk(schedule, shape))[device];
}

std::vector<DeviceMemory> device_memory(const std::vector<const Stage*>& stages,
                                        const schedule::ActivationMoments& moments) {
  return devices_of(stages, moments.shape, -1, at_moments(moments));
}

DeviceMemory device_memory(int device, const std::vector<const Stage*>& stages,
                           const schedule::ActivationMoments& moments) {
  check_device(device, moments.shape);
  return devices_of(stages, moments.shape, device, at_moments(moments))[device];
}

}  // namespace stagecraft::plan
