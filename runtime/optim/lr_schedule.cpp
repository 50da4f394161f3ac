#include "runtime/optim/lr_schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <numbers>

#include "runtime/format/error.h"

namespace stagecraft::rt::optim {

std::string_view to_string(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kWarmupLinear:
      return "warmup-linear";
    case LrScheduleKind::kCosine:
      return "cosine";
  }
  return "?";
}

const std::vector<std::string_view>& lr_schedule_names() {
  static const std::vector<std::string_view> names = {"constant", "warmup-linear", "cosine"};
  return names;
}

LrScheduleKind parse_lr_schedule(std::string_view name) {
  for (LrScheduleKind kind :
       {LrScheduleKind::kConstant, LrScheduleKind::kWarmupLinear, LrScheduleKind::kCosine}) {
    if (name == to_string(kind)) return kind;
  }
  fail(ErrorKind::kUsage, "unknown learning-rate schedule '{}' (expected one of: {})", name,
       fmt::join(lr_schedule_names(), ", "));
}

void validate(const LrSchedule& s) {
  if (!(s.base_lr >= 0.0) || !std::isfinite(s.base_lr)) {
    fail(ErrorKind::kUsage, "learning rate must be a finite number >= 0, got {}", s.base_lr);
  }
  if (s.warmup_steps < 0)
    fail(ErrorKind::kUsage, "warm-up steps must be >= 0, got {}", s.warmup_steps);
  if (s.kind == LrScheduleKind::kConstant) return;
  if (s.total_steps <= 0) {
    fail(ErrorKind::kUsage, "the {} schedule needs total steps > 0, got {}", to_string(s.kind),
         s.total_steps);
  }
  if (s.warmup_steps > s.total_steps) {
    fail(ErrorKind::kUsage, "warm-up steps ({}) exceed total steps ({})", s.warmup_steps,
         s.total_steps);
  }
}

double lr_at(const LrSchedule& s, int64_t step) {
  validate(s);
  if (step < 1)
    fail(ErrorKind::kInternal, "learning-rate schedule asked for step {} (steps count from 1)",
         step);
  const double base = s.base_lr;
  if (step <= s.warmup_steps) {
    return base * static_cast<double>(step) / static_cast<double>(s.warmup_steps);
  }
  if (s.kind == LrScheduleKind::kConstant) return base;
  if (step >= s.total_steps) return 0.0;
  // W < step < T, so T - W > 0.
  const double progress = static_cast<double>(step - s.warmup_steps) /
                          static_cast<double>(s.total_steps - s.warmup_steps);
  if (s.kind == LrScheduleKind::kWarmupLinear) return base * (1.0 - progress);
  return base * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace stagecraft::rt::optim
