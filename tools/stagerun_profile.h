#pragma once
/// \file
/// stagerun --profile-nodes: the per-node profile of a run's last step (RunReport::node_profile)
/// as a table by op type and by node, and as the --json record "node_profile" (its fields are
/// in docs/schemas/stagerun.schema.json).

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/exec/pipeline.h"
#include "tools/stagerun_args.h"

namespace stagecraft::tools {

/// What the achieved rates are set against: the plan's device (plan.json's device rates, the
/// cost model's), where the backend that ran is of its kind and the plan records them.
struct ProfileSpec {
  std::string name;
  double product_peak = 0;  ///< FLOP/s of the products in the plan's precision.
  double memory_bandwidth = 0;
};

/// The plan's device rates, or nullopt (another kind of backend ran it, or a plan that
/// records none).
std::optional<ProfileSpec> profile_spec(const plan::Plan& plan, DeviceKind backend_kind);

/// The table (stdout): the op types by time, then the `top` nodes taking the most time.
void print_node_profile(const rt::RunReport& report, const plan::Plan& plan,
                        const std::optional<ProfileSpec>& spec, std::string_view clock,
                        int64_t step, int top = 15);

/// The --json record {"type": "node_profile", ...}: every node and the op types' sums.
nlohmann::ordered_json node_profile_json(const rt::RunReport& report, const plan::Plan& plan,
                                         const std::optional<ProfileSpec>& spec,
                                         std::string_view clock, int64_t step);

/// --profile-nodes after a run that profiled a step (report.profiled_step >= 0): the table,
/// or with --json the record. `first_step`: optimizer steps done before the run (--resume).
void print_profile(const rt::RunReport& report, const rt::Pipeline& pipeline, const Args& args,
                   const rt::Backend& backend, int64_t first_step);

}  // namespace stagecraft::tools
