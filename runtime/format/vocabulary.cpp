#include "runtime/format/vocabulary.h"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <string>
#include <utility>

#include "runtime/format/error.h"
#include "runtime/format/suggest.h"

namespace stagecraft {
namespace {

/// One enum's name table: every value with its name, in declaration order.
template <typename Enum, size_t N>
using Table = std::array<std::pair<Enum, std::string_view>, N>;

constexpr Table<ScheduleKind, 8> kSchedules = {{
    {ScheduleKind::kGPipe, "gpipe"},
    {ScheduleKind::k1F1B, "1f1b"},
    {ScheduleKind::kInterleaved, "interleaved"},
    {ScheduleKind::kZBH1, "zb-h1"},
    {ScheduleKind::kZBV, "zb-v"},
    {ScheduleKind::kDualPipeV, "dualpipev"},
    {ScheduleKind::kInference, "inference"},
    {ScheduleKind::kCustom, "custom"},
}};

constexpr Table<OptimizerKind, 8> kOptimizers = {{
    {OptimizerKind::kNone, "none"},
    {OptimizerKind::kSgd, "sgd"},
    {OptimizerKind::kMomentum, "momentum"},
    {OptimizerKind::kNesterov, "nesterov"},
    {OptimizerKind::kAdam, "adam"},
    {OptimizerKind::kAdamW, "adamw"},
    {OptimizerKind::kAdam8bit, "adam8bit"},
    {OptimizerKind::kAdagrad, "adagrad"},
}};

constexpr Table<Precision, 3> kPrecisions = {{
    {Precision::kFp32, "fp32"},
    {Precision::kMixed, "mixed"},
    {Precision::kFp16, "fp16"},
}};

constexpr Table<Objective, 2> kObjectives = {{
    {Objective::kSpeed, "speed"},
    {Objective::kMemory, "memory"},
}};

constexpr Table<Recompute, 3> kRecomputes = {{
    {Recompute::kNone, "none"},
    {Recompute::kAll, "all"},
    {Recompute::kAuto, "auto"},
}};

constexpr Table<DeviceKind, 2> kDeviceKinds = {{
    {DeviceKind::kCpu, "cpu"},
    {DeviceKind::kGpu, "gpu"},
}};

constexpr Table<LrScaling, 3> kLrScalings = {{
    {LrScaling::kNone, "none"},
    {LrScaling::kLinear, "linear"},
    {LrScaling::kSqrt, "sqrt"},
}};

template <typename Enum, size_t N>
std::string_view name_in(const Table<Enum, N>& table, Enum value) {
  for (const auto& [known, name] : table)
    if (known == value) return name;
  return "unknown";
}

template <typename Enum, size_t N>
std::vector<std::string_view> names_in(const Table<Enum, N>& table) {
  std::vector<std::string_view> names;
  for (const auto& entry : table) names.push_back(entry.second);
  return names;
}

template <typename Enum, size_t N>
std::optional<Enum> find_in(const Table<Enum, N>& table, std::string_view name) {
  for (const auto& [value, known] : table)
    if (known == name) return value;
  return std::nullopt;
}

/// Command-line spellings are case-insensitive (`1F1B`, `GPipe`, `Speed`); plan.json is written
/// by us and read exactly (`find_in`).
template <typename Enum, size_t N>
Enum parse_in(const Table<Enum, N>& table, std::string_view what, std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (std::optional<Enum> value = find_in(table, lower)) return *value;
  fail(ErrorKind::kUsage, "unknown {} '{}'{}; valid: {}", what, name,
       did_you_mean(name, names_in(table)), fmt::join(names_in(table), ", "));
}

}  // namespace

std::string_view to_string(ScheduleKind kind) { return name_in(kSchedules, kind); }
std::string_view to_string(OptimizerKind kind) { return name_in(kOptimizers, kind); }
std::string_view to_string(Precision precision) { return name_in(kPrecisions, precision); }
std::string_view to_string(Objective objective) { return name_in(kObjectives, objective); }
std::string_view to_string(Recompute recompute) { return name_in(kRecomputes, recompute); }
std::string_view to_string(LrScaling scaling) { return name_in(kLrScalings, scaling); }
std::string_view to_string(DeviceKind kind) { return name_in(kDeviceKinds, kind); }

const std::vector<std::string_view>& schedule_names() {
  static const std::vector<std::string_view> names = names_in(kSchedules);
  return names;
}
const std::vector<std::string_view>& optimizer_names() {
  static const std::vector<std::string_view> names = names_in(kOptimizers);
  return names;
}
const std::vector<std::string_view>& precision_names() {
  static const std::vector<std::string_view> names = names_in(kPrecisions);
  return names;
}
const std::vector<std::string_view>& objective_names() {
  static const std::vector<std::string_view> names = names_in(kObjectives);
  return names;
}
const std::vector<std::string_view>& recompute_names() {
  static const std::vector<std::string_view> names = names_in(kRecomputes);
  return names;
}
const std::vector<std::string_view>& lr_scaling_names() {
  static const std::vector<std::string_view> names = names_in(kLrScalings);
  return names;
}
const std::vector<std::string_view>& device_kind_names() {
  static const std::vector<std::string_view> names = names_in(kDeviceKinds);
  return names;
}

std::optional<ScheduleKind> find_schedule(std::string_view name) {
  return find_in(kSchedules, name);
}
std::optional<OptimizerKind> find_optimizer(std::string_view name) {
  return find_in(kOptimizers, name);
}
std::optional<Precision> find_precision(std::string_view name) {
  return find_in(kPrecisions, name);
}
std::optional<Objective> find_objective(std::string_view name) {
  return find_in(kObjectives, name);
}
std::optional<Recompute> find_recompute(std::string_view name) {
  return find_in(kRecomputes, name);
}
std::optional<LrScaling> find_lr_scaling(std::string_view name) {
  return find_in(kLrScalings, name);
}
std::optional<DeviceKind> find_device_kind(std::string_view name) {
  return find_in(kDeviceKinds, name);
}

ScheduleKind parse_schedule(std::string_view name) {
  return parse_in(kSchedules, "schedule", name);
}
OptimizerKind parse_optimizer(std::string_view name) {
  return parse_in(kOptimizers, "optimizer", name);
}
Precision parse_precision(std::string_view name) {
  return parse_in(kPrecisions, "precision", name);
}
Objective parse_objective(std::string_view name) {
  return parse_in(kObjectives, "objective", name);
}
Recompute parse_recompute(std::string_view name) {
  return parse_in(kRecomputes, "recompute", name);
}
LrScaling parse_lr_scaling(std::string_view name) {
  return parse_in(kLrScalings, "learning-rate scaling", name);
}

}  // namespace stagecraft
