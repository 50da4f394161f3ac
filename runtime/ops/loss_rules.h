#pragma once
/// \file
/// The loss ops' host-side rules both backends read a node with (runtime/cpu/loss.cpp,
/// runtime/cuda/loss.cpp), so they resolve and refuse alike.

#include <string>
#include <string_view>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/reductions.h"

namespace stagecraft::rt::ops {

/// The node's `reduction` attribute (default "mean"); `Error(kModel)` naming op `op` and the
/// value otherwise.
inline LossReduction loss_reduction_of(const Attrs& attrs, std::string_view op) {
  const std::string r = attrs.s("reduction", "mean");
  if (r == "mean") return LossReduction::kMean;
  if (r == "sum") return LossReduction::kSum;
  if (r == "none") return LossReduction::kNone;
  fail(ErrorKind::kModel, "{} reduction '{}' is not one of mean, sum, none", op, r);
}

}  // namespace stagecraft::rt::ops
