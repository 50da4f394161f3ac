#pragma once
/// \file
/// Dispatch on an element's size alone, for CPU kernels that move elements without looking at
/// them (the indexing and rearrange families).

#include <cstdint>

#include "runtime/core/kernel.h"
#include "runtime/format/dtype.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::cpu {

/// Calls `body(T{})` with the unsigned type of `dtype`'s size (1, 2, 4 or 8 bytes); refuses any
/// other size naming the node and the dtype.
template <class Body>
void by_size(const KernelArgs& a, DType dtype, Body&& body) {
  switch (dtype_size(dtype)) {
    case 1:
      return body(uint8_t{});
    case 2:
      return body(uint16_t{});
    case 4:
      return body(uint32_t{});
    case 8:
      return body(uint64_t{});
    default:
      fail(ErrorKind::kUnsupported, "{} '{}' on {} is not supported", a.op_type, a.name,
           dtype_name(dtype));
  }
}

}  // namespace stagecraft::rt::cpu
