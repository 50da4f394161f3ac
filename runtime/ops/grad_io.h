#pragma once
/// \file
/// Reading a gradient op's operands (runtime/format/grad_ops.h): n forward inputs x, m forward
/// outputs y and their gradients dy; n outputs dx. Every gradient kernel family reads its
/// operands through `GradIo` and checks its signature with `grad_arity_error`, so one rule says
/// how many operands a gradient node may have and one message says why a node breaks it.

#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/broadcast.h"

namespace stagecraft::rt::ops {

/// How many forward inputs (n) and forward outputs (m) a gradient op accepts, each a closed
/// range; `kAny` leaves the top open.
struct GradArity {
  static constexpr size_t kAny = std::numeric_limits<size_t>::max();
  size_t n_min = 0, n_max = kAny;
  size_t m_min = 1, m_max = kAny;
};

/// A gradient node's n and m, or (`error` not empty) one line saying how it breaks the contract
/// or `arity`, naming `what` (the op, and the node where known) and the counts.
struct GradCounts {
  size_t n = 0, m = 0;
  std::string error;
};

namespace detail {
inline std::string count_range(size_t lo, size_t hi) {
  if (lo == hi) return fmt::format("{}", lo);
  if (hi == GradArity::kAny) return lo == 0 ? "any number of" : fmt::format("at least {}", lo);
  return fmt::format("{} to {}", lo, hi);
}
}  // namespace detail

/// The counts of a gradient node with `inputs` inputs and `outputs` outputs whose attributes
/// give forward_inputs = n: it must have n + 2m inputs and n outputs, with n and m in `arity`.
inline GradCounts grad_counts(std::string_view what, const Attrs& attrs, size_t inputs,
                              size_t outputs, const GradArity& arity) {
  GradCounts c;
  const int64_t fi = attrs.i(grad::kForwardInputsAttr, -1);
  if (fi >= 0 && static_cast<size_t>(fi) <= inputs) {
    c.n = static_cast<size_t>(fi);
    c.m = (inputs - c.n) / 2;
    if ((inputs - c.n) % 2 == 0 && outputs == c.n && c.n >= arity.n_min && c.n <= arity.n_max &&
        c.m >= arity.m_min && c.m <= arity.m_max)
      return c;
  }
  c.error = fmt::format(
      "{} with {} inputs, {} outputs and {} breaks the gradient-op contract: expected n = {} "
      "forward inputs and m = {} forward outputs, so n + 2m inputs and n outputs",
      what, inputs, outputs,
      fi >= 0 ? fmt::format("{}={}", grad::kForwardInputsAttr, fi)
              : fmt::format("no {} attribute", grad::kForwardInputsAttr),
      detail::count_range(arity.n_min, arity.n_max), detail::count_range(arity.m_min, arity.m_max));
  return c;
}

/// "" when the signature has the counts `arity` allows, else why not (a backend check).
inline std::string grad_arity_error(const OpSignature& s, const GradArity& arity = {}) {
  return grad_counts(s.op_type, s.attrs, s.inputs.size(), s.outputs.size(), arity).error;
}

/// Zeroes `t`.
inline void zero(Tensor& t) {
  if (t.bytes() > 0) std::memset(t.data, 0, static_cast<size_t>(t.bytes()));
}

/// Zeroes every requested output, on the kernel's own device (the CUDA backend's kernels use it
/// too). A kernel whose table entry says `writes_every_output` calls this where the gradients
/// are all zero (dy omitted, an empty operand), since the runtime then hands it outputs with
/// whatever bytes the arena held.
inline void zero_outputs(const KernelArgs& a) {
  for (Tensor* t : a.out)
    if (t != nullptr) a.device.fill_zero(*t);
}

/// Throws `Error(kShape)` when the output gradient `dy` does not have the forward output's
/// `shape`.
inline void expect_dy_shape(const KernelArgs& a, const Tensor& dy, const Shape& shape) {
  if (dy.shape != shape)
    fail(ErrorKind::kShape, "{} '{}': the output gradient is {} but the output is {}", a.op_type,
         a.name, dy.describe(), shape_string(shape));
}

/// Where the gradient op's operands are: n forward inputs, m forward outputs. Throws
/// `Error(kModel)` naming the node and the counts when the node breaks the contract's arity or
/// `arity`.
struct GradIo {
  const KernelArgs& a;
  size_t n, m;

  explicit GradIo(const KernelArgs& args, const GradArity& arity = {}) : a(args) {
    GradCounts c = grad_counts(fmt::format("{} '{}'", args.op_type, args.name), args.attrs,
                               args.num_inputs(), args.out.size(), arity);
    if (!c.error.empty()) throw Error(ErrorKind::kModel, std::move(c.error));
    n = c.n;
    m = c.m;
  }
  /// Forward input k, forward output j and its gradient; null where omitted.
  const Tensor* x(size_t k) const { return k < n ? a.in[k] : nullptr; }
  const Tensor* y(size_t j) const { return j < m ? a.in[n + j] : nullptr; }
  const Tensor* dy(size_t j) const { return j < m ? a.in[n + m + j] : nullptr; }
  /// The gradient of forward input k; null where it is not wanted.
  Tensor* dx(size_t k) const { return k < n ? a.out[k] : nullptr; }
  bool wants(size_t k) const { return dx(k) != nullptr; }
  const Tensor& need_x(size_t k) const {
    if (x(k) == nullptr) fail(ErrorKind::kModel, "{} needs forward input {}", a.op_type, k);
    return *x(k);
  }
  /// The start of a gradient whose one wanted result is dx of input 0: sets dx, dy (of output
  /// 0) and x (checking dx has x's shape). False when there is nothing to compute: dx is not
  /// wanted, or dy is omitted (then every output is zeroed, on the kernel's device).
  bool input0(Tensor*& dx_out, const Tensor*& dy_out, const Tensor*& x_out) const {
    dx_out = dx(0);
    dy_out = dy(0);
    if (dy_out == nullptr) zero_outputs(a);
    if (dx_out == nullptr || dy_out == nullptr) return false;
    x_out = &need_x(0);
    expect_shape(a, 0, x_out->shape);
    return true;
  }
  const Tensor& need_y(size_t j) const {
    if (y(j) == nullptr) fail(ErrorKind::kModel, "{} needs forward output {}", a.op_type, j);
    return *y(j);
  }
};

/// A binary op's gradient operands: A, B, the forward output Y (null when omitted or not of the
/// broadcast shape) and dY.
struct BinaryGradOperands {
  const Tensor* lhs = nullptr;
  const Tensor* rhs = nullptr;
  const Tensor* y = nullptr;
  const Tensor* dy = nullptr;
};

/// Reads a binary op's gradient operands, dY checked against A and B's broadcast shape: false
/// when no gradient is to be computed (every output zeroed where dY is omitted).
inline bool binary_operands(const KernelArgs& a, const GradIo& io, BinaryGradOperands& b) {
  b.dy = io.dy(0);
  if (b.dy == nullptr) zero_outputs(a);
  if (b.dy == nullptr || (io.dx(0) == nullptr && io.dx(1) == nullptr)) return false;
  b.lhs = &io.need_x(0);
  b.rhs = &io.need_x(1);
  b.y = io.y(0);
  const Shape out = broadcast_shape(b.lhs->shape, b.rhs->shape);
  expect_dy_shape(a, *b.dy, out);
  if (b.y != nullptr && b.y->shape != out) b.y = nullptr;
  return true;
}

/// ReluGrad's arguments with its mask operand in X's place, for a kernel that computes dY where
/// X > 0: Y where the runtime hands it over (grad_reads.cpp: Relu's gradient reads Y and X comes
/// bare; Y > 0 exactly where X > 0), else `a` as it is (a node whose Y is left out). `storage`
/// holds the returned arguments' inputs.
inline KernelArgs relu_mask_in_x(const KernelArgs& a, std::vector<const Tensor*>& storage) {
  const GradIo io(a);
  const Tensor* x = io.x(0);
  const Tensor* y = io.y(0);
  if (x == nullptr || y == nullptr || y->is_bare() || y->shape != x->shape) return a;
  storage.assign(a.in.begin(), a.in.end());
  storage[0] = y;
  return KernelArgs{a.name, a.op_type, a.attrs, storage, a.out, a.device, a.random_key};
}

}  // namespace stagecraft::rt::ops
