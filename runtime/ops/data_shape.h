#pragma once
/// \file
/// The output shapes of the data family's shape-only ops (Reshape, Flatten, Squeeze, Unsqueeze),
/// one set of rules for the CPU kernels (runtime/cpu/data.cpp) and the CUDA ones
/// (runtime/cuda/data.cpp), which then move the bytes each its own way. Each refusal is one line
/// naming the op and the numbers.

#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/layout.h"

namespace stagecraft::rt::ops {

/// An axis list from attribute `name` or, when the attribute is absent, from input `k` (the form
/// opset 13 moved it to), read to the host by `read_input(k)`; empty when neither is given.
template <class ReadInput>
std::vector<int64_t> axes_from(const KernelArgs& a, std::string_view name, size_t k,
                               ReadInput&& read_input) {
  if (a.attrs.has(name)) return a.attrs.ints(name);
  if (a.has_input(k)) return std::forward<ReadInput>(read_input)(k);
  return {};
}

/// Reshape of an input of `in` to `requested` (its input 1): a 0 copies the input's dim unless
/// allowzero, one -1 is inferred from the element count.
inline Shape reshape_shape(const KernelArgs& a, const Shape& in, Shape requested) {
  const bool allow_zero = a.attrs.i("allowzero", 0) != 0;
  int64_t inferred = -1, known = 1;
  for (size_t d = 0; d < requested.size(); ++d) {
    if (requested[d] == 0 && !allow_zero) {
      if (d >= in.size())
        fail(ErrorKind::kModel, "Reshape copies dim {} of a rank-{} input", d, in.size());
      requested[d] = in[d];
    }
    if (requested[d] == -1) {
      if (inferred >= 0)
        fail(ErrorKind::kModel, "Reshape shape {} has two -1 dims", shape_string(requested));
      inferred = static_cast<int64_t>(d);
    } else if (requested[d] < 0) {
      fail(ErrorKind::kModel, "Reshape shape has the negative dim {}", requested[d]);
    } else {
      known *= requested[d];
    }
  }
  if (inferred >= 0) requested[inferred] = known == 0 ? 0 : shape_numel(in) / known;
  return requested;
}

/// Flatten of an input of `in` at `axis` (default 1): [dims before axis, dims from it].
inline Shape flatten_shape(const KernelArgs& a, const Shape& in) {
  const auto rank = static_cast<int64_t>(in.size());
  const int64_t axis = normalize_axis(a, a.attrs.i("axis", 1), rank, /*inclusive=*/true);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= in[d];
  for (int64_t d = axis; d < rank; ++d) inner *= in[d];
  return {outer, inner};
}

/// Squeeze of an input of `in`: the listed `axes` (or every size-1 dim) removed.
inline Shape squeeze_shape(const KernelArgs& a, const Shape& in,
                           const std::vector<int64_t>& axes) {
  std::vector<bool> drop(in.size(), axes.empty());
  for (int64_t axis : axes) {
    const int64_t d = normalize_axis(a, axis, static_cast<int64_t>(in.size()));
    if (in[d] != 1) fail(ErrorKind::kModel, "Squeeze axis {} has size {}, not 1", axis, in[d]);
    drop[d] = true;
  }
  Shape out;
  for (size_t d = 0; d < in.size(); ++d)
    if (!drop[d] || in[d] != 1) out.push_back(in[d]);
  return out;
}

/// Unsqueeze of an input of `in`: size-1 dims inserted at the listed `axes` of the output.
inline Shape unsqueeze_shape(const KernelArgs& a, const Shape& in,
                             const std::vector<int64_t>& axes) {
  const int64_t rank = static_cast<int64_t>(in.size() + axes.size());
  std::vector<bool> inserted(static_cast<size_t>(rank), false);
  for (int64_t axis : axes) {
    const int64_t d = normalize_axis(a, axis, rank);
    if (inserted[d]) fail(ErrorKind::kModel, "Unsqueeze axis {} is listed twice", axis);
    inserted[d] = true;
  }
  Shape out;
  size_t next = 0;
  for (int64_t d = 0; d < rank; ++d) out.push_back(inserted[d] ? 1 : in[next++]);
  return out;
}

}  // namespace stagecraft::rt::ops
