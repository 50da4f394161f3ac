// Resize and its gradient (see families.h), float32, modes nearest and linear over any rank up
// to kMaxResizeRank, the node read through resize_shape.h. Both kernels are one separable sum
// per destination element (resize_element.h, which the CUDA backend runs too): Resize sums the
// taps of each output element, ResizeGrad (contract: runtime/format/grad_ops.h) gathers into
// each input element dy over the output elements whose taps read it, times their weights: the
// scatter-add of dy written as a gather, so it needs no atomics and its sums do not depend on
// the thread count.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/resize_shape.h"

namespace stagecraft::rt::cpu {

namespace {

// Loops over at least this many elements use all of the worker's threads.
constexpr int64_t kParallelElements = int64_t{1} << 14;

// Operand k of the forward node, null when omitted.
const Tensor* operand(const KernelArgs& a, size_t k) { return a.has_input(k) ? a.in[k] : nullptr; }

void fill(const ops::SeparableTableData& data, const float* source, float* destination, int64_t n) {
  const ops::SeparableTable t = data.at(data.ints.data(), data.floats.data());
#pragma omp parallel for if (n >= kParallelElements)
  for (int64_t e = 0; e < n; ++e) destination[e] = ops::separable_sum(t, source, e);
}

void resize(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::ResizeGeometry g = ops::resize_geometry(a, x.shape, operand(a, 2), operand(a, 3));
  expect_shape(a, 0, g.y_shape);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  fill(ops::resize_forward_tables(g), x.as<float>(), y.as<float>(), y.numel());
}

void resize_grad(const KernelArgs& a) {
  const ops::GradIo io(a, {.n_min = 1, .n_max = 4, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (!io.input0(dx, dy, x)) return;
  const ops::ResizeGeometry g = ops::resize_geometry(a, x->shape, io.x(2), io.x(3));
  ops::expect_dy_shape(a, *dy, g.y_shape);
  if (dx->numel() == 0) return;
  fill(ops::resize_gradient_tables(g), dy->as<float>(), dx->as<float>(), dx->numel());
}

// The operands after X: roi (read only by tf_crop_and_resize, which is refused), scales,
// sizes.
std::string check_resize_operands(const OpSignature& s, size_t n) {
  if (n == 2)
    return "Resize with 2 inputs (opset 10's X and scales) is not supported; export at opset 11 "
           "or later";
  if (n < 3 || n > 4)
    return fmt::format("Resize with {} inputs is not supported (X, roi, scales, sizes)", n);
  const DType roi = s.inputs[1];
  if (roi != DType::kUndefined && roi != DType::kFloat32 && roi != DType::kFloat16 &&
      roi != DType::kFloat64)
    return fmt::format("Resize's roi is {}, expected a float type", dtype_name(roi));
  if (s.inputs[2] != DType::kUndefined && s.inputs[2] != DType::kFloat32)
    return fmt::format("Resize's scales are {}, expected float32", dtype_name(s.inputs[2]));
  if (n > 3 && s.inputs[3] != DType::kUndefined && s.inputs[3] != DType::kInt64)
    return fmt::format("Resize's sizes are {}, expected int64", dtype_name(s.inputs[3]));
  return ops::read_resize_attributes(s.attrs).error;
}

std::string check_resize(const OpSignature& s) {
  if (s.outputs.size() != 1)
    return fmt::format("Resize with {} outputs is not a valid signature", s.outputs.size());
  if (!s.inputs.empty() && (s.inputs[0] != DType::kFloat32 || s.outputs[0] != DType::kFloat32))
    return fmt::format("Resize from {} to {} is not supported (float32 only)",
                       dtype_name(s.inputs[0]), dtype_name(s.outputs[0]));
  return check_resize_operands(s, s.inputs.size());
}

std::string check_resize_grad(const OpSignature& s) {
  const ops::GradArity arity{.n_min = 1, .n_max = 4, .m_min = 1, .m_max = 1};
  if (auto why = ops::grad_arity_error(s, arity); !why.empty()) return why;
  const size_t n = s.outputs.size();
  const DType dy = s.inputs[n + 1];
  if (dy != DType::kFloat32 && dy != DType::kUndefined)
    return fmt::format("ResizeGrad with a {} output gradient is not supported (float32 only)",
                       dtype_name(dy));
  if (s.inputs[0] != DType::kFloat32)
    return fmt::format("ResizeGrad of a {} input is not supported (float32 only)",
                       dtype_name(s.inputs[0]));
  if (s.outputs[0] != DType::kUndefined && s.outputs[0] != DType::kFloat32)
    return fmt::format("ResizeGrad's dX is {}, expected float32", dtype_name(s.outputs[0]));
  for (size_t k = 1; k < n; ++k)
    if (s.outputs[k] != DType::kUndefined)
      return "ResizeGrad gives no gradient of roi, scales or sizes";
  return check_resize_operands(s, n);
}

// The gradient writes every element of dx (0 where no output reads it; all of it when dy is
// omitted).
constexpr KernelEntry kKernels[] = {
    {"Resize", resize, check_resize},
    {"ResizeGrad", resize_grad, check_resize_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> resize_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
