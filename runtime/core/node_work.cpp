// The work of one node as run (node_work.h).
#include "runtime/core/node_work.h"

#include <algorithm>
#include <vector>

#include "runtime/format/grad_ops.h"

namespace stagecraft::rt {
namespace {

int64_t dim(const Tensor* t, int64_t axis_from_end) {
  if (t == nullptr || t->rank() < axis_from_end) return 0;
  return t->shape[static_cast<size_t>(t->rank() - axis_from_end)];
}

// FLOPs of the forward op `op` with inputs `x` and outputs `y` (shapes only: either may be
// bare); 0 for an op whose FLOPs are not counted.
double forward_flops(std::string_view op, const Attrs& attrs, std::span<const Tensor* const> x,
                     std::span<const Tensor* const> y) {
  const Tensor* y0 = y.empty() ? nullptr : y[0];
  if (y0 == nullptr || x.empty() || x[0] == nullptr) return 0;
  const auto out = static_cast<double>(y0->numel());
  if (op == "MatMul") {
    // Y[..., M, N] = A[..., M, K] B[..., K, N]: K multiply-adds per output (a 1-D A is [K]).
    return 2 * out * static_cast<double>(dim(x[0], 1));
  }
  if (op == "Gemm") {
    const int64_t k = attrs.i("transA", 0) != 0 ? dim(x[0], 2) : dim(x[0], 1);
    return 2 * out * static_cast<double>(k) + (x.size() > 2 && x[2] != nullptr ? out : 0);
  }
  if ((op == "Conv" || op == "ConvTranspose") && x.size() > 1 && x[1] != nullptr) {
    // Conv: W [Cout, Cin/g, k...]: each output takes numel(W) / Cout multiply-adds.
    // ConvTranspose: W [Cin, Cout/g, k...]: each input element scatters numel(W) / Cin.
    const Tensor& w = *x[1];
    if (w.rank() < 1 || w.shape[0] == 0) return 0;
    const double per = static_cast<double>(w.numel()) / static_cast<double>(w.shape[0]);
    return 2 * per * (op == "Conv" ? out : static_cast<double>(x[0]->numel()));
  }
  if (op == "Attention" && x.size() > 2 && x[1] != nullptr && x[2] != nullptr) {
    // Q [B, H, Tq, d], K [B, H, Tk, d], V [B, H, Tk, dv]: QK^T and PV, half of it when causal.
    const double bh_tq = static_cast<double>(x[0]->numel()) / std::max<int64_t>(1, dim(x[0], 1));
    const double products =
        2 * bh_tq * static_cast<double>(dim(x[1], 2)) *
        static_cast<double>(dim(x[0], 1) + dim(x[2], 1));
    return attrs.i("causal", 0) != 0 ? products / 2 : products;
  }
  return 0;
}

}  // namespace

NodeWork node_work(std::string_view op_type, const Attrs& attrs, std::span<const Tensor* const> in,
                   std::span<Tensor* const> out) {
  NodeWork work;
  for (const Tensor* t : in)
    if (t != nullptr && !t->is_bare()) work.bytes_read += t->bytes();
  for (const Tensor* t : out)
    if (t != nullptr) work.bytes_written += t->bytes();
  const int64_t n = attrs.i(grad::kForwardInputsAttr, -1);
  if (!op_type.ends_with(grad::kGradSuffix) || n < 0 || static_cast<size_t>(n) > in.size()) {
    std::vector<const Tensor*> y(out.begin(), out.end());
    work.flops = forward_flops(op_type, attrs, in, y);
    return work;
  }
  // A gradient op: x0..x{n-1}, y0..y{m-1}, dy0..dy{m-1} in; dx0..dx{n-1} out.
  const std::string_view forward = op_type.substr(0, op_type.size() - grad::kGradSuffix.size());
  const auto xs = in.subspan(0, static_cast<size_t>(n));
  const size_t m = (in.size() - static_cast<size_t>(n)) / 2;
  const auto ys = in.subspan(static_cast<size_t>(n), m);
  const double once = forward_flops(forward, attrs, xs, ys);
  if (forward == "Attention") {
    work.flops = 2.5 * once;
    return work;
  }
  // One product per gradient of a product operand (the first two inputs) it writes.
  int products = 0;
  for (size_t k = 0; k < std::min<size_t>(2, out.size()); ++k) products += out[k] != nullptr;
  work.flops = once * products;
  return work;
}

}  // namespace stagecraft::rt
