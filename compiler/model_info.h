#pragma once
/// \file
/// What a user wants to know about a model before planning (`stagec --info`).

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/import.h"
#include "runtime/format/bytes.h"  // format_bytes, which the planner's messages use too

namespace stagecraft {

struct ModelInfo {
  struct Tensor {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
  };
  std::string path;
  std::string producer;
  int64_t opset = 0;          ///< The file's default-domain opset.
  int64_t read_as_opset = 0;  ///< The opset it imports as (17 for 18 to 22; else `opset`).
  int64_t ir_version = 0;
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  std::vector<BoundDim> bound_dims;
  int64_t nodes_in_file = 0;
  int64_t nodes = 0;                        ///< After folding.
  std::map<std::string, int64_t> folded;    ///< Nodes removed by each import pass.
  /// Softmaxes that looked like attention and were not fused, each with the reason.
  std::vector<std::string> attention_not_fused;
  std::map<std::string, int64_t> op_counts;
  int64_t parameters = 0;  ///< Elements of the file's float weights, less BatchNorm running stats.
  int64_t parameter_bytes = 0;
  int64_t constants = 0;   ///< Every other initializer: folded shapes, masks, running stats.
  int64_t constant_bytes = 0;
  int64_t external_bytes = 0;               ///< Initializer bytes held in external data files.
  double forward_flops = 0;
};

/// Gathers the facts of an imported model.
ModelInfo describe_model(const ImportedModel& model);

/// A human-readable report, several lines.
std::string render_text(const ModelInfo& info);

/// The same facts as JSON (docs/schemas/stagec-info.schema.json).
nlohmann::ordered_json to_json(const ModelInfo& info);

/// "1.23 GFLOP".
std::string format_flops(double flops);

/// Whether node `node_name` lies in the PyTorch module `module` as torch's exporter names nodes
/// by scope: "/enc/layers.2/self_attn/MatMul" is in "enc", "enc.layers.2" and
/// "enc.layers.2.self_attn" (not in "enc.layers.20" nor in "enc.layers.2.self").
bool in_module(std::string_view node_name, std::string_view module);

/// The module of `node_name` down to `depth` scope levels ("enc.layers.2" at depth 2 for the
/// node above); "" for a node without a scope.
std::string module_of(std::string_view node_name, int depth);

}  // namespace stagecraft
