#pragma once
/// \file
/// What one node of a program did when it ran, for the per-node profile (`stagerun
/// --profile-nodes`): the bytes of the tensors it read and wrote, and the floating-point
/// operations of the products, counted from the shapes of its tensors as they were run.
///
/// FLOPs (a multiply-add counts 2) are counted for the ops whose time is their products:
/// MatMul, Gemm, Conv, ConvTranspose and our Attention, and their gradient ops (one product of
/// the forward's size per gradient of a product operand they write: MatMulGrad writing dA and
/// dB counts twice the forward; Attention's backward counts 2.5x its forward, FlashAttention's
/// recomputation included). Every other op counts 0: at any size that matters it is bound by
/// memory, so its bytes per second is the figure to read. Bytes are every input with bytes (a
/// bare operand, read for its shape alone, moves nothing) and every output, at their dtypes.

#include <cstdint>
#include <span>
#include <string_view>

#include "runtime/core/kernel.h"
#include "runtime/core/tensor.h"

namespace stagecraft::rt {

struct NodeWork {
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  double flops = 0;  ///< 0 where the op's FLOPs are not counted (see the file comment).
};

/// The work of a node of op type `op_type` (a gradient op by its "Grad" suffix and the
/// forward_inputs attribute of runtime/format/grad_ops.h) run on `in` and `out` (null where
/// omitted).
NodeWork node_work(std::string_view op_type, const Attrs& attrs, std::span<const Tensor* const> in,
                   std::span<Tensor* const> out);

}  // namespace stagecraft::rt
