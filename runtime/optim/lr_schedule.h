#pragma once
/// \file
/// Learning-rate schedules: the learning rate of each optimizer step as a function of the
/// 1-based step number s (the first update is s = 1). All three share an optional linear
/// warm-up over the first W = `warmup_steps` steps, lr = base * s / W for s <= W (so step W
/// reaches the base rate), then:
///
///   constant        lr = base
///   warmup-linear   lr = base * (T - s) / (T - W), linear to 0 at s = T = `total_steps`
///   cosine          lr = base * (1 + cos(pi * (s - W) / (T - W))) / 2, 0 at s = T
///
/// and 0 after T for the decaying ones. This is the shape of Hugging Face's
/// get_linear_schedule_with_warmup / get_cosine_schedule_with_warmup (half a cycle), indexed by
/// the step being taken rather than the number already taken, so no step runs with lr 0 during
/// warm-up.

#include <cstdint>
#include <string_view>
#include <vector>

namespace stagecraft::rt::optim {

enum class LrScheduleKind { kConstant, kWarmupLinear, kCosine };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  double base_lr = 1e-3;
  int64_t warmup_steps = 0;  ///< W >= 0.
  int64_t total_steps = 0;   ///< T >= W; needed (> 0) by warmup-linear and cosine.
};

/// "constant", "warmup-linear", "cosine".
std::string_view to_string(LrScheduleKind kind);

/// The names `parse_lr_schedule` accepts, in that order.
const std::vector<std::string_view>& lr_schedule_names();

/// The schedule kind named `name`; `Error(kUsage)` listing the valid names otherwise.
LrScheduleKind parse_lr_schedule(std::string_view name);

/// Checks a schedule: base_lr >= 0, 0 <= W, and for the decaying kinds 0 < T and W <= T
/// (a constant schedule needs no T). Throws `Error(kUsage)` naming the bad field.
void validate(const LrSchedule& schedule);

/// The learning rate of step `step` (1-based). Throws `Error(kInternal)` for step < 1 and
/// whatever `validate` throws.
double lr_at(const LrSchedule& schedule, int64_t step);

}  // namespace stagecraft::rt::optim
