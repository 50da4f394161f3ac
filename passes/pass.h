#pragma once
/// \file
/// The pass interface. A pass has a command-line name and one entry point that reports whether
/// it changed the graph. All passes are listed in passes.def; the pipelines that run them are
/// in pipeline.cpp, one line per step.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/graph.h"

namespace stagecraft::passes {

/// Settings and counters shared by the passes of one pipeline run.
struct PassContext {
  /// Folding evaluates a node only when every input and output has at most this many elements:
  /// shape arithmetic is folded, real compute on weights is left alone.
  int64_t fold_max_elements = 1 << 16;
  /// Folding refuses a model whose folded constants would hold more than this many bytes in
  /// all (each at most `fold_max_elements`, but a model can hold many): shape arithmetic is
  /// small, and a few hundred bytes of model must not take gigabytes to import.
  int64_t fold_max_total_bytes = int64_t{256} << 20;
  /// The bytes of the constants folded so far.
  int64_t folded_bytes = 0;
  /// How many nodes each pass removed or rewrote, by pass name (for `stagec --info`).
  std::map<std::string, int64_t> counters;
  /// Node id -> stage, when the graph is already split into stages (null when not): a pass that
  /// adds nodes gives each one a stage here (mixed-precision: a Cast in its readers' stage).
  std::vector<int>* stage_of = nullptr;
  /// mixed-precision: the 16-bit float the stage graphs compute in, bfloat16 (stagec
  /// --precision mixed) or float16 (--precision fp16).
  DType sixteen_bit = DType::kBFloat16;
  /// drop-identity: an Identity that copies a float initializer under another name (how torch's
  /// exporter writes a parameter it merged into an equal one: `layers.1.norm.weight =
  /// Identity(layers.0.norm.weight)`) gives that name its own initializer with the same values
  /// instead of sharing, so that training trains each as PyTorch does (stagec --train, unless
  /// --keep-merged). Each one untied is listed in `untied` as "name (= kept)".
  bool untie_merged_weights = false;
  std::vector<std::string> untied;
  /// The graph is imported to be trained: a fusion whose fused op would give no gradient to a
  /// value a trainable weight's gradient flows through (an attention mask made from a learned
  /// position-bias table) is refused.
  bool training = false;
  /// fuse-attention: each Softmax that looked like attention and was not fused, with the reason
  /// ("node 'x' (Softmax): the probabilities are read by more than one node").
  std::vector<std::string> not_fused;
};

class Pass {
 public:
  virtual ~Pass() = default;
  /// The pass's command-line name, e.g. "fold-constants".
  virtual std::string_view name() const = 0;
  /// Runs once over the graph; returns true when it changed anything.
  virtual bool run(ir::Graph& graph, PassContext& context) const = 0;
};

/// A new instance of the pass called `name`, or nullptr.
std::unique_ptr<Pass> make_pass(std::string_view name);

/// The names of all passes, in passes.def order.
std::vector<std::string_view> pass_names();

}  // namespace stagecraft::passes
