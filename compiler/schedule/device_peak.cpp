#include "compiler/schedule/device_peak.h"

#include <algorithm>
#include <cmath>

#include "runtime/format/error.h"

namespace stagecraft::schedule {
namespace {

/// Bytes rounded up (the simulation's are whole numbers but for rounding in its sums).
int64_t bytes_up(double bytes) { return std::llround(std::ceil(bytes - 1e-6)); }

/// Bytes rounded down, for the parts beside the remainder.
int64_t bytes_down(double bytes) { return std::llround(std::floor(bytes + 1e-6)); }

}  // namespace

std::vector<plan::DevicePeak> device_peaks(const SimResult& sim,
                                           const std::vector<plan::Stage>& stages, int devices) {
  if (sim.device_peak_parts.size() != static_cast<size_t>(devices) ||
      sim.memory_timeline.size() != static_cast<size_t>(devices)) {
    fail(ErrorKind::kInternal, "device peaks: a simulation of {} devices for a plan of {}",
         sim.device_peak_parts.size(), devices);
  }
  std::vector<plan::DevicePeak> peaks(devices);
  for (int d = 0; d < devices; ++d) peaks[d].device = d;
  for (const plan::Stage& stage : stages) {
    if (stage.device < 0 || stage.device >= devices)
      fail(ErrorKind::kInternal, "device peaks: stage {} on device {} of {}", stage.index,
           stage.device, devices);
    plan::PeakParts& p = peaks[stage.device].parts;
    p.weights += stage.memory.weights;
    p.gradients += stage.memory.gradients;
    p.optimizer += stage.memory.optimizer;
    p.communication += stage.memory.communication;
    p.arena = std::max(p.arena, stage.memory.temporary);
  }
  for (int d = 0; d < devices; ++d) {
    plan::DevicePeak& peak = peaks[d];
    const PeakParts& at = sim.device_peak_parts[d];
    plan::PeakParts& p = peak.parts;
    // What the simulation adds to its static bytes, rounded up as a whole: every entry of the
    // timeline and the peak are rounded alike, so the largest entry is the peak; the activations
    // are what the peak holds beyond the (rounded down) recomputed and deferred bytes, so the
    // parts add up to it.
    auto dynamic = [&](double total) { return bytes_up(total - at.static_bytes); };
    const int64_t constant = p.weights + p.gradients + p.optimizer + p.communication + p.arena;
    p.recomputed = bytes_down(at.backward_bytes);
    p.deferred = bytes_down(at.deferred_bytes);
    p.activations = dynamic(sim.device_peak_bytes[d]) - p.recomputed - p.deferred;
    peak.peak_bytes = p.total();
    peak.peak_ms = at.time_s * 1e3;
    peak.in_flight = at.activations_held;
    for (const auto& [time_s, bytes] : sim.memory_timeline[d]) {
      peak.time_ms.push_back(time_s * 1e3);
      peak.bytes.push_back(constant + dynamic(bytes));
    }
  }
  return peaks;
}

void set_peaks(plan::Prediction& prediction, const std::vector<plan::DevicePeak>& peaks) {
  prediction.device_peak_bytes.clear();
  prediction.peak_memory_bytes = 0;
  for (const plan::DevicePeak& peak : peaks) {
    prediction.device_peak_bytes.push_back(peak.peak_bytes);
    prediction.peak_memory_bytes = std::max(prediction.peak_memory_bytes, peak.peak_bytes);
  }
}

}  // namespace stagecraft::schedule
