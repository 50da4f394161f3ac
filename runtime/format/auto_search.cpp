// plan.json's "auto_search" (stagec --auto): written, read and checked apart from the rest of the
// plan, which plan.cpp and plan_validate.cpp describe.
#include "runtime/format/auto_search.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "runtime/format/error.h"
#include "runtime/format/json_reader.h"
#include "runtime/format/plan.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::plan {

nlohmann::ordered_json auto_search_json(const std::vector<AutoCandidate>& search) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const AutoCandidate& c : search)
    out.push_back({{"schedule", c.schedule},
                   {"chunks", c.chunks},
                   {"microbatches", c.microbatches},
                   {"microbatch_size", c.microbatch_size},
                   {"data_parallel", c.data_parallel},
                   {"recompute", c.recompute},
                   {"status", c.status},
                   {"step_ms", c.step_ms},
                   {"bubble_fraction", c.bubble_fraction},
                   {"samples_per_s", c.samples_per_s},
                   {"peak_memory_bytes", c.peak_memory_bytes},
                   {"note", c.note}});
  return out;
}

std::vector<AutoCandidate> read_auto_search(const JsonObject& top) {
  if (!top.has("auto_search")) return {};
  return top.array("auto_search", [](const JsonValue& v) {
    JsonObject f = v.object({"schedule", "chunks", "microbatches", "microbatch_size",
                             "data_parallel", "recompute", "status", "step_ms", "bubble_fraction",
                             "samples_per_s", "peak_memory_bytes", "note"});
    AutoCandidate c;
    c.schedule = f.string("schedule");
    c.chunks = f.int32("chunks");
    c.microbatches = f.int32("microbatches");
    c.microbatch_size = f.int64("microbatch_size");
    c.data_parallel = f.int32("data_parallel");
    c.recompute = f.string("recompute");
    c.status = f.string("status");
    c.step_ms = f.number("step_ms");
    c.bubble_fraction = f.number("bubble_fraction");
    c.samples_per_s = f.number("samples_per_s");
    c.peak_memory_bytes = f.int64("peak_memory_bytes");
    c.note = f.string("note");
    return c;
  });
}

namespace {

[[noreturn]] void fault(const std::string& source, std::size_t i, const std::string& field,
                        const std::string& problem) {
  throw Error(ErrorKind::kPlan, fmt::format("field 'auto_search[{}].{}' {}", i, field, problem))
      .in(source);
}

/// One entry on its own: names, counts and numbers.
void check_entry(const Plan& plan, const std::string& source, std::size_t i,
                 const AutoCandidate& c) {
  if (!find_schedule(c.schedule))
    fault(source, i, "schedule",
          fmt::format("is '{}'; valid: {}", c.schedule, fmt::join(schedule_names(), ", ")));
  if (!find_recompute(c.recompute))
    fault(source, i, "recompute",
          fmt::format("is '{}'; valid: {}", c.recompute, fmt::join(recompute_names(), ", ")));
  if (std::none_of(std::begin(kAutoStatuses), std::end(kAutoStatuses),
                   [&](const char* s) { return c.status == s; }))
    fault(source, i, "status",
          fmt::format("is '{}'; valid: {}", c.status, fmt::join(kAutoStatuses, ", ")));
  for (auto [field, n] : {std::pair<const char*, int64_t>{"chunks", c.chunks},
                          {"microbatches", c.microbatches},
                          {"microbatch_size", c.microbatch_size},
                          {"data_parallel", c.data_parallel}})
    if (n < 1) fault(source, i, field, fmt::format("is {}; must be at least 1", n));
  const int64_t batch = c.microbatch_size * c.microbatches * c.data_parallel;
  if (batch != plan.batch)
    fault(source, i, "microbatch_size",
          fmt::format("is {}: {} replicas x {} microbatches x {} = {}, not the plan's batch {}",
                      c.microbatch_size, c.data_parallel, c.microbatches, c.microbatch_size, batch,
                      plan.batch));
  for (auto [field, x] : {std::pair<const char*, double>{"step_ms", c.step_ms},
                          {"samples_per_s", c.samples_per_s},
                          {"peak_memory_bytes", static_cast<double>(c.peak_memory_bytes)}})
    if (!std::isfinite(x) || x < 0)
      fault(source, i, field, fmt::format("is {}; must be a finite number >= 0", x));
  if (!(c.bubble_fraction >= 0 && c.bubble_fraction <= 1))
    fault(source, i, "bubble_fraction", fmt::format("is {}; must be in [0, 1]", c.bubble_fraction));
}

}  // namespace

void check_auto_search(const Plan& plan, const std::string& source) {
  const std::vector<AutoCandidate>& search = plan.auto_search;
  for (std::size_t i = 0; i < search.size(); ++i) {
    const AutoCandidate& c = search[i];
    check_entry(plan, source, i, c);
    if ((i == 0) != (c.status == "chosen"))
      fault(source, i, "status",
            i == 0 ? fmt::format("is '{}'; the first entry is the plan's own, 'chosen'", c.status)
                   : "is 'chosen'; only the first entry is the plan's own");
  }
  if (search.empty()) return;
  const AutoCandidate& c = search.front();
  if (c.schedule != to_string(plan.schedule) || c.chunks != plan.chunks ||
      c.microbatches != plan.microbatches || c.data_parallel != plan.data_parallel)
    fault(
        source, 0, "schedule",
        fmt::format("the chosen entry is {} x{} chunks, {} microbatches, {} replicas; the plan "
                    "is {} x{}, {}, {}",
                    c.schedule, c.chunks, c.microbatches, c.data_parallel, to_string(plan.schedule),
                    plan.chunks, plan.microbatches, plan.data_parallel));
}

}  // namespace stagecraft::plan
