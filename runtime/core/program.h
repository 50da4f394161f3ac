#pragma once
/// \file
/// A stage program: one stage file (a valid ONNX model with static shapes) bound to a backend's
/// kernels, with its weights loaded and its intermediate tensors placed in one arena by the
/// static memory plan. Loading checks everything a run relies on, so running never meets a
/// missing kernel, an unknown shape or a dangling tensor.

#include <onnx/onnx_pb.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/core/external_weights.h"
#include "runtime/core/kernel.h"
#include "runtime/core/node_work.h"
#include "runtime/core/tensor.h"
#include "runtime/format/lifetimes.h"
#include "runtime/format/memory_plan.h"
#include "runtime/format/plan.h"

namespace stagecraft::rt {

struct ValueInfo {
  std::string name;
  DType dtype = DType::kUndefined;
  Shape shape;
  int64_t numel_bytes() const { return shape_numel(shape) * dtype_size(dtype); }
};

/// Called around every node a program runs (tracing, fault injection, a gradient's sum
/// started as soon as it is final); may throw.
struct NodeHook {
  std::function<void(std::string_view node_name, std::string_view op_type)> before;
  /// Called right after the node that writes output `index` of the program (an output the run
  /// allocates: one the node computes, not an input or weight passed through), with its final
  /// value, before later nodes run. The device may still be writing it (synchronize first).
  std::function<void(size_t index, const Tensor& value)> output_ready;
  /// The per-node profile (stagerun --profile-nodes): when set, each node's kernels run timed
  /// (DeviceContext::time_ms: on CUDA, events around them, which waits for them to finish) and
  /// this is called after each node with its milliseconds, its work (node_work.h) and what its
  /// kernels said of their choice (DeviceContext::notes; "" where nothing was chosen). A view
  /// that shares its source's bytes runs nothing and is not reported.
  std::function<void(std::string_view node_name, std::string_view op_type, double ms,
                     const NodeWork& work, std::string_view note)>
      timed;
};

/// What a run of a program is within training, beyond its inputs.
struct TrainingRun {
  /// Whether the run also writes the state updates (Program::state_updates) into their weights: a
  /// training step's forward of a microbatch does; a recomputation of that forward
  /// (rebuilding its values for the backward), a backward or an inference run does not.
  bool update_state = false;
  /// The random key of the step and microbatch (Program::random_key): a training step's, or an
  /// inference run's (its random ops draw anew each step); 0 for a held-out evaluation and
  /// a bare run, whose draws are the same each time.
  uint64_t random_key = 0;
  /// The model in eval mode, as torch's model.eval(): every Dropout is the identity whatever
  /// its training_mode input says, and a BatchNormalization in training mode normalises with
  /// its running statistics (inputs 3 and 4) instead of the batch's, writing none (a held-out
  /// evaluation of a training plan, RunOptions::forward_only). Running statistics are not
  /// updated either (`update_state` false).
  bool eval_mode = false;
};

class Program {
 public:
  /// The compiler's arena for a stage (plan.json's stages[k].arena): offsets by tensor name.
  struct RecordedArena {
    const plan::Stage* stage;
    std::string field;  ///< "plan.json: stages[2].arena", for messages.
  };

  /// Reads and binds a stage file. Errors name the file and, where one is at fault, the node.
  /// With `arena`, intermediates go where the plan put them, after checking that the plan
  /// places every one, with its size, and overlaps no two alive together; without, the
  /// program plans its own arena the same way. Initializers kept as external data are read
  /// from where `external` says (a plan's stage file); without it they are refused.
  static Program load_file(const std::string& path, const Backend& backend,
                           const std::optional<RecordedArena>& arena = std::nullopt,
                           const ExternalWeights* external = nullptr);

  /// Binds a model already in memory; `source` names it in errors.
  static Program from_model(const onnx::ModelProto& model, const Backend& backend,
                            const std::string& source,
                            const std::optional<RecordedArena>& arena = std::nullopt,
                            const ExternalWeights* external = nullptr);

  const std::vector<ValueInfo>& inputs() const { return inputs_; }
  const std::vector<ValueInfo>& outputs() const { return outputs_; }
  const std::string& source() const { return source_; }
  size_t node_count() const { return nodes_.size(); }

  /// Bytes of the arena the intermediates need (`memory_plan().arena_bytes`).
  int64_t arena_bytes() const { return memory_.arena_bytes; }
  /// Bytes of the loaded weights and constants.
  int64_t weight_bytes() const { return weight_bytes_; }
  /// Of those, the bytes read from external data files, and the seconds the load took.
  int64_t external_bytes() const { return external_bytes_; }
  double load_seconds() const { return load_seconds_; }
  /// Bytes of one run's outputs.
  int64_t output_bytes() const;

  /// A weight the forward of a training step changes besides computing its outputs: a
  /// BatchNormalization in training mode (training_mode=1) whose running mean or variance
  /// (input 3 or 4) is a weight of the file writes the updated statistic (its output 1 or 2:
  /// input x momentum + the batch's statistic x (1 - momentum), ONNX's rule) back into it, as
  /// PyTorch's BatchNorm updates its buffers in train mode, once per forward of a microbatch.
  struct StateUpdate {
    std::string node;       ///< The BatchNormalization's name.
    std::string statistic;  ///< The output holding the updated value.
    std::string weight;     ///< The weight it replaces.
  };
  /// Every state update of the program, in node order (empty for most programs).
  std::vector<StateUpdate> state_updates() const;

  /// The outputs of the Cast nodes that read a weight or constant of the file which no state
  /// update writes: the same bytes on every run until the weights change (an optimizer step).
  /// Mixed precision's 16-bit weight copies: a training step keeps one for all its microbatches
  /// (runtime/exec/device_worker.cpp) rather than one per microbatch.
  std::vector<std::string> weight_casts() const;

  /// Each node the backend runs widened (Backend::runs_widened: 16-bit inputs cast to float32
  /// copies, the float32 kernel, its results rounded back), in the program's order, as its op
  /// and types ("ReluGrad(bfloat16, -, bfloat16 -> bfloat16)"; "-" an absent operand): the
  /// kernels a 16-bit plan still lacks on this backend.
  std::vector<std::string> widened_ops() const;

  /// The random key of step `step` (counted from 1 over the whole training) and microbatch
  /// `microbatch` (of the step's microbatches over every replica): what a node's random draws
  /// (KernelArgs::random_key, mixed with the node's name) derive from, whichever device or
  /// stage runs it.
  static uint64_t random_key(int64_t step, int64_t microbatch);

  /// Runs the program once. `inputs` follow `inputs()` and are checked for dtype and shape;
  /// `arena` holds at least `arena_bytes()`. Returns the outputs (owned tensors) in the order
  /// of `outputs()`. A kernel's error is returned with the file and node named.
  std::vector<Tensor> run(DeviceContext& device, std::span<const Tensor> inputs, std::byte* arena,
                          const NodeHook* hook = nullptr, const TrainingRun& run = {}) const;

  /// Training's forward: as `run`, but the values named in `keep` (inputs, weights,
  /// intermediates, outputs: what the backward reads the bytes of) are kept, by name, in `kept`
  /// for the backward; those intermediates get their own bytes, the others live in `arena` (at
  /// least `arena_bytes()`) and are gone after the run. Returns the outputs like `run`.
  std::vector<Tensor> run_keeping(DeviceContext& device, std::span<const Tensor> inputs,
                                  std::map<std::string, Tensor>& kept,
                                  const std::set<std::string>& keep, std::byte* arena,
                                  const NodeHook* hook = nullptr,
                                  const TrainingRun& run = {}) const;

  /// Per input (in `inputs()` order), whether some node reads its bytes: false for a forward
  /// value that only gradient nodes read, each for its shape alone (runtime/format/
  /// grad_reads.h). A run may give such an input as a bare tensor: its dtype and shape, no
  /// bytes.
  std::vector<bool> inputs_read() const;

  /// The weights by name (shared bytes: an optimizer updates them in place).
  std::map<std::string, Tensor> weights() const;

  /// Runs with these tensors (same names, dtypes and shapes) as its weights from now on: a
  /// device whose memory is not the host's runs with its own copies (runtime/exec).
  void rebind_weights(const std::map<std::string, Tensor>& weights);

  /// Runs only the nodes where `mask` is true (a backward's B part, later its W part), with
  /// intermediates in `arena` (at least `arena_bytes()`), except the values a node outside the
  /// mask reads: those get their own bytes and are kept, by name, in `kept`. Values the other
  /// nodes produce are taken from `kept`. Outputs no node of the mask produced and `kept`
  /// lacks come back empty (dtype kUndefined). The arena's contents need not survive between
  /// the parts: each part only reads its own arena values.
  std::vector<Tensor> run_subset(DeviceContext& device, std::span<const Tensor> inputs,
                                 std::map<std::string, Tensor>& kept, const std::vector<bool>& mask,
                                 std::byte* arena, const NodeHook* hook = nullptr) const;

  /// Per node, whether it belongs to a backward program's weight-gradient part (W): the rule of
  /// runtime/format/lifetimes.h `weight_gradient_nodes`, which the compiler sizes B-to-W memory
  /// by. All false when some other node reads a W result (then W cannot be deferred).
  std::vector<bool> weight_gradient_nodes() const;

 private:
  struct Slot {
    ValueInfo info;
    enum Kind { kInput, kWeight, kIntermediate, kOutput } kind = kIntermediate;
    Tensor weight;          // kWeight
    int memory_index = -1;  // kIntermediate: index into memory_.offsets
    int alias = -1;  // kIntermediate, a view's output: the slot whose bytes it shares (lifetimes.h)
  };
  struct Step {
    std::string name, op_type;
    Attrs attrs;
    KernelFn kernel = nullptr;
    std::vector<int> inputs;   // slot index, -1 for an omitted optional input
    std::vector<int> outputs;  // slot index
    bool weight_gradients = false;
    bool zero_outputs = false;  // a gradient kernel that needs zero-filled outputs
    // The 16-bit fallback (Backend::runs_widened): the float32 kernel, run between Casts of
    // the bfloat16 inputs to float32 and of its float32 results into the bfloat16 outputs.
    KernelFn cast = nullptr;
    // State updates (TrainingRun::update_state): after the run, slot `first`'s value (as the node
    // left it) is copied into weight slot `second`.
    std::vector<std::pair<int, int>> state_updates;
    uint64_t name_hash = 0;  // mixed into the run's random key (KernelArgs::random_key)
    int view_source = -1;    // a view (lifetimes.h is_view_node): the slot output 0 may share
    // Eval mode (TrainingRun::eval_mode) of a BatchNormalization in training mode: the node
    // with training_mode 0 (owned here; `eval_attrs` points into it). Null for other nodes.
    std::shared_ptr<const onnx::NodeProto> eval_node;
    Attrs eval_attrs;
  };

  std::string source_;
  std::shared_ptr<onnx::ModelProto> model_;  // owns the NodeProtos the Attrs point into
  std::vector<Slot> slots_;
  std::vector<Step> nodes_;
  std::vector<int> input_slots_, output_slots_;
  std::vector<ValueInfo> inputs_, outputs_;
  plan::ProgramGraph graph_;  // nodes over slot indices (lifetimes.h)
  plan::MemoryPlan memory_;
  int64_t weight_bytes_ = 0;
  int64_t external_bytes_ = 0;
  double load_seconds_ = 0;

  void place_intermediates(const std::optional<RecordedArena>& arena);
  std::vector<Tensor> execute(DeviceContext& device, std::span<const Tensor> inputs,
                              std::byte* arena, std::map<std::string, Tensor>* kept,
                              const NodeHook* hook, const std::vector<bool>* mask = nullptr,
                              const TrainingRun& run = {},
                              const std::set<std::string>* keep = nullptr) const;
  /// For `execute`: the views the run hands on (`handed_on(slot)`) that share bytes of their
  /// own source chain's first intermediate rather than copying (`shares`), and those
  /// intermediates, which then get bytes of their own rather than arena bytes (`own_bytes`);
  /// per slot. `mask`: the nodes the run runs (null: all).
  struct ViewSharing {
    std::vector<char> shares, own_bytes;
  };
  ViewSharing view_sharing(const std::vector<bool>* mask,
                           const std::function<bool(size_t)>& handed_on) const;
};

/// Runs `program` once on `device` with host inputs and host outputs, wherever the device's
/// memory is: on a device of its own memory (CUDA) the weights and inputs are copied to it and
/// the outputs back (a test harness's or tool's one-off run; the executor keeps tensors on the
/// device instead). `arena` holds at least `program.arena_bytes()` of the device's memory.
std::vector<Tensor> run_from_host(const Program& program, DeviceContext& device,
                                  std::span<const Tensor> inputs, std::byte* arena);

}  // namespace stagecraft::rt
