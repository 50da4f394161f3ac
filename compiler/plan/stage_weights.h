#pragma once
/// \file
/// Where a written plan keeps its weights. A stage file is a valid ONNX model whose large
/// initializers are ONNX external data: either windows of the model's own external-data files
/// (referenced, never copied: a plan of a 700 GB model is a few MB, `Plan::weight_files`), or
/// the stage's own `stage_K.weights` file in the plan directory, streamed one tensor at a time
/// (an inline model, a tensor the passes made, or everything with `--copy-weights`). Small
/// initializers stay embedded. Planning never holds more than one tensor's bytes here.

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "runtime/format/plan.h"
#include "runtime/format/weights_hash.h"

namespace stagecraft::plan {

/// Initializers of at most this many bytes stay inside the stage file (ONNX's own
/// `convert_model_to_external_data` uses the same threshold).
inline constexpr int64_t kEmbeddedWeightBytes = 1024;

/// Offsets of tensors in a stage's weights file are multiples of this (aligned loads and maps).
inline constexpr int64_t kWeightAlignment = 64;

struct WeightWriting {
  /// Copy every weight into the plan directory, the model's external data too (a
  /// self-contained plan to ship to another machine).
  bool copy = false;
  /// Called after every GiB placed with the bytes placed so far in the plan, the stage being
  /// placed and the stage count (progress on large models).
  std::function<void(int64_t placed, int stage, int stages)> progress = {};
};

/// Gives the initializers of `model` (a stage file written from `graph` with
/// `ir::WeightMode::kNoData`) their bytes: embedded up to `kEmbeddedWeightBytes`; otherwise a
/// reference into the model's external-data file (added to `weight_files` once per file, as
/// "model_weights/<the model's location>") or, for owned bytes and with `writing.copy`, a window
/// of `folder/<stage file's stem>.weights`. Sets `stage.weights_bytes` and `weights_hash` over
/// every external initializer's bytes in file order (the runtime checks them as it loads).
/// `placed_before` (the plan's earlier stages' bytes) and `stages` are for progress. Throws
/// `Error(kIo)` naming the file on a failed read or write.
void place_stage_weights(onnx::ModelProto& model, const ir::Graph& graph,
                         const std::filesystem::path& folder, Stage& stage,
                         std::vector<WeightFile>& weight_files, const WeightWriting& writing,
                         int64_t placed_before = 0, int stages = 1);

}  // namespace stagecraft::plan
