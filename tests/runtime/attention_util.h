#pragma once
/// \file
/// What the fused attention kernels' tests share (tests/runtime/attention_kernel_test.cpp on the
/// CPU, tests/gpu/cuda_attention_test.cpp on CUDA against the CPU): nodes built in code, a
/// kernel called directly on host tensors through any backend, random operands and a closeness
/// check. Inline, so each test binary takes what it uses.

#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/core/device.h"
#include "runtime/core/kernel.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::testing::attention {

/// The node's attributes: `scale` 0 leaves the attribute out (its default 1/sqrt(d)).
struct Options {
  float scale = 0.0f;
  bool causal = false;
};

/// A learned mask's case: Q's shape, the key count, the mask's shape and the attributes (V has
/// Q's head size).
struct LearnedMaskCase {
  rt::Shape q;
  int64_t tk = 0;
  rt::Shape mask;
  Options options;
};

/// An Attention node, or its gradient node (forward_inputs = 4) when `grad`.
inline onnx::NodeProto node(const Options& o, bool grad = false) {
  onnx::NodeProto n;
  n.set_name(grad ? "attn_grad" : "attn");
  n.set_op_type(grad ? "AttentionGrad" : "Attention");
  n.set_domain(std::string(grad::kGradDomain));
  auto add_int = [&](const std::string& name, int64_t value) {
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(value);
  };
  if (o.scale != 0.0f) {
    onnx::AttributeProto* a = n.add_attribute();
    a->set_name("scale");
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(o.scale);
  }
  if (o.causal) add_int("causal", 1);
  if (grad) add_int(std::string(grad::kForwardInputsAttr), 4);
  return n;
}

/// Calls `node`'s kernel on `backend` with host tensors: `in` per input (null: omitted), `out`
/// per output (null: not asked for), copied to and from the device where it has memory of its
/// own.
inline void run(const rt::Backend& backend, const onnx::NodeProto& node,
                const std::vector<const rt::Tensor*>& in, const std::vector<rt::Tensor*>& out) {
  const rt::Attrs attrs(node);
  auto device = backend.make_device(0, 1);
  std::vector<rt::Tensor> on_device;
  on_device.reserve(in.size() + out.size());
  std::vector<const rt::Tensor*> din;
  std::vector<rt::Tensor*> dout;
  for (const rt::Tensor* t : in)
    din.push_back(t ? &on_device.emplace_back(rt::to_device(*device, *t)) : nullptr);
  for (rt::Tensor* t : out)
    dout.push_back(t ? &on_device.emplace_back(rt::to_device(*device, *t)) : nullptr);
  backend.kernel(node.op_type())({node.name(), node.op_type(), attrs, din, dout, *device});
  device->synchronize();
  for (size_t k = 0; k < out.size(); ++k)
    if (out[k] != nullptr && !device->host_visible())
      device->read(*dout[k], out[k]->data, out[k]->bytes());
}

/// `t` cast to `to` by the CPU backend's Cast (round to nearest even, widening exact).
inline rt::Tensor cast(const rt::Tensor& t, DType to) {
  onnx::NodeProto n;
  n.set_name("cast");
  n.set_op_type("Cast");
  onnx::AttributeProto* a = n.add_attribute();
  a->set_name("to");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(static_cast<int64_t>(to));
  rt::Tensor out = rt::Tensor::owned(to, t.shape);
  run(rt::cpu_backend(), n, {&t}, {&out});
  return out;
}

/// A float32 tensor uniform in [lo, hi) from `seed`.
inline rt::Tensor random(const rt::Shape& shape, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  rt::Tensor t = rt::Tensor::owned(DType::kFloat32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = u(rng);
  return t;
}

/// Checks |got - want| <= rtol * max|want| at every element (a relative error measured against
/// the tensor's scale, since single elements may cancel to near zero), infinities equal.
inline void check_close(const rt::Tensor& got, const std::vector<double>& want, double rtol,
                        const char* what) {
  CAPTURE(what);
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  double scale = 0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
  int64_t bad = -1;
  for (int64_t i = 0; i < got.numel() && bad < 0; ++i) {
    const double g = got.as<float>()[i], w = want[static_cast<size_t>(i)];
    const bool ok = std::isfinite(w) ? std::fabs(g - w) <= rtol * scale : g == w;
    if (!ok) bad = i;
  }
  CHECK_MESSAGE(bad < 0, what, " differs at element ", bad, ": ",
                bad < 0 ? 0.0 : got.as<float>()[bad], " against ",
                bad < 0 ? 0.0 : want[static_cast<size_t>(bad)], " (scale ", scale, ")");
}

/// `t`'s elements as doubles.
inline std::vector<double> values(const rt::Tensor& t) {
  return std::vector<double>(t.as<float>(), t.as<float>() + t.numel());
}

}  // namespace stagecraft::testing::attention
