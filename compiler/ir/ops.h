#pragma once
/// \file
/// The op table (compiler/ir/ops.def): every operator stagecraft supports, one line each with its
/// family, differentiable inputs, FLOP rule and flags, and the import check against that list.
/// Autodiff, the cost models and constant folding read an op's facts here and nowhere else.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/graph.h"

namespace stagecraft {

/// Groups of ops that share cost formulas and kernels.
enum class OpFamily { kMatMul, kConv, kNorm, kPool, kElementwise, kReduce, kData, kShape };

/// Which forward FLOP formula of cost_models/op_cost.cpp an op uses.
enum class FlopKind {
  kNone,       ///< No arithmetic (layout, indexing, shape ops).
  kMatMul,     ///< 2 * output elements * shared dim, plus one add per output for a Gemm bias.
  kConv,       ///< 2 * output elements * (C_in / group) * window, plus a bias add per output.
  kConvTranspose,  ///< 2 * input elements * (C_out / group) * window, plus a bias add per output.
  kRecurrent,  ///< LSTM / GRU / RNN: 2 * T * D * B * G * H * (I + H) plus the gates' work.
  kAttention,  ///< Attention: 2 * Tq * Tk * (d + dv) per batch and head (about half causal).
  kPool,       ///< Output elements * kernel window.
  kPerOutput,  ///< `per_element` per element of output 0.
  kPerInput,   ///< `per_element` per element of input 0.
};

/// An op's FLOP rule: the formula and, for the per-element ones, the count per element.
struct FlopRule {
  FlopKind kind = FlopKind::kNone;
  double per_element = 0;
};

/// Bit k set: input k is differentiable. Bits past the last are those of input 63.
using InputMask = uint64_t;

/// Flag bits of an op-table line.
enum OpFlag : unsigned {
  kNoFlags = 0,
  kView = 1u << 0,      ///< Reinterprets its input's buffer with a new shape: no data moves.
  kHostFolds = 1u << 1  ///< fold_constants evaluates it when every input is a constant.
};

/// One line of the op table.
struct OpInfo {
  std::string_view op_type;
  OpFamily family = OpFamily::kData;
  InputMask differentiable = 0;  ///< Inputs that carry a gradient; 0: the op has no gradient.
  FlopRule flops;
  unsigned flags = kNoFlags;
  bool supported = true;  ///< False for fold-only ops (imported only when folded away).

  bool view() const { return (flags & kView) != 0; }
  bool host_folds() const { return (flags & kHostFolds) != 0; }
  bool has_gradient() const { return supported && differentiable != 0; }
  /// Whether input `index` is differentiable, by position (dtypes aside).
  bool differentiable_input(std::size_t index) const {
    return supported && ((differentiable >> std::min<std::size_t>(index, 63)) & 1u) != 0;
  }
};

/// The op-table line of `op_type` (default domain), or null when the table has none.
const OpInfo* op_info(std::string_view op_type);

/// The family of a supported default-domain op, or nullopt when the op is not supported.
std::optional<OpFamily> op_family(std::string_view op_type);

/// Every supported op type, in ops.def order.
const std::vector<std::string_view>& supported_ops();

/// Every line of the op table, fold-only ops included, in ops.def order (docs/ops.md's table of
/// supported ops is generated from it: tools/ops_table.cpp).
std::span<const OpInfo> op_table();

/// Throws `Error(kUnsupported)` when an op is outside the list or its domain is not the default
/// ONNX domain, naming the op, the node (`node_label`), the domain and the domain's opset. An op
/// whose output's shape follows its inputs' values (NonZero, NonMaxSuppression, ...) is refused
/// naming those inputs, `inputs` (the node's input names, "" for an omitted one).
void check_supported_op(std::string_view op_type, std::string_view domain,
                        std::string_view node_label, int64_t opset,
                        std::span<const std::string> inputs = {});

}  // namespace stagecraft
