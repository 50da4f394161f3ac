#pragma once
/// \file
/// Stage graphs: the part of the model each stage runs, as a valid ONNX model with its own
/// weights, and the tensors that cross between stages.

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "compiler/ir/graph.h"

namespace stagecraft::plan {

/// A tensor that one stage writes and later stages read.
struct CutTensor {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;  ///< Per microbatch.
  int producer_stage = 0;
  std::vector<int> consumer_stages;  ///< Ascending.
  int64_t bytes = 0;
};

/// What crosses between the stages of an assignment, and which graph inputs go to which stage.
struct StageInterfaces {
  std::vector<CutTensor> cut_tensors;
  /// Per graph input (in graph order): the stages that read it (labels go straight there).
  std::vector<std::vector<int>> input_stages;
};

/// The tensors crossing between stages under `stage_of` (node id -> stage).
StageInterfaces stage_interfaces(const ir::Graph& graph, const std::vector<int>& stage_of);

/// Stage `k` as an ONNX model: its nodes, the initializers they read (embedded), inputs = cut
/// tensors and graph inputs it reads, outputs = cut tensors it writes and graph outputs.
onnx::ModelProto stage_model(const ir::Graph& graph, const std::vector<int>& stage_of, int stage);

}  // namespace stagecraft::plan
