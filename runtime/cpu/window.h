#pragma once
/// \file
/// What sliding-window ops (Conv, MaxPool, AveragePool) share: per-spatial-dim attributes and
/// ONNX's padding rules (explicit pads or auto_pad).

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"

namespace stagecraft::rt::cpu {

/// The attribute `name` with one value per spatial dim (`count` values), or `fallback` for
/// every dim when absent.
inline std::vector<int64_t> per_dim(const KernelArgs& a, std::string_view name, size_t count, int64_t fallback) {
  std::vector<int64_t> v = a.attrs.ints(name);
  if (v.empty()) return std::vector<int64_t>(count, fallback);
  if (v.size() != count)
    fail(ErrorKind::kModel, "{} attribute '{}' has {} values, the input has {} spatial dims", a.op_type, name,
         v.size(), count);
  return v;
}

/// The padding (before, after) of one spatial dim of `in` positions for a window spanning
/// `reach` positions at `stride`: the explicit `begin`/`end` under auto_pad NOTSET, none under
/// VALID, and under SAME_UPPER / SAME_LOWER enough for ceil(in / stride) outputs, the odd one
/// after (UPPER) or before (LOWER).
inline std::pair<int64_t, int64_t> resolve_padding(const KernelArgs& a, const std::string& auto_pad, int64_t in,
                                                   int64_t stride, int64_t reach, int64_t begin, int64_t end) {
  if (auto_pad == "VALID") {
    begin = end = 0;
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    const int64_t total = std::max<int64_t>(0, ((in + stride - 1) / stride - 1) * stride + reach - in);
    begin = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    end = total - begin;
  } else if (auto_pad != "NOTSET") {
    fail(ErrorKind::kModel, "{} auto_pad '{}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", a.op_type,
         auto_pad);
  }
  if (begin < 0 || end < 0) fail(ErrorKind::kUnsupported, "{} with negative pads is not supported", a.op_type);
  return {begin, end};
}

}  // namespace stagecraft::rt::cpu
