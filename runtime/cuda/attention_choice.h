#pragma once
/// \file
/// Which fused Attention nodes the tiled CUDA kernels take (attention_tiles.cuh launches them
/// only for these), as host code can ask without the CUDA headers: attention.cpp notes a long
/// node that the plain kernels run instead, and the tests check the rule on any machine.

#include <string>

#include "runtime/ops/attention_element.h"

namespace stagecraft::rt::cuda {

/// Whether the tiled kernels take a node of `dims`: heads of 32, 64 or 128 with the values of
/// the same size (its operands' 16-byte alignment is checked at each launch).
inline bool tiles_take(const ops::AttentionDims& dims) {
  return dims.d == dims.dv && (dims.d == 32 || dims.d == 64 || dims.d == 128);
}

/// Why the tiles do not take a node of `dims` (a phrase naming the sizes), "" when they do.
inline std::string untiled_reason(const ops::AttentionDims& dims) {
  if (tiles_take(dims)) return "";
  if (dims.d == dims.dv)
    return "heads of " + std::to_string(dims.d) +
           ", and the tiled kernels take heads of 32, 64 or 128";
  return "queries and keys of " + std::to_string(dims.d) + " but values of " +
         std::to_string(dims.dv) + ", and the tiled kernels take equal sizes (32, 64 or 128)";
}

}  // namespace stagecraft::rt::cuda
