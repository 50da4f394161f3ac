#pragma once
/// \file
/// The one predicted memory figure per device (plan::DevicePeak): the simulated step's peak of
/// the device's stages, with the working arena and the communication buffers they hold the whole
/// step, split into the parts held at that instant. The planner checks it against the device's
/// capacity and writes it to plan.json; every view shows it.

#include <vector>

#include "compiler/schedule/simulator.h"
#include "runtime/format/plan.h"

namespace stagecraft::schedule {

/// The peak of every device of `sim` (a simulation of `stages`, in stage order, on `devices`
/// devices; each stage's anatomy filled in). Weights, gradients, optimizer state and
/// communication are the sums of the device's stages' anatomies, the arena the largest of their
/// temporaries; activations, recomputed and deferred bytes are the simulation's at the instant
/// of the peak. The parts add up to `peak_bytes`, the largest entry of the memory over the step
/// (`bytes`, the simulation's timeline with the same constant parts).
std::vector<plan::DevicePeak> device_peaks(const SimResult& sim,
                                           const std::vector<plan::Stage>& stages, int devices);

/// `device_peaks`' figures as a prediction's: `device_peak_bytes` and `peak_memory_bytes`.
void set_peaks(plan::Prediction& prediction, const std::vector<plan::DevicePeak>& peaks);

}  // namespace stagecraft::schedule
