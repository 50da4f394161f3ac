// Split evaluated on the host for constant folding (passes/host_tensor.h's split_on_host).
#include <limits>
#include <optional>
#include <vector>

#include "passes/host_tensor.h"

namespace stagecraft::passes {

std::optional<std::vector<HostTensor>> split_on_host(
    const ir::Node& node, const std::vector<std::optional<HostTensor>>& in, int64_t opset,
    int64_t max_output_elements) {
  const HostTensor& x = *in[0];
  const auto rank = static_cast<int64_t>(x.shape.size());
  int64_t axis = node.attr_int("axis", 0);
  if (rank == 0 || axis < -rank || axis >= rank || x.numel() > max_output_elements)
    return std::nullopt;
  if (axis < 0) axis += rank;
  const auto parts = static_cast<int64_t>(node.outputs.size());
  std::vector<int64_t> sizes;
  if (opset >= 13 && node.inputs.size() > 1 && node.inputs[1] != ir::kNoId) {
    if (in.size() < 2 || !in[1]) return std::nullopt;
    for (int64_t i = 0; i < in[1]->numel(); ++i) sizes.push_back(in[1]->int_at(i));
  } else if (opset < 13 && node.attribute("split") != nullptr) {
    sizes = node.attr_ints("split");
  } else {
    if (parts == 0 || x.shape[axis] % parts != 0) return std::nullopt;
    sizes.assign(static_cast<std::size_t>(parts), x.shape[axis] / parts);
  }
  int64_t total = 0;
  for (int64_t v : sizes) total += v < 0 ? std::numeric_limits<int64_t>::min() / 4 : v;
  if (static_cast<int64_t>(sizes.size()) != parts || total != x.shape[axis]) return std::nullopt;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape[d];
  std::vector<HostTensor> out;
  int64_t start = 0;
  for (int64_t size : sizes) {
    std::vector<int64_t> shape = x.shape;
    shape[axis] = size;
    HostTensor t;
    t.dtype = x.dtype;
    t.shape = shape;
    const int64_t n = outer * size * inner;
    if (x.is_real())
      t.reals.assign(static_cast<std::size_t>(n), 0.0);
    else
      t.ints.assign(static_cast<std::size_t>(n), 0);
    int64_t j = 0;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t a = start; a < start + size; ++a)
        for (int64_t i = 0; i < inner; ++i, ++j) {
          const int64_t src = (o * x.shape[axis] + a) * inner + i;
          if (x.is_real())
            t.reals[j] = x.reals[src];
          else
            t.ints[j] = x.ints[src];
        }
    out.push_back(std::move(t));
    start += size;
  }
  return out;
}

}  // namespace stagecraft::passes
