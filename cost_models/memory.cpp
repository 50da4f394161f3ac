#include "cost_models/memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/format/error.h"

namespace stagecraft::cost {
namespace {

/// Exact while the bytes stay below 2^53 (8 PiB), far beyond any device.
int64_t bytes_for(int64_t count, double bytes_per_item) {
  double bytes = static_cast<double>(count) * bytes_per_item;
  if (bytes >= 9223372036854775808.0) {
    fail(ErrorKind::kPlan, "{} items of {} bytes do not fit in int64", count, bytes_per_item);
  }
  return static_cast<int64_t>(std::llround(bytes));
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) fail(ErrorKind::kPlan, "memory total overflows int64");
  return sum;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    fail(ErrorKind::kPlan, "{} microbatches of {} activation bytes overflow int64", a, b);
  }
  return product;
}

}  // namespace

double optimizer_state_bytes_per_param(OptimizerKind optimizer, Precision) {
  switch (optimizer) {
    case OptimizerKind::kNone:
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kMomentum:
    case OptimizerKind::kNesterov:
    case OptimizerKind::kAdagrad:
      return 4;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return 8;
    case OptimizerKind::kAdam8bit:
      return 2;
  }
  return 0;
}

double weight_bytes_per_param(Precision precision, bool training) {
  if (precision == Precision::kFp32) return 4;
  return training ? 6 : 2;
}

double gradient_bytes_per_param(Precision) { return 4; }

int64_t microbatches_in_flight(ScheduleKind schedule, int stages, int stage_index, int microbatches,
                               int chunks) {
  if (stages < 1 || stage_index < 0 || stage_index >= stages || microbatches < 1 || chunks < 1) {
    fail(ErrorKind::kUsage,
         "microbatches in flight: need stages >= 1, 0 <= stage < stages, microbatches >= 1 and "
         "chunks >= 1; got stages {}, stage {}, microbatches {}, chunks {}",
         stages, stage_index, microbatches, chunks);
  }
  const int64_t p = stages, i = stage_index, m = microbatches, v = chunks;
  switch (schedule) {
    case ScheduleKind::kGPipe:
      return m;
    case ScheduleKind::k1F1B:
    case ScheduleKind::kZBH1:
      return std::min(p - i, m);
    case ScheduleKind::kInterleaved:
      if (v == 1) return std::min(p - i, m);
      return std::min(m * v, 2 * (p - i - 1) + (v - 1) * p + 1);
    case ScheduleKind::kZBV:
      // Both chunks of the V together (stage i holds min(2P - i, M), stage 2P-1-i min(i + 1,
      // M)): 2P chunk-microbatches on every device once M >= 2P - 1, 1F1B's peak on its first.
      return std::min({2 * p, 2 * m, m + i + 1});
    case ScheduleKind::kDualPipeV:
      // Both chunks: stage i holds 2P - i and stage 2P-1-i holds i + 1, and the forward of each
      // overlapped pair runs before its backward frees one: 2P + 1 on every device (M >= 2P).
      return std::min(2 * p + 1, 2 * m);
    case ScheduleKind::kInference:
      return 1;
    case ScheduleKind::kCustom:
      return m;  // no formula: the bound (the planner counts a custom order's own peaks)
  }
  return m;
}

MemoryBytes stage_memory(int64_t params, int64_t trainable_params,
                         int64_t activation_bytes_per_microbatch, int64_t temporary_peak_bytes,
                         int64_t comm_buffer_bytes, int64_t in_flight, OptimizerKind optimizer,
                         Precision precision, bool training, bool recompute,
                         int64_t stage_input_bytes_per_microbatch, int64_t constant_bytes) {
  if (params < 0 || trainable_params < 0 || trainable_params > params ||
      activation_bytes_per_microbatch < 0 || temporary_peak_bytes < 0 || comm_buffer_bytes < 0 ||
      in_flight < 0 || stage_input_bytes_per_microbatch < 0 || constant_bytes < 0) {
    fail(ErrorKind::kInternal,
         "stage_memory: negative argument or more trainable parameters than parameters (params "
         "{}, trainable {}, activations {}, temporary {}, communication {}, in flight {}, stage "
         "input {})",
         params, trainable_params, activation_bytes_per_microbatch, temporary_peak_bytes,
         comm_buffer_bytes, in_flight, stage_input_bytes_per_microbatch);
  }
  MemoryBytes anatomy;
  anatomy.weights =
      checked_add(bytes_for(params, weight_bytes_per_param(precision, training)), constant_bytes);
  if (training) {
    anatomy.gradients = bytes_for(trainable_params, gradient_bytes_per_param(precision));
    anatomy.optimizer =
        bytes_for(trainable_params, optimizer_state_bytes_per_param(optimizer, precision));
  }
  if (training && recompute) {
    anatomy.activations = checked_add(checked_mul(in_flight, stage_input_bytes_per_microbatch),
                                      activation_bytes_per_microbatch);
  } else {
    anatomy.activations = checked_mul(in_flight, activation_bytes_per_microbatch);
  }
  anatomy.temporary = temporary_peak_bytes;
  anatomy.communication = comm_buffer_bytes;
  anatomy.total();  // Refuses a total past int64 here rather than in a caller.
  return anatomy;
}

std::string describe(const MemoryBytes& anatomy, int64_t in_flight) {
  const int64_t total = anatomy.total();
  if (total == 0) return "0 B";
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  double scale = 1;
  while (unit + 1 < static_cast<int>(std::size(kUnits)) &&
         static_cast<double>(total) >= scale * 1024) {
    scale *= 1024;
    ++unit;
  }
  auto amount = [&](int64_t bytes) {
    return unit == 0 ? fmt::format("{}", bytes)
                     : fmt::format("{:.1f}", static_cast<double>(bytes) / scale);
  };
  std::vector<std::string> parts;
  auto add = [&](const char* what, int64_t bytes, std::string suffix = "") {
    if (bytes != 0) parts.push_back(fmt::format("{} {}{}", what, amount(bytes), suffix));
  };
  add("weights", anatomy.weights);
  add("gradients", anatomy.gradients);
  add("optimizer", anatomy.optimizer);
  add("activations", anatomy.activations,
      fmt::format(" for {} microbatch{} in flight", in_flight, in_flight == 1 ? "" : "es"));
  add("temporary", anatomy.temporary);
  add("communication", anatomy.communication);
  return fmt::format("{} {}: {}", amount(total), kUnits[unit], fmt::join(parts, ", "));
}

}  // namespace stagecraft::cost
