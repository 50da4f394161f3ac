// The per-element functions of the CUDA pooling kernels (runtime/cuda/conv_window.h), run on
// the host without a GPU, against the CPU backend's pooling kernels on random 1-D to 3-D
// geometries (strides, dilations, asymmetric pads, auto_pad, ceil_mode, count_include_pad,
// ties in X): MaxPool and its Indices, MaxPoolGrad and AveragePoolGrad bit for bit (the CUDA
// kernels gather in the order the CPU's loops add), AveragePool within float rounding (the CPU
// may run it on oneDNN).
#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/cuda/conv_window.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/window.h"
#include "tests/gpu/table_util.h"

namespace stagecraft::rt {
namespace {

using gpu_test::set_int;
using gpu_test::set_ints;

// One random pooling node: X's shape and the node's attributes.
struct PoolCase {
  Shape x_shape;
  onnx::NodeProto node;
  bool include_pad = false;
  bool column_major = false;
};

PoolCase random_case(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  PoolCase c;
  const int spatial = pick(1, 3);
  c.x_shape = {2, 2};
  std::vector<int64_t> kernel, strides, dilations, pads(2 * spatial);
  for (int i = 0; i < spatial; ++i) {
    c.x_shape.push_back(pick(1, 7));
    kernel.push_back(pick(1, 3));
    strides.push_back(pick(1, 3));
    dilations.push_back(pick(1, 2));
    pads[i] = pick(0, 2);
    pads[spatial + i] = pick(0, 2);
  }
  set_ints(c.node, "kernel_shape", kernel);
  set_ints(c.node, "strides", strides);
  set_ints(c.node, "dilations", dilations);
  const int pad_kind = pick(0, 3);
  if (pad_kind == 0) {
    set_ints(c.node, "pads", pads);
  } else {
    onnx::AttributeProto* a = c.node.add_attribute();
    a->set_name("auto_pad");
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(pad_kind == 1 ? "SAME_UPPER" : pad_kind == 2 ? "SAME_LOWER" : "VALID");
  }
  set_int(c.node, "ceil_mode", pick(0, 1));
  c.include_pad = pick(0, 1) == 1;
  set_int(c.node, "count_include_pad", c.include_pad ? 1 : 0);
  c.column_major = pick(0, 1) == 1;
  set_int(c.node, "storage_order", c.column_major ? 1 : 0);
  set_int(c.node, std::string(grad::kForwardInputsAttr), 1);
  return c;
}

// Runs the CPU backend's kernel for `op` on `in` into `out`.
void run_cpu(std::string_view op, const Attrs& attrs, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out, DeviceContext& device) {
  const KernelArgs args{"case", op, attrs, in, out, device};
  cpu_backend().kernel(op)(args);
}

TEST_CASE("the cuda pooling kernels' elements equal the cpu's pooling on random geometries") {
  std::mt19937 rng(13);
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const PoolCase c = random_case(rng);
    const Attrs attrs(c.node);
    Tensor x = Tensor::owned(DType::kFloat32, c.x_shape);
    for (int64_t i = 0; i < x.numel(); ++i)  // small integers: ties in most windows
      x.as<float>()[i] = static_cast<float>(std::uniform_int_distribution<int>(0, 3)(rng));
    const std::vector<const Tensor*> x_in{&x};
    ops::PoolGeometry g;
    try {
      g = ops::pool_geometry(KernelArgs{"case", "MaxPool", attrs, x_in, {}, *device}, x);
    } catch (const Error&) {
      continue;  // a window over padding alone, or one larger than the padded input
    }
    CAPTURE(c.node.DebugString());
    const cuda::PoolShape s = cuda::pool_shape(g);
    const int64_t outputs = s.planes * s.out_plane(), inputs = s.planes * s.in_plane();

    Tensor y = Tensor::owned(DType::kFloat32, g.out_shape);
    Tensor indices = Tensor::owned(DType::kInt64, g.out_shape);
    run_cpu("MaxPool", attrs, x_in, {&y, &indices}, *device);
    std::vector<int64_t> argmax(outputs);
    for (int64_t e = 0; e < outputs; ++e) {
      int64_t index = -1;
      REQUIRE(cuda::max_pool_element(s, x.as<float>(), e, c.column_major, index) ==
              y.as<float>()[e]);
      REQUIRE(index == indices.as<int64_t>()[e]);
      argmax[e] = cuda::argmax_element(s, x.as<float>(), e);
    }

    Tensor average = Tensor::owned(DType::kFloat32, g.out_shape);
    run_cpu("AveragePool", attrs, x_in, {&average}, *device);
    for (int64_t e = 0; e < outputs; ++e)
      REQUIRE(std::fabs(cuda::average_pool_element(s, x.as<float>(), e, c.include_pad) -
                        average.as<float>()[e]) <= 1e-6f * (1 + std::fabs(average.as<float>()[e])));

    Tensor dy = Tensor::owned(DType::kFloat32, g.out_shape);
    for (int64_t e = 0; e < outputs; ++e)
      dy.as<float>()[e] = std::uniform_real_distribution<float>(-1, 1)(rng);
    Tensor dx = Tensor::owned(DType::kFloat32, c.x_shape);
    run_cpu("MaxPoolGrad", attrs, {&x, &y, &dy}, {&dx}, *device);
    for (int64_t e = 0; e < inputs; ++e)
      REQUIRE(cuda::max_pool_grad_element(s, dy.as<float>(), argmax.data(), e) ==
              dx.as<float>()[e]);
    run_cpu("AveragePoolGrad", attrs, {&x, &average, &dy}, {&dx}, *device);
    for (int64_t e = 0; e < inputs; ++e)
      REQUIRE(cuda::average_pool_grad_element(s, dy.as<float>(), e, c.include_pad) ==
              dx.as<float>()[e]);
    ++checked;
  }
  CHECK(checked >= 200);
}

}  // namespace
}  // namespace stagecraft::rt
