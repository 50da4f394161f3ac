#pragma once
/// \file
/// Small tensors evaluated on the host at compile time: the shape arithmetic that exporters
/// emit (Shape -> Gather -> Unsqueeze -> Concat -> Reshape and friends). The host works out each
/// node's output type (the int64 shape arithmetic); the values come from the CPU backend's own
/// kernels, as the runtime would compute them (Shape and Trilu, which have no kernel that
/// serves, are evaluated here). Integers are held as int64 and reals as double, so INT64_MAX in
/// a Slice end survives exactly.

#include <cstdint>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compiler/ir/graph.h"

namespace stagecraft::passes {

struct HostTensor {
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
  std::vector<int64_t> ints;  ///< Used for integer and bool dtypes.
  std::vector<double> reals;  ///< Used for floating dtypes.

  bool is_real() const { return dtype == DType::kFloat32 || dtype == DType::kFloat64; }
  int64_t numel() const;
  /// Element i as int64 / double whatever the storage.
  int64_t int_at(int64_t i) const;
  double real_at(int64_t i) const;

  /// Decodes an initializer; nullopt when its dtype is not one folding handles.
  static std::optional<HostTensor> from_value(const ir::Value& value);
  /// The bytes in `dtype`'s layout.
  std::string to_bytes() const;
};

/// True when `dtype` is one the evaluator handles (float32/64, int32/64, bool).
bool host_dtype(DType dtype);

/// Evaluates `node`, an op ops.def marks kHostFolds, on constant inputs (kNoId inputs are passed
/// as nullopt). Shape nodes get the input's shape through `shape_input`. Returns nullopt when the
/// op is not one the host evaluator knows, an input it needs is not constant, the output would
/// hold more than `max_output_elements` (known before anything is allocated), or the CPU
/// backend's check refuses the dtypes or attributes; throws `Error` naming the node for inputs
/// that make no sense (an index out of range, shapes that do not broadcast, integer arithmetic
/// that overflows its dtype or divides by zero, a negative output dim).
std::optional<std::vector<HostTensor>> evaluate_on_host(
    const ir::Node& node, const std::vector<std::optional<HostTensor>>& inputs,
    const std::vector<int64_t>& shape_input, int64_t opset,
    int64_t max_output_elements = int64_t{1} << 16);

/// Split of the constant `in[0]` (evaluate_on_host's, for torch's repeat_interleave and
/// tensor_split arithmetic): the sizes from input 1 (opset 13 on) or the `split` attribute,
/// else equal parts, one per output; nullopt for sizes that do not add up to the dim, an input
/// it needs that is not constant, or an input of more than `max_output_elements`.
std::optional<std::vector<HostTensor>> split_on_host(
    const ir::Node& node, const std::vector<std::optional<HostTensor>>& in, int64_t opset,
    int64_t max_output_elements);

/// `evaluate_on_host` for a Slice (opset 10 on: bounds as inputs, `rest` holding inputs 1 on as
/// for `evaluate_on_host`) of a bool tensor given as its bytes (`data`, shape `shape`), in one
/// pass from those bytes to the 0/1 bytes of the result: the causal mask buffer attention fusion
/// slices is 4 M bools at 2,048 tokens, one per layer. The bounds are read by the kernels' own
/// rule (ops::slice_view). Nullopt for any other op, an operand the node names but `rest` lacks
/// (not constant), bounds that make no sense, or bytes that are not `shape`'s count.
std::optional<std::vector<uint8_t>> bool_slice_on_host(
    const ir::Node& node, const std::vector<int64_t>& shape, std::span<const std::byte> data,
    const std::vector<std::optional<HostTensor>>& rest, int64_t opset);

}  // namespace stagecraft::passes
