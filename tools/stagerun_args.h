#pragma once
/// \file
/// stagerun's command line, shared by its files (tools/stagerun*.cpp).

#include <cstdint>
#include <optional>
#include <string>

namespace stagecraft::tools {

/// stagerun's command line (tools/stagerun.cpp declares its options).
struct Args {
  std::string plan_dir, backend_name = "auto", inputs_path, outputs_dir, trace_path, inject_fault;
  std::string data_dir, checkpoint_dir, resume_dir, export_path, inject_kill, inject_hang;
  std::string transport = "auto";
  std::string tokens_path, token_dtype;  ///< --tokens FILE, --token-dtype (raw files).
  std::optional<int64_t> seq;            ///< --seq T (the plan's when not given).
  uint64_t seed = 0;
  bool shuffle = false;
  int steps = 1, threads = 1, save_every = 0;
  int64_t trace_steps = 100;
  double timeout_s = 60, bucket_mb = 25;
  std::optional<double> loss_scale;
  std::optional<int64_t> loss_scale_window;
  bool synthetic = false, json = false, quiet = false, skip_nonfinite = false, no_overlap = false;
  bool profile_nodes = false;
  bool deterministic = false;
  int spin_us = 0;  ///< --spin-us
  /// Held-out evaluation (tools/stagerun_eval.h): --eval-data DIR or --eval-tokens FILE,
  /// --eval-every N, --eval-batches K.
  std::string eval_data_dir, eval_tokens_path;
  std::optional<int64_t> eval_every, eval_batches;
};

}  // namespace stagecraft::tools
