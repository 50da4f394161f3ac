#pragma once
/// \file
/// Stage graphs: the part of the model each stage runs, as a valid ONNX model with its own
/// weights, and the tensors that cross between stages.

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "runtime/format/plan.h"

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
  /// The weights several stages read (`shared_weights`).
  std::vector<SharedWeight> shared_weights;
};

/// The tensors crossing between stages under `stage_of` (node id -> stage).
StageInterfaces stage_interfaces(const ir::Graph& graph, const std::vector<int>& stage_of);

/// The trainable weights (passes/autodiff.h `trainable_weights` of the whole graph) that nodes
/// of two or more stages read under `stage_of`, in graph value order, each with its holders
/// (ascending). Every holder's stage file embeds its own copy (`stage_model`).
std::vector<SharedWeight> shared_weights(const ir::Graph& graph, const std::vector<int>& stage_of);

/// Stage `k` as an ONNX model: its nodes, the initializers they read (embedded), inputs = cut
/// tensors and graph inputs it reads, outputs = cut tensors it writes and graph outputs.
onnx::ModelProto stage_model(const ir::Graph& graph, const std::vector<int>& stage_of, int stage);

/// The backward program of `stage` (passes/autodiff.h): seeded by the gradients of its outputs
/// that later stages read and, on the loss stage (the one producing `loss_output`), by the
/// loss; producing the gradients of its float inputs from other stages and of its trainable
/// weights. `stage` needs its inputs and outputs filled in.
onnx::ModelProto backward_stage_model(const ir::Graph& graph, const std::vector<int>& stage_of,
                                      const Stage& stage, const std::string& loss_output);

/// Bytes of the arena a program's intermediates need when the runtime runs it
/// (runtime/format/lifetimes.h `intermediate_lifetimes`, placed by plan_memory): what
/// runtime/core/program.cpp plans for a file it loads.
int64_t program_arena_bytes(const onnx::ModelProto& model);

/// Bytes a split backward (zero-bubble B then W) holds from B to W: the values its B part
/// computes that its W part reads (runtime/format/lifetimes.h `deferred_bytes`, the W rule the
/// runtime defers by); 0 when a B node reads a W result (nothing can be deferred then).
int64_t deferred_bytes(const onnx::ModelProto& model);

}  // namespace stagecraft::plan
