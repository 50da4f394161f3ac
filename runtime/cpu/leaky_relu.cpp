// LeakyRelu and its gradient (see families.h): y = x for x >= 0, alpha * x below (attribute
// alpha, default 0.01), on float32 and float64; the gradient dx = dy where x >= 0, alpha * dy
// below, on float32 (contract: runtime/format/grad_ops.h). The worked example of docs/implementation.md's
// "Adding an op": one kernel file, one line in dispatch.cpp's table of families.
#include <fmt/format.h>

#include <string>

#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::cpu {

namespace {

// Loops over at least this many elements use all of the worker's threads.
constexpr int64_t kParallelElements = int64_t{1} << 15;

template <class T>
void leaky_relu_of(const Tensor& x, Tensor& y, T alpha) {
  const T* in = x.as<T>();
  T* out = y.as<T>();
  const int64_t n = x.numel();
#pragma omp parallel for simd if (parallel : n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] < T(0) ? alpha * in[i] : in[i];
}

void leaky_relu(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  expect_shape(a, 0, x.shape);
  const float alpha = a.attrs.f("alpha", 0.01f);
  if (x.dtype == DType::kFloat64) return leaky_relu_of<double>(x, *a.out[0], alpha);
  leaky_relu_of<float>(x, *a.out[0], alpha);
}

// dx = dy * (x < 0 ? alpha : 1); the forward output is not needed.
void leaky_relu_grad(const KernelArgs& a) {
  ops::GradIo io(a, {.n_min = 1, .n_max = 1, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (!io.input0(dx, dy, x)) return;
  ops::expect_dy_shape(a, *dy, x->shape);
  const float alpha = a.attrs.f("alpha", 0.01f);
  const float* xs = x->as<float>();
  const float* dys = dy->as<float>();
  float* dxs = dx->as<float>();
  const int64_t n = x->numel();
#pragma omp parallel for simd if (parallel : n >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) dxs[i] = xs[i] < 0.0f ? alpha * dys[i] : dys[i];
}

std::string check_leaky_relu(const OpSignature& s) {
  if (s.inputs.size() != 1 || s.outputs.size() != 1)
    return fmt::format("LeakyRelu with {} inputs and {} outputs is not a valid signature",
                       s.inputs.size(), s.outputs.size());
  const DType d = s.inputs[0];
  if (d != DType::kFloat32 && d != DType::kFloat64)
    return fmt::format("LeakyRelu on {} is not supported (float32 and float64 only)",
                       dtype_name(d));
  if (s.outputs[0] != d)
    return fmt::format("LeakyRelu from {} to {} is not a valid signature", dtype_name(d),
                       dtype_name(s.outputs[0]));
  return "";
}

std::string check_leaky_relu_grad(const OpSignature& s) {
  if (auto why = ops::grad_arity_error(s, {.n_min = 1, .n_max = 1, .m_min = 1, .m_max = 1});
      !why.empty())
    return why;
  for (DType d : s.inputs)
    if (d != DType::kFloat32 && d != DType::kUndefined)
      return fmt::format("LeakyReluGrad on {} is not supported (float32 only)", dtype_name(d));
  if (s.outputs[0] != DType::kFloat32 && s.outputs[0] != DType::kUndefined)
    return fmt::format("LeakyReluGrad producing {} is not supported (float32 only)",
                       dtype_name(s.outputs[0]));
  return "";
}

// The gradient writes every element of dx (or zeroes it when dy is omitted).
constexpr KernelEntry kKernels[] = {
    {"LeakyRelu", leaky_relu, check_leaky_relu},
    {"LeakyReluGrad", leaky_relu_grad, check_leaky_relu_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> leaky_relu_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
