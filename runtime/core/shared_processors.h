#pragma once
/// \file
/// The plan's processors against the GPUs a run puts its devices on: stagerun's warning when
/// they differ (runtime/format/plan.h ProcessorSharing, Backend::physical_device).

#include <span>
#include <string>

#include "runtime/core/backend.h"
#include "runtime/format/plan.h"

namespace stagecraft::rt {

/// One line when the plan's processors (`plan.processors`) are not this run's GPUs (`devices`:
/// this process's plan devices, all R x P of them numbered as the runtime does): devices on one
/// GPU that the plan has on separate processors (`shared_device_warning`, with the predicted
/// step that no longer holds and the stagec flag that predicts the sharing), or devices the plan
/// has sharing a processor that each have their own GPU here (the prediction counts turns that
/// are not taken). "" when they agree, and for the CPU backend (its devices are threads of one
/// machine; stagerun weighs its cores apart).
std::string processor_warning(const plan::Plan& plan, const Backend& backend,
                              std::span<const int> devices);

}  // namespace stagecraft::rt
