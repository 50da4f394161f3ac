#pragma once
/// \file
/// The gradient-op contract shared by the compiler's autodiff pass (which writes gradient ops
/// into each stage's backward program) and the runtime's backends (which run them). Backward
/// programs are ONNX graphs, so stage files stay readable ONNX; their gradient ops live in our
/// own domain.
///
/// For a forward node F of ONNX op type T with inputs x0..x{n-1}, outputs y0..y{m-1} and
/// attributes A, autodiff writes one node (or two, see below) of op type `T + "Grad"` in domain
/// `kGradDomain`:
///
///   inputs   x0..x{n-1}, y0..y{m-1}, dy0..dy{m-1}     (n + 2m inputs)
///   outputs  dx0..dx{n-1}                              (n outputs)
///   attrs    A, plus kForwardInputsAttr = n
///
/// - An input name is "" where F omitted an optional input, and dy_j is "" where output j gets
///   no gradient (nothing downstream needs it; the kernel treats it as zeros). x and y are the
///   forward values of the same microbatch, kept by the runtime until the backward runs.
/// - dx_k has x_k's shape and dtype: broadcasting is undone inside the kernel. An output name is
///   "" where no gradient is wanted (integer inputs, constants, inputs the stage does not need);
///   a kernel computes only the outputs that are named.
/// - Zero-bubble schedules split backward into B (gradients of activations) and W (gradients of
///   weights). For a node with both, autodiff writes two nodes of the same op type: one naming
///   only activation gradients, one naming only weight gradients (marked kWeightGradAttr = 1).
/// - Where a value feeds several nodes, its gradient is the sum of theirs: plain ONNX `Add`.
/// - The loss: the stage that computes it receives dloss = 1 / microbatches (a float32 scalar
///   named `kLossGradName`), so gradients accumulated over a step's microbatches equal those of
///   the whole batch for a loss that is a mean over samples. A loss that is a mean over the
///   microbatch's counted positions (cross-entropy with an ignore index) makes the step's
///   gradient the mean of the microbatch means, as PyTorch's accumulation of `loss / M` does.
///
/// The gradient of the value named V is named `grad_name(V)` = "V@grad".
///
/// One attribute only a gradient op has: GatherGrad's kPaddingRowsAttr (ints), entries of the
/// gathered axis whose gradient is zero whatever dy says, as PyTorch's nn.Embedding gives its
/// padding_idx row none (an export keeps no trace of padding_idx: the planner finds the row).

#include <string>
#include <string_view>

namespace stagecraft::grad {

inline constexpr std::string_view kGradDomain = "ai.stagecraft";
inline constexpr int kGradDomainVersion = 1;
inline constexpr std::string_view kGradSuffix = "Grad";
inline constexpr std::string_view kForwardInputsAttr = "forward_inputs";
inline constexpr std::string_view kWeightGradAttr = "weight_gradients";
inline constexpr std::string_view kLossGradName = "loss@grad";
inline constexpr std::string_view kPaddingRowsAttr = "padding_rows";

inline constexpr std::string_view kGradNameSuffix = "@grad";

inline std::string grad_name(std::string_view value) {
  return std::string(value) + std::string(kGradNameSuffix);
}

/// Whether `name` names a gradient (`grad_name` of some value).
inline bool is_grad_name(std::string_view name) { return name.ends_with(kGradNameSuffix); }

/// The value whose gradient `name` is: "w" for "w@grad" (`name` must be a gradient's name).
inline std::string value_of_grad(std::string_view name) {
  return std::string(name.substr(0, name.size() - kGradNameSuffix.size()));
}

}  // namespace stagecraft::grad
