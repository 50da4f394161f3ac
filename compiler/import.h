#pragma once
/// \file
/// ONNX import: file -> checked, shape-bound, folded IR.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"

namespace stagecraft {

/// The newest default-domain opset stagecraft imports (ONNX 1.12's).
inline constexpr int64_t kMaxOpset = 17;

/// How the user binds the symbolic dims of the model's inputs.
struct ImportOptions {
  /// Binds the first dim of every input whose first dim is symbolic or unknown (`--batch`).
  std::optional<int64_t> batch;
  /// Binds dims by their symbolic name ("seq" -> 512), or an anonymous one by
  /// "INPUT:INDEX" ("x:1" -> 3) (`--dim NAME=VALUE`).
  std::map<std::string, int64_t> dims;
  /// Training: weights the exporter merged into equal ones (an Identity copying an initializer
  /// under the duplicate's name) get their own copies (PassContext::untie_merged_weights).
  bool untie_merged_weights = false;
  /// Training: a fusion that would drop a weight's gradient is refused (PassContext::training).
  bool training = false;
  /// Each attention block becomes one fused Attention node (passes/fuse_attention.cpp; stagec
  /// --fuse-attention). Off here, for what imports a model as it is (the conformance runs, the
  /// profiler); the planner's PlanOptions turn it on by default.
  bool fuse_attention = false;
  /// Each GELU (erf or tanh form) becomes one fused Gelu node (passes/fuse_gelu.cpp; stagec
  /// --fuse-gelu), off here for the same reason as fuse_attention.
  bool fuse_gelu = false;
};

/// One dim of one input that had no fixed size in the model and was bound by the user.
struct BoundDim {
  std::string input;
  int index = 0;
  std::string name;  ///< The dim's symbolic name; "" for an anonymous dim.
  int64_t value = 0;
  std::string flag;  ///< "--batch" or "--dim".
};

/// The result of import.
struct ImportedModel {
  ir::Graph graph;
  std::vector<BoundDim> bound_dims;
  int64_t nodes_in_file = 0;               ///< Node count before folding.
  /// The file's default-domain opset and IR version (the graph's are 17 and 8 for a file of
  /// opset 18 to 22, read as opset 17: compiler/import_opset.h).
  int64_t file_opset = 0, file_ir_version = 0;
  std::map<std::string, int64_t> folded;   ///< Nodes removed or rewritten, by pass name.
  std::vector<std::string> untied;  ///< With untie_merged_weights: "name (= kept)" per weight.
  /// Softmaxes that looked like attention and were not fused, each with the reason.
  std::vector<std::string> attention_not_fused;
};

/// Reads, checks and imports the model at `path`. Runs the ONNX checker and strict ONNX shape
/// inference after binding dims, folds shape subgraphs, turns Constant nodes into initializers
/// and drops Identity. Every failure is an `Error` whose message starts with `path`.
ImportedModel import_model(const std::string& path, const ImportOptions& options);

/// Parses a `--dim` argument "NAME=VALUE" into the options; throws `Error(kUsage)` when it is
/// malformed or the value is not a positive integer.
void parse_dim_binding(const std::string& text, ImportOptions& options);

}  // namespace stagecraft
