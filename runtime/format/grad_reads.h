#pragma once
/// \file
/// Which forward values a gradient op reads the bytes of: part of the gradient-op contract
/// (runtime/format/grad_ops.h), shared by the planner (which counts only these as a training
/// forward's activations) and the runtime (which keeps only these from a microbatch's forward
/// until its backward).
///
/// A gradient node `TGrad` takes every forward input x0..x{n-1} and output y0..y{m-1} of its
/// forward node, so that each kernel knows every shape. For most ops the kernel reads the bytes
/// of a few of them only: AddGrad reads none (it passes dY on, summed over broadcast axes),
/// MatMulGrad reads A and B but not Y, LayerNormalizationGrad reads X and the scale but not Y,
/// SoftmaxGrad reads Y but not X. The runtime hands every other operand to the kernel with its
/// dtype and shape and no bytes (`data == nullptr`), so the forward does not have to keep it
/// alive; a kernel that touched those bytes would fail loudly rather than read stale memory.
///
/// Positions count the forward inputs first, then the forward outputs: position p < n is x_p,
/// position n + j is y_j. An op not in the table reads every operand (the safe default).
/// Every backend's gradient kernels honour the table: the finite-difference checks
/// (tests/grad/gradcheck.cpp) run every gradient with its unread operands bare.

#include <cstddef>
#include <string_view>

namespace stagecraft::grad {

/// Whether the gradient of a forward node of `forward_op` (an op type without the "Grad"
/// suffix) with `n` forward inputs reads the bytes of operand `position`.
bool reads_bytes(std::string_view forward_op, std::size_t n, std::size_t position);

/// Whether `forward_op` has an entry in the table (its gradient reads fewer than all operands).
bool has_read_rule(std::string_view forward_op);

}  // namespace stagecraft::grad
