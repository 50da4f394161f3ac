#pragma once
/// \file
/// numpy's multidirectional broadcasting rule: the shape that broadcast inputs produce, the one
/// rule the CPU kernels (runtime/cpu/broadcast.h walks it), the CUDA ones and their gradients
/// read.

#include <algorithm>
#include <cstdint>

#include "runtime/core/tensor.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::ops {

/// The shape that `a` and `b` broadcast to (trailing dims aligned; a dim of 1 stretches).
/// Throws `Error(kShape)` when they do not broadcast.
inline Shape broadcast_shape(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t k = 0; k < out.size(); ++k) {
    size_t from_end = out.size() - 1 - k;
    int64_t da = from_end < a.size() ? a[a.size() - 1 - from_end] : 1;
    int64_t db = from_end < b.size() ? b[b.size() - 1 - from_end] : 1;
    if (da != db && da != 1 && db != 1)
      fail(ErrorKind::kShape, "shapes {} and {} do not broadcast (dim {} is {} and {})",
           shape_string(a), shape_string(b), k, da, db);
    out[k] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace stagecraft::rt::ops
