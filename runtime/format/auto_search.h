#pragma once
/// \file
/// stagec --auto's search as plan.json keeps it ("auto_search", absent without --auto): every
/// configuration the search considered, best first, with its predicted step, bubble and peak,
/// or why it has none (refused by the planner, or skipped by the search's lower bound).

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace stagecraft {
class JsonObject;
}

namespace stagecraft::plan {

struct Plan;

/// One configuration of the search. The names are the plan's vocabulary (runtime/format/
/// vocabulary.h); `status` is one of kAutoStatuses.
struct AutoCandidate {
  std::string schedule;
  int chunks = 1;               ///< V per device.
  int microbatches = 1;         ///< M per replica.
  int64_t microbatch_size = 1;  ///< Global batch / (R x M).
  int data_parallel = 1;        ///< R.
  std::string recompute = "none";
  /// "chosen" (the plan written), "fits", "over_memory" (planned, a device over its memory),
  /// "refused" (the planner refused it: `note` says why) or "pruned" (its lower bound was no
  /// shorter than the best step found: `note` gives both).
  std::string status;
  double step_ms = 0;             ///< 0 unless planned.
  double bubble_fraction = 0;     ///< 0 unless planned.
  double samples_per_s = 0;       ///< 0 unless planned.
  int64_t peak_memory_bytes = 0;  ///< The largest device peak; 0 unless planned.
  std::string note;
};

/// The statuses of AutoCandidate, in the order the search ranks them.
inline constexpr const char* kAutoStatuses[] = {"chosen", "fits", "over_memory", "pruned",
                                                "refused"};

nlohmann::ordered_json auto_search_json(const std::vector<AutoCandidate>& search);

/// Reads plan.json's optional "auto_search" (empty when absent).
std::vector<AutoCandidate> read_auto_search(const JsonObject& top);

/// Checks `plan.auto_search`: known names and statuses, positive counts, R x M x microbatch
/// size equal to the plan's global batch, exactly one "chosen" entry (the first) matching the
/// plan's own schedule, chunks, microbatches and replicas; throws Error(kPlan) naming the field.
void check_auto_search(const Plan& plan, const std::string& source);

}  // namespace stagecraft::plan
