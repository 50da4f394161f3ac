#pragma once
/// \file
/// stagerun's report of a run: the figures as text or as JSON Lines (--json; the schema is
/// docs/schemas/stagerun.schema.json, the fields are listed in tools/stagerun.cpp's comment),
/// the graph outputs (--outputs) and the Chrome trace (--trace).

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/exec/pipeline.h"
#include "tools/stagerun_args.h"

namespace stagecraft::tools {

/// --outputs: the last step's graph outputs as DIR/NAME.npy; the files written, for the report.
nlohmann::ordered_json write_outputs(const rt::RunReport& report, const std::string& outputs_dir);

/// --trace: the measured run as a Chrome trace ('-': stdout), in the form of stagedump --trace.
void write_trace(const rt::RunReport& report, const Args& args, const rt::Pipeline& pipeline);

/// --json: one record per step, a "stopped" record after a stop signal, then the summary.
/// `first_step`: optimizer steps done before the run (--resume); `auto_reason`: why --backend
/// auto chose the backend ("" otherwise); `gap`: the prediction's note ("" for none); `epochs`:
/// each step's epoch (--tokens; empty otherwise).
void print_json(const rt::RunReport& report, const rt::Pipeline& pipeline, const Args& args,
                std::string_view backend, const std::string& auto_reason, int64_t first_step,
                const nlohmann::ordered_json& outputs, const std::vector<std::string>& warnings,
                const std::string& gap, const std::vector<int64_t>& epochs = {});

/// The figures as text (`backend` as it is to be named, with --backend auto's reason).
void print_text(const rt::RunReport& report, const rt::Pipeline& pipeline, const Args& args,
                std::string_view backend, int64_t first_step, const nlohmann::ordered_json& outputs,
                const std::string& gap, const std::vector<int64_t>& epochs = {});

}  // namespace stagecraft::tools
