#pragma once
/// \file
/// plan.json's `processors` (plan.h ProcessorSharing): written, read and checked here, beside
/// plan.cpp and plan_validate.cpp, which call these.

#include <nlohmann/json.hpp>
#include <string>

#include "runtime/format/json_reader.h"
#include "runtime/format/plan.h"

namespace stagecraft::plan {

/// The JSON object plan.json holds as `processors`.
nlohmann::ordered_json processors_json(const ProcessorSharing& sharing);

/// Reads the field `processors` of plan.json's top object.
ProcessorSharing read_processors(const JsonObject& top);

/// Throws `Error(kPlan)` naming `source` and the field unless the plan's devices per processor
/// are in [1, devices] (1 with data parallelism, which the planner does not model shared),
/// `processors.processor_of` is `processor_of_devices` of them, the overlap is in [0, 1) and
/// the separate step is finite and not negative.
void check_processors(const Plan& plan, const std::string& source);

}  // namespace stagecraft::plan
