#pragma once
/// \file
/// Reading a gradient op's operands (runtime/format/grad_ops.h): n forward inputs x, m forward
/// outputs y and their gradients dy; n outputs dx. Shared by the gradient kernel families.

#include <cstring>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::rt::cpu {

/// Where the gradient op's operands are: n forward inputs, m forward outputs. Throws
/// `Error(kModel)` when the node breaks the contract's arity.
struct GradIo {
  const KernelArgs& a;
  size_t n, m;

  explicit GradIo(const KernelArgs& args) : a(args) {
    const int64_t fi = args.attrs.i(grad::kForwardInputsAttr, -1);
    if (fi < 0 || static_cast<size_t>(fi) > args.num_inputs() ||
        (args.num_inputs() - static_cast<size_t>(fi)) % 2 != 0 ||
        args.out.size() != static_cast<size_t>(fi))
      fail(ErrorKind::kModel,
           "{} with {} inputs, {} outputs and forward_inputs={} breaks the gradient-op contract",
           args.op_type, args.num_inputs(), args.out.size(), fi);
    n = static_cast<size_t>(fi);
    m = (args.num_inputs() - n) / 2;
  }
  const Tensor* x(size_t k) const { return k < n ? a.in[k] : nullptr; }
  const Tensor* y(size_t j) const { return j < m ? a.in[n + j] : nullptr; }
  const Tensor* dy(size_t j) const { return j < m ? a.in[n + m + j] : nullptr; }
  Tensor* dx(size_t k) const { return k < n ? a.out[k] : nullptr; }
  const Tensor& need_x(size_t k) const {
    if (x(k) == nullptr) fail(ErrorKind::kModel, "{} needs forward input {}", a.op_type, k);
    return *x(k);
  }
};

/// Zeroes `t`.
inline void zero(Tensor& t) {
  if (t.bytes() > 0) std::memset(t.data, 0, static_cast<size_t>(t.bytes()));
}

/// Zeroes every requested output: all gradients are zero when dy is omitted (outputs that are
/// a program's intermediates live in its arena and are not zeroed for the kernel).
inline void zero_outputs(const KernelArgs& a) {
  for (Tensor* t : a.out)
    if (t != nullptr) zero(*t);
}

}  // namespace stagecraft::rt::cpu
