#pragma once
/// \file
/// stagerun's notes on a run: how long loading each device's weights took, and a measured step
/// far from the prediction with the causes stagerun can see.

#include <string>
#include <string_view>
#include <vector>

#include "runtime/exec/pipeline.h"

namespace stagecraft::tools {

/// On stderr, one line per device when loading its weights took a second or more or read 256
/// MiB or more: its weights, the bytes read from weight files, the seconds.
void report_loads(const rt::Pipeline& pipeline);

/// A measured step past 1.5x the prediction, or under 1/1.5 of it: the ratio and the causes
/// stagerun can see ("" when the two agree that well). `devices` is this process's plan devices,
/// each with `threads_per_device` worker threads; `warnings` the run's warnings (another device
/// kind, devices sharing a GPU). Devices whose threads outnumber the cores are a cause unless
/// the plan counted them sharing processors (`plan.processors`) as this machine makes them.
std::string prediction_gap(const rt::RunReport& report, const plan::Plan& plan,
                           std::string_view backend, int devices, int threads_per_device,
                           const std::vector<std::string>& warnings);

}  // namespace stagecraft::tools
