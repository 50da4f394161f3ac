#pragma once
/// \file
/// The fused Gelu's kernels (runtime/ops/gelu_element.h) against a double-precision reference on
/// any backend: tests/runtime/gelu_test.cpp runs it on the CPU, tests/gpu/cuda_gelu_test.cpp on
/// CUDA.

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/format/grad_ops.h"
#include "tests/runtime/attention_util.h"

namespace stagecraft::testing::gelu {

/// A Gelu or GeluGrad node of domain ai.stagecraft with `approximate`.
inline onnx::NodeProto node(const std::string& approximate, bool grad = false) {
  onnx::NodeProto n;
  n.set_name(grad ? "gelu_grad" : "gelu");
  n.set_op_type(grad ? "GeluGrad" : "Gelu");
  n.set_domain(std::string(grad::kGradDomain));
  onnx::AttributeProto* a = n.add_attribute();
  a->set_name("approximate");
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(approximate);
  if (grad) {
    onnx::AttributeProto* f = n.add_attribute();
    f->set_name(std::string(grad::kForwardInputsAttr));
    f->set_type(onnx::AttributeProto::INT);
    f->set_i(1);
  }
  return n;
}

/// y and dy/dx in double, written from the definitions: Phi through erf, and the tanh form's
/// derivative by the chain rule.
inline double reference(double x, bool tanh_form) {
  if (!tanh_form) return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
  const double k = std::sqrt(2 / M_PI);
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
inline double reference_derivative(double x, bool tanh_form) {
  if (!tanh_form)
    return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
           x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI);
  const double k = std::sqrt(2 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

/// Forward and gradient of both forms on `backend` over x in [-8, 8] (both tails and the
/// curve's bend), with and without y given to the gradient (it must not matter).
inline void check_kernels(const rt::Backend& backend) {
  const rt::Shape shape = {3, 257};
  const rt::Tensor x = attention::random(shape, 11, -8.0f, 8.0f);
  const rt::Tensor dy = attention::random(shape, 12);
  for (const std::string approximate : {"none", "tanh"}) {
    CAPTURE(approximate);
    const bool tanh_form = approximate == "tanh";
    rt::Tensor y = rt::Tensor::owned(DType::kFloat32, shape);
    attention::run(backend, node(approximate), {&x}, {&y});
    std::vector<double> want_y, want_dx;
    for (int64_t i = 0; i < x.numel(); ++i) {
      want_y.push_back(reference(x.as<float>()[i], tanh_form));
      want_dx.push_back(reference_derivative(x.as<float>()[i], tanh_form) * dy.as<float>()[i]);
    }
    attention::check_close(y, want_y, 1e-6, "y");
    const rt::Tensor* none = nullptr;
    for (const rt::Tensor* given : {static_cast<const rt::Tensor*>(&y), none}) {
      rt::Tensor dx = rt::Tensor::owned(DType::kFloat32, shape);
      attention::run(backend, node(approximate, true), {&x, given, &dy}, {&dx});
      attention::check_close(dx, want_dx, 1e-6, given ? "dx" : "dx (no y)");
    }
  }
}

}  // namespace stagecraft::testing::gelu
