#pragma once
/// \file
/// Stage graphs: the part of the model each stage runs, as a valid ONNX model with its own
/// weights, and the tensors that cross between stages.

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "compiler/ir/onnx_bridge.h"
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
  ir::ValueId value = ir::kNoId;  ///< The graph's value.
  bool graph_output = false;      ///< The value is also an output of the graph.
};

/// What crosses between the stages of an assignment, and which graph inputs go to which stage.
struct StageInterfaces {
  std::vector<CutTensor> cut_tensors;
  /// Per graph input (in graph order): the stages that read it (labels go straight there).
  std::vector<std::vector<int>> input_stages;
  /// The weights several stages read (`shared_weights`).
  std::vector<SharedWeight> shared_weights;
};

/// The tensors crossing between stages under `stage_of` (node id -> stage). `trainable`: the
/// graph's trainable weights when the caller has them, sorted by id without repeats (a split
/// search, once for every split).
StageInterfaces stage_interfaces(const ir::Graph& graph, const std::vector<int>& stage_of,
                                 const std::vector<ir::ValueId>* trainable = nullptr);

/// The graph's trainable weights (passes/autodiff.h `trainable_weights`), sorted by id without
/// repeats: what `stage_interfaces` and `shared_weights` take as `trainable` (the split search
/// finds them once for every split it scores).
std::vector<ir::ValueId> sorted_trainable_weights(const ir::Graph& graph);

/// The trainable weights (passes/autodiff.h `trainable_weights` of the whole graph) that nodes
/// of two or more stages read under `stage_of`, in graph value order, each with its holders
/// (ascending). Every holder's stage file embeds its own copy (`stage_model`). `trainable`: those
/// weights when the caller has them, sorted by id without repeats (otherwise found here).
std::vector<SharedWeight> shared_weights(const ir::Graph& graph, const std::vector<int>& stage_of,
                                         const std::vector<ir::ValueId>* trainable = nullptr);

/// Stage `k` as an ONNX model: its nodes, the initializers they read (embedded; with
/// `weights` kAsInputs, typed inputs without bytes, for what needs only the graph), inputs = cut
/// tensors and graph inputs it reads, outputs = cut tensors it writes and graph outputs.
/// `order`: partition::partition_order(graph) when the caller has it (one per stage would
/// otherwise be computed here).
onnx::ModelProto stage_model(const ir::Graph& graph, const std::vector<int>& stage_of, int stage,
                             ir::WeightMode weights = ir::WeightMode::kEmbed,
                             const std::vector<ir::NodeId>* order = nullptr);

/// The backward program of `stage` (passes/autodiff.h): seeded by the gradients of its outputs
/// that later stages read and, on the loss stage (the one producing `loss_output`), by the
/// loss; producing the gradients of its float inputs from other stages and of its trainable
/// weights. `stage` needs its inputs and outputs filled in. `order`: graph.topological_order()
/// when the caller has it.
onnx::ModelProto backward_stage_model(const ir::Graph& graph, const std::vector<int>& stage_of,
                                      const Stage& stage, const std::string& loss_output,
                                      const std::vector<ir::NodeId>* order = nullptr);

/// Bytes of the arena a program's intermediates need when the runtime runs it
/// (runtime/format/lifetimes.h `intermediate_lifetimes`, placed by plan_memory): what
/// runtime/core/program.cpp plans for a file it loads.
int64_t program_arena_bytes(const onnx::ModelProto& model);

/// Bytes a split backward (zero-bubble B then W) holds from B to W: the values its B part
/// computes that its W part reads (runtime/format/lifetimes.h `deferred_bytes`, the W rule the
/// runtime defers by); 0 when a B node reads a W result (nothing can be deferred then).
int64_t deferred_bytes(const onnx::ModelProto& model);

}  // namespace stagecraft::plan

namespace stagecraft::plan {

/// The arena of a program as the runtime plans it for a file with no recorded arena
/// (runtime/core/program.cpp): its bytes, and where each intermediate lives.
std::pair<int64_t, std::vector<ArenaTensor>> program_arena(const onnx::ModelProto& model);

/// What `make_mixed` changed that the simulation reads.
struct MixedStages {
  std::vector<int64_t> input_bytes_delta;  ///< Per stage: bytes its inputs gained (< 0: lost).
  /// Per stage: the bytes of its nodes' outputs of every type (what a training forward keeps
  /// per microbatch, as planning's NodeFacts::output_bytes counts it) in the mixed graph, at
  /// their own dtypes: bfloat16 activations, the inputs' 16-bit copies, the loss's float32
  /// values, Dropout's bool masks; the initializers' 16-bit copies are left out
  /// (`weight_copy_bytes`).
  std::vector<int64_t> activation_bytes;
  /// Per stage, training: the bytes of the 16-bit copies of its weights and constants (the
  /// Casts of float32 initializers) that its backward reads. A training step keeps one of each
  /// for all its microbatches (runtime/exec/device_worker.cpp `share_step_copies`), with the
  /// weights; the other Casts' outputs live in the arena.
  std::vector<int64_t> weight_copy_bytes;
};

/// `--precision mixed` (or fp16) on a split model: runs passes/mixed_precision.cpp over `graph`
/// computing in `sixteen_bit` (bfloat16 or float16; its Casts join their readers' stages in
/// `stage_of`), then brings each stage's record up to the graphs the writer will write: the
/// dtype and bytes of its inputs and outputs (activations crossing stages are 16-bit), its
/// forward arena and placement, its backward arena, and the memory anatomy's temporary and
/// communication bytes that follow from them.
MixedStages make_mixed(ir::Graph& graph, std::vector<int>& stage_of, std::vector<Stage>& stages,
                       const std::string& loss_output, bool training, DType sixteen_bit);

}  // namespace stagecraft::plan
