#pragma once
/// \file
/// Conversion between ONNX protobufs and the IR, in both directions. Import moves weight bytes
/// out of the protobuf (never copies them); export writes any subset of nodes as a valid ONNX
/// model (the stage files of a plan are made this way).

#include <onnx/onnx_pb.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"

namespace stagecraft::ir {

/// Where the weight bytes of an external-data initializer live. `resolve_external_data`
/// checks the location against the model folder before anything is read.
struct ExternalRef {
  std::string path;      ///< Resolved path inside the model folder.
  std::string location;  ///< As written in the model.
  int64_t offset = 0;
  int64_t length = 0;
};

/// The weight files one model's external data names, each resolved once (the folder checks
/// and the file's size): a model of thousands of initializers in one file asks the file system
/// once, not once per initializer. Only successful resolutions are kept.
struct ExternalFiles {
  struct File {
    std::string path;
    int64_t size = 0;
  };
  std::map<std::string, File> by_location;
};

/// Resolves the `external_data` entries of `tensor` against `model_dir`. Refuses absolute
/// paths, `..` components, symlinks, paths that leave the folder, missing files and windows
/// past the end of the file, each with an `Error(kFormat)` naming the tensor, the location and
/// the numbers. `expected_bytes` is the size the tensor's dtype and dims call for. `files`
/// (optional) remembers the files resolved for the same model.
ExternalRef resolve_external_data(const onnx::TensorProto& tensor, const std::string& model_dir,
                                  int64_t expected_bytes, ExternalFiles* files = nullptr);

/// The bytes of an ONNX tensor in its dtype's little-endian layout. Moves `raw_data` out of the
/// proto when present; converts the typed fields (float_data, int64_data, ...) otherwise.
/// External tensors are resolved with `model_dir` (and `files`) and mapped lazily.
std::shared_ptr<const WeightData> take_tensor_data(onnx::TensorProto& tensor,
                                                   const std::string& model_dir,
                                                   ExternalFiles* files = nullptr);

/// The name a node goes by: its own, or for an unnamed node "Op(first output)" (index `i` when
/// it has no output). Import names unnamed nodes this way, and messages about the model file
/// use the same name before import.
std::string node_name_or_default(const onnx::NodeProto& node, int index);

/// Builds the IR from a model whose graph inputs have static shapes and on which ONNX shape
/// inference has run. Weight bytes are moved out of `model`. Values whose shape inference
/// could not determine stay `shape_known = false`; a later pass decides whether that is fatal.
Graph graph_from_model(onnx::ModelProto& model, const std::string& model_path);

/// How an export writes initializers.
enum class WeightMode {
  kEmbed,         ///< Bytes inside the protobuf (raw_data).
  kNoData,        ///< Initializers with name, dtype and dims but no bytes: the caller places
                  ///< them (the plan writer: external data, plan/stage_weights.h).
  kAsInputs,      ///< Only small non-weight constants are written; weights and large constants
                  ///< become typed graph inputs without data (for shape inference).
};

struct ExportOptions {
  /// The nodes to write (a stage), in the order written: a topological order of the subset,
  /// which the caller chooses (the planner's arena is computed on it). All live nodes, in the
  /// graph's topological order, when unset.
  std::optional<std::vector<NodeId>> nodes;
  WeightMode weights = WeightMode::kEmbed;
  /// With kAsInputs, initializers of at most this many elements are still written with data
  /// (shape tensors that Reshape, Expand and Slice need for inference).
  int64_t small_constant_elements = 1 << 16;
  /// Write value_info for every intermediate value with a known shape.
  bool value_info = true;
};

/// Runs ONNX shape inference on `model` in strict mode (type checks, node errors raised, data
/// propagation on). A failure becomes one `Error(kShape)` line naming the first failing node;
/// the errors that only follow from it are counted, not listed. Attributes libonnx would divide
/// by or loop over unchecked are refused first (onnx_attributes.h, `Error(kModel)`).
void infer_onnx_shapes(onnx::ModelProto& model);

/// A valid ONNX model for `graph` (or the subset in `options.nodes`): inputs are the values the
/// subset reads but does not produce, outputs the values it produces that the rest of the graph
/// or the graph's outputs read.
onnx::ModelProto model_from_graph(const Graph& graph, const ExportOptions& options = {});

}  // namespace stagecraft::ir
