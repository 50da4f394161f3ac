#pragma once
/// \file
/// Which of a model's float32 initializers a training plan trains, and how, beside what the
/// exporter wrote: --freeze, the buffers PyTorch never trains (masks), an embedding's padding
/// row, and the line naming the weights the exporter had merged. Each sets flags on the planned
/// graph's values (ir::Value::frozen, padding_rows) and a line for stagec to print.

#include <string>
#include <vector>

#include "compiler/plan/planner.h"

namespace stagecraft::plan {

/// --freeze: marks the float32 initializers matching any pattern as frozen (ir::Value::frozen);
/// a pattern that matches none is refused (a typo would otherwise train what was meant frozen).
void freeze_weights(PlannedModel& out, const PlanOptions& o);

/// Training: float32 initializers PyTorch would not train (passes::untrainable_reason) are
/// frozen unless a --train-also pattern names them; one line lists them.
void freeze_untrainable(PlannedModel& out, const PlanOptions& o);

/// Training: an embedding table's padding row (see the definition) gets no gradient from its
/// lookups (ir::Value::padding_rows) unless a --train-also pattern names the table; one line
/// lists them.
void keep_padding_rows(PlannedModel& out, const PlanOptions& o);

/// Training: the line saying which weights the exporter had merged now train apart ("" when none).
std::string untie_summary(const std::vector<std::string>& untied);

}  // namespace stagecraft::plan
