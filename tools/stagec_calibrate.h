#pragma once
/// \file
/// stagec --calibrate: fits per-instruction costs and per-(stage, kind) factors
/// (cost_models/calibration.h) to a measured run of a plan and keeps them in the profile
/// database, where the next `stagec --profile` plan of the same model and shape finds them.

#include <string>

namespace stagecraft::tools {

/// `stagec PLAN_DIR --calibrate TRACE [--profile-db DB]`: reads PLAN_DIR (a plan made with
/// --profile) and TRACE (`stagerun PLAN_DIR --trace TRACE`, checked to be a run of that plan:
/// devices, instruction order, step count), fits over its steps after the first, stores the
/// result under the plan's calibration key in `db_path` and prints what it fitted. Throws
/// `Error` naming the file and what differs for a trace of another plan, a plan not made with
/// measured times, or a trace with fewer than 2 steps.
void calibrate(const std::string& plan_dir, const std::string& trace_path,
               const std::string& db_path);

}  // namespace stagecraft::tools
