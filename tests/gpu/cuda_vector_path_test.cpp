// The CUDA kernels' 16-byte paths against the CPU backend, bit for bit, beside shapes that take
// the element-by-element path: binary ops on operands of the output's shape (a transformer's
// residual Adds) or repeating a row (its bias Adds) (elementwise_kernels.cu), in float32, both
// 16-bit floats (against the CPU's widened run: the float32 op on the exact operands, rounded to
// nearest even) and int32; and strided moves that keep a whole number of units innermost
// (attention's head transposes; data_kernels.cu) in every width; Conv's bias and ConvGrad's bias
// gradient (conv_kernels.cu: up to 16 bytes a thread where a plane's size allows, the gradient
// over slices of images) against the same sums made here; cuDNN's algorithm choice with and
// without DeviceContext::deterministic (conv_cudnn.cpp): the choice said in the notes, the
// deterministic one bit-identical when rerun, the two within float rounding of each other;
// loss scaling's unscale over many gradients against one call per gradient; Adam
// over many weights in one launch (update_kernels.cu) against a launch per weight.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/format/grad_ops.h"
#include "runtime/optim/optimizer.h"
#include "tests/gpu/table_util.h"
#include "tests/runtime/attention_util.h"

namespace stagecraft::testing {
namespace {

/// The numpy broadcast of two shapes (they broadcast).
rt::Shape broadcast(const rt::Shape& a, const rt::Shape& b) {
  rt::Shape out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = i + a.size() >= out.size() ? a[i + a.size() - out.size()] : 1;
    const int64_t y = i + b.size() >= out.size() ? b[i + b.size() - out.size()] : 1;
    out[i] = std::max(x, y);
  }
  return out;
}

TEST_CASE("cuda binary ops on same-shape and row-repeated operands match the CPU bit for bit") {
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const std::vector<std::pair<rt::Shape, rt::Shape>> shapes = {
      {{3, 1001}, {3, 1001}},      // same shape, a partial last group
      {{64, 256}, {256}},          // a bias row
      {{256}, {64, 256}},          // the row first
      {{2, 3, 4, 8}, {4, 8}},      // a row of 32 over 6 rows
      {{4, 8}, {4, 8}},            // smaller than a block
      {{8, 1, 256}, {8, 5, 256}},  // general path: a middle dim
      {{64, 256}, {64, 1}},        // general path: a column
      {{64, 12}, {12}},            // general path for 16-bit (12 is not 8 lanes), float32's path
  };
  int cases = 0;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt32}) {
    for (const std::string op : {"Add", "Sub", "Mul", "Div", "Max"}) {
      // Max is defined on float32, float64 and integers only (the CPU's check and the CUDA
      // table's refuse 16-bit floats): the 16-bit vector path serves the four arithmetic ops.
      const bool half_type = dtype == DType::kBFloat16 || dtype == DType::kFloat16;
      if (half_type && op == "Max") continue;
      for (const auto& [xs, ys] : shapes) {
        CAPTURE(dtype_name(dtype));
        CAPTURE(op);
        CAPTURE(rt::shape_string(xs));
        CAPTURE(rt::shape_string(ys));
        rt::Tensor x = attention::random(xs, 31 + cases, -50.0f, 50.0f);
        rt::Tensor y = attention::random(ys, 57 + cases, 1.0f, 9.0f);  // no zero divisor
        if (dtype == DType::kInt32) {
          // Whole values: the cast truncates, and a divisor of at least 1 stays non-zero.
          x = attention::cast(x, DType::kInt32);
          y = attention::cast(y, DType::kInt32);
        } else if (dtype != DType::kFloat32) {
          x = attention::cast(x, dtype);
          y = attention::cast(y, dtype);
        }
        onnx::NodeProto n;
        n.set_name(op);
        n.set_op_type(op);
        const rt::Shape out_shape = broadcast(xs, ys);
        rt::Tensor on_cuda = rt::Tensor::owned(dtype, out_shape);
        // The CPU runs 16-bit floats widened: the float32 op on the exactly widened operands,
        // rounded to nearest even, which is the CUDA kernel's formula.
        const bool half = dtype == DType::kBFloat16 || dtype == DType::kFloat16;
        const rt::Tensor xc = half ? attention::cast(x, DType::kFloat32) : x;
        const rt::Tensor yc = half ? attention::cast(y, DType::kFloat32) : y;
        rt::Tensor wide = rt::Tensor::owned(xc.dtype, out_shape);
        attention::run(rt::cpu_backend(), n, {&xc, &yc}, {&wide});
        const rt::Tensor on_cpu = half ? attention::cast(wide, dtype) : wide;
        attention::run(*cuda, n, {&x, &y}, {&on_cuda});
        CHECK(std::memcmp(on_cpu.data, on_cuda.data, static_cast<size_t>(on_cpu.bytes())) == 0);
        ++cases;
      }
    }
  }
  CHECK(cases == 144);  // 5 ops x 8 shapes x 2 dtypes, 4 x 8 x 2 for 16-bit
}

TEST_CASE("cuda transposes in 16-byte units and element by element match the CPU bit for bit") {
  // data_kernels.cu's strided moves take 16 bytes a thread where the innermost dim is kept and
  // whole units long (attention's head transposes); the other perms and shapes go element by
  // element. Copies: every dtype width, the CPU's bytes exactly.
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const std::vector<std::pair<rt::Shape, std::vector<int64_t>>> cases = {
      {{2, 16, 4, 64}, {0, 2, 1, 3}},  // [B, S, H, D] -> [B, H, S, D]
      {{2, 4, 16, 64}, {0, 2, 1, 3}},  // and back
      {{3, 5, 8}, {1, 0, 2}},          // 8 floats: two units
      {{3, 5, 6}, {1, 0, 2}},          // 6: not whole units for 16-bit and float32
      {{4, 6, 10}, {0, 2, 1}},         // the last dim moves: element by element
  };
  int runs = 0;
  for (DType dtype :
       {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt32, DType::kInt64}) {
    for (const auto& [shape, perm] : cases) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(rt::shape_string(shape));
      rt::Tensor x = attention::random(shape, 91 + runs, -100.0f, 100.0f);
      if (dtype != DType::kFloat32) x = attention::cast(x, dtype);
      onnx::NodeProto n;
      n.set_name("transpose");
      n.set_op_type("Transpose");
      onnx::AttributeProto* a = n.add_attribute();
      a->set_name("perm");
      a->set_type(onnx::AttributeProto::INTS);
      rt::Shape out_shape;
      for (int64_t d : perm) {
        a->add_ints(d);
        out_shape.push_back(shape[static_cast<size_t>(d)]);
      }
      rt::Tensor on_cpu = rt::Tensor::owned(dtype, out_shape);
      rt::Tensor on_cuda = rt::Tensor::owned(dtype, out_shape);
      attention::run(rt::cpu_backend(), n, {&x}, {&on_cpu});
      attention::run(*cuda, n, {&x}, {&on_cuda});
      CHECK(std::memcmp(on_cpu.data, on_cuda.data, static_cast<size_t>(on_cpu.bytes())) == 0);
      ++runs;
    }
  }
  CHECK(runs == 25);
}

// `d` rounded to float32 toward zero, its last bit set where that was inexact (round to odd):
// rounding this to a 16-bit float gives the direct rounding of `d` (float32 keeps more than
// twice a 16-bit float's bits and two more), which is the CUDA kernel's rule.
float round_to_odd(double d) {
  float t = static_cast<float>(d);
  if (static_cast<double>(t) == d) return t;
  if (std::fabs(static_cast<double>(t)) > std::fabs(d)) t = std::nextafter(t, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(t) | 1u);
}

onnx::NodeProto conv_node(bool grad) {
  onnx::NodeProto n;
  n.set_name(grad ? "conv_grad" : "conv");
  n.set_op_type(grad ? "ConvGrad" : "Conv");
  onnx::AttributeProto* k = n.add_attribute();
  k->set_name("kernel_shape");
  k->set_type(onnx::AttributeProto::INTS);
  k->add_ints(1);
  k->add_ints(1);
  if (grad) {
    n.set_domain(std::string(grad::kGradDomain));
    onnx::AttributeProto* f = n.add_attribute();
    f->set_name(std::string(grad::kForwardInputsAttr));
    f->set_type(onnx::AttributeProto::INT);
    f->set_i(3);
  }
  return n;
}

TEST_CASE("cuda Conv's bias and ConvGrad's bias gradient match sums made here") {
  // Planes of 64 (16 bytes a thread in 16-bit, a slice of one image each), 196 (8 bytes), 49
  // and 9 (element by element); the weight a 1x1 identity, so cuDNN's Y is X exactly (float32
  // on FMA, 16-bit on the tensor cores multiply by 1 exactly) and only the bias is rounded.
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  const std::vector<rt::Shape> shapes = {
      {64, 16, 8, 8}, {8, 32, 14, 14}, {4, 24, 7, 7}, {3, 5, 3, 3}};
  int runs = 0;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const rt::Shape& shape : shapes) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(rt::shape_string(shape));
      const int64_t n = shape[0], c = shape[1], size = shape[2] * shape[3];
      const auto as_dtype = [&](const rt::Tensor& t) {
        return dtype == DType::kFloat32 ? t : attention::cast(t, dtype);
      };
      const auto widened = [&](const rt::Tensor& t) {
        return dtype == DType::kFloat32 ? t : attention::cast(t, DType::kFloat32);
      };
      const rt::Tensor x = as_dtype(attention::random(shape, 7 + runs, -4.0f, 4.0f));
      const rt::Tensor bias = as_dtype(attention::random({c}, 11 + runs, -2.0f, 2.0f));
      rt::Tensor w32 = rt::Tensor::owned(DType::kFloat32, {c, c, 1, 1});
      std::fill_n(w32.as<float>(), w32.numel(), 0.0f);
      for (int64_t i = 0; i < c; ++i) w32.as<float>()[i * c + i] = 1.0f;
      const rt::Tensor w = as_dtype(w32);

      // Conv: X + bias, added in float32 and rounded once.
      rt::Tensor y = rt::Tensor::owned(dtype, shape);
      attention::run(*cuda, conv_node(false), {&x, &w, &bias}, {&y});
      const rt::Tensor xw = widened(x), bw = widened(bias);
      rt::Tensor want_y = rt::Tensor::owned(DType::kFloat32, shape);
      for (int64_t e = 0; e < want_y.numel(); ++e)
        want_y.as<float>()[e] = xw.as<float>()[e] + bw.as<float>()[(e / size) % c];
      const rt::Tensor want_y_t = as_dtype(want_y);
      CHECK(std::memcmp(y.data, want_y_t.data, static_cast<size_t>(y.bytes())) == 0);

      // ConvGrad's dB: the sum in double over images and positions, rounded once.
      const rt::Tensor dy = as_dtype(attention::random(shape, 13 + runs, -1.0f, 1.0f));
      rt::Tensor db = rt::Tensor::owned(dtype, {c});
      attention::run(*cuda, conv_node(true), {&x, &w, &bias, &y, &dy}, {nullptr, nullptr, &db});
      const rt::Tensor dyw = widened(dy);
      rt::Tensor want_db = rt::Tensor::owned(DType::kFloat32, {c});
      for (int64_t ch = 0; ch < c; ++ch) {
        double sum = 0;
        for (int64_t b = 0; b < n; ++b)
          for (int64_t i = 0; i < size; ++i) sum += dyw.as<float>()[(b * c + ch) * size + i];
        want_db.as<float>()[ch] =
            dtype == DType::kFloat32 ? static_cast<float>(sum) : round_to_odd(sum);
      }
      const rt::Tensor want_db_t = as_dtype(want_db);
      CHECK(std::memcmp(db.data, want_db_t.data, static_cast<size_t>(db.bytes())) == 0);
      ++runs;
    }
  }
  CHECK(runs == 12);
}

// Runs `node` on a fresh CUDA device (deterministic or not, collecting the kernels' notes)
// and returns its outputs on the host and the notes.
std::pair<std::vector<rt::Tensor>, std::string> run_noted(const rt::Backend& cuda,
                                                          const onnx::NodeProto& node,
                                                          const std::vector<const rt::Tensor*>& in,
                                                          const std::vector<rt::Shape>& out_shapes,
                                                          DType dtype, bool deterministic) {
  const rt::Attrs attrs(node);
  auto device = cuda.make_device(0, 1);
  device->deterministic = deterministic;
  std::vector<rt::Tensor> din_store, dout_store;
  din_store.reserve(in.size());
  dout_store.reserve(out_shapes.size());
  std::vector<const rt::Tensor*> din;
  std::vector<rt::Tensor*> dout;
  for (const rt::Tensor* t : in) din.push_back(&din_store.emplace_back(rt::to_device(*device, *t)));
  for (const rt::Shape& shape : out_shapes)
    dout.push_back(&dout_store.emplace_back(device->new_tensor(dtype, shape, true)));
  device->collect_notes = true;
  cuda.kernel(node.op_type())({node.name(), node.op_type(), attrs, din, dout, *device});
  device->collect_notes = false;
  device->synchronize();
  std::vector<rt::Tensor> host;
  for (rt::Tensor* t : dout) host.push_back(rt::to_host(*device, *t));
  return {host, device->notes};
}

TEST_CASE("cuda convolutions: cuDNN's choice is noted, deterministic reruns are bit-identical") {
  // ResNet-like 3x3 convolutions (stride 1 pad 1, and stride 2), float32 and bfloat16.
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  int compared = 0;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int stride : {1, 2}) {
      CAPTURE(dtype_name(dtype));
      CAPTURE(stride);
      const rt::Shape x_shape{16, 32, 14, 14}, w_shape{64, 32, 3, 3};
      const int64_t out = (14 + 2 - 3) / stride + 1;
      const rt::Shape y_shape{16, 64, out, out};
      const auto as_dtype = [&](const rt::Tensor& t) {
        return dtype == DType::kFloat32 ? t : attention::cast(t, dtype);
      };
      const auto widened = [&](const rt::Tensor& t) {
        return dtype == DType::kFloat32 ? t : attention::cast(t, DType::kFloat32);
      };
      const rt::Tensor x = as_dtype(attention::random(x_shape, 31 + stride));
      const rt::Tensor w = as_dtype(attention::random(w_shape, 37 + stride, -0.2f, 0.2f));
      const rt::Tensor dy = as_dtype(attention::random(y_shape, 41 + stride));
      onnx::NodeProto fwd;
      fwd.set_name("conv");
      fwd.set_op_type("Conv");
      rt::gpu_test::set_ints(fwd, "kernel_shape", {3, 3});
      rt::gpu_test::set_ints(fwd, "pads", {1, 1, 1, 1});
      rt::gpu_test::set_ints(fwd, "strides", {stride, stride});
      onnx::NodeProto bwd = fwd;
      bwd.set_name("conv_grad");
      bwd.set_op_type("ConvGrad");
      bwd.set_domain(std::string(grad::kGradDomain));
      rt::gpu_test::set_int(bwd, std::string(grad::kForwardInputsAttr), 2);
      const rt::Tensor y_unused = rt::Tensor::owned(dtype, y_shape);
      std::vector<std::vector<rt::Tensor>> results;
      for (int run = 0; run < 3; ++run) {  // deterministic twice, then cuDNN's fastest
        const bool deterministic = run < 2;
        auto [y, fwd_note] = run_noted(*cuda, fwd, {&x, &w}, {y_shape}, dtype, deterministic);
        auto [grads, bwd_note] = run_noted(*cuda, bwd, {&x, &w, &y_unused, &dy}, {x_shape, w_shape},
                                           dtype, deterministic);
        CAPTURE(fwd_note);
        CAPTURE(bwd_note);
        CHECK(fwd_note.find("forward ") == 0);
        CHECK(fwd_note.find("MiB workspace") != std::string::npos);
        CHECK(bwd_note.find("input gradient ") != std::string::npos);
        CHECK(bwd_note.find("weight gradient ") != std::string::npos);
        if (deterministic) CHECK(bwd_note.find("atomics") == std::string::npos);
        results.push_back({y[0], grads[0], grads[1]});
      }
      for (size_t k = 0; k < 3; ++k) {
        CAPTURE(k);
        // Deterministic: the same bytes again.
        CHECK(std::memcmp(results[0][k].data, results[1][k].data,
                          static_cast<size_t>(results[0][k].bytes())) == 0);
        // The fastest algorithm: the same sums in another order.
        const rt::Tensor want = widened(results[0][k]);
        std::vector<double> reference(want.as<float>(), want.as<float>() + want.numel());
        attention::check_close(widened(results[2][k]), reference,
                               dtype == DType::kFloat32 ? 1e-4 : 2e-2, "fastest vs deterministic");
        ++compared;
      }
    }
  }
  CHECK(compared == 12);
}

TEST_CASE("cuda unscale over many gradients: one flag read, the bytes of one call per tensor") {
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  auto device = cuda->make_device(0, 1);
  for (bool with_inf : {false, true}) {
    CAPTURE(with_inf);
    std::vector<rt::Tensor> host;
    for (int64_t n : {1, 1000, 70000}) host.push_back(attention::random({n}, 50 + n, -1e3f, 1e3f));
    if (with_inf) host[1].as<float>()[17] = std::numeric_limits<float>::infinity();
    std::vector<rt::Tensor> one, many;
    for (const rt::Tensor& t : host) {
      one.push_back(rt::to_device(*device, t));
      many.push_back(rt::to_device(*device, t));
    }
    bool finite_one = true;
    for (rt::Tensor& t : one) finite_one &= device->unscale(t, 1.0f / 1024);
    std::vector<rt::Tensor*> pointers;
    for (rt::Tensor& t : many) pointers.push_back(&t);
    const bool finite_many = device->unscale_many(pointers.data(), pointers.size(), 1.0f / 1024);
    CHECK(finite_one == !with_inf);
    CHECK(finite_many == finite_one);
    for (size_t k = 0; k < host.size(); ++k) {
      const rt::Tensor a = rt::to_host(*device, one[k]), b = rt::to_host(*device, many[k]);
      CHECK(std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())) == 0);
    }
  }
}

TEST_CASE("cuda Adam over many weights at once leaves the bytes of a launch per weight") {
  // 70 weights (two launches of up to 64), one empty, one of several 4096-element blocks;
  // AdamW with decay; three updates. step_many zeroes the gradients as it goes.
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  auto device = cuda->make_device(0, 1);
  rt::optim::OptimizerConfig c;
  c.kind = parse_optimizer("adamw");
  c.lr = 0.01f;
  c.weight_decay = 0.1f;
  auto opt = rt::optim::Optimizer::make(c);
  std::vector<int64_t> sizes;
  for (int k = 0; k < 70; ++k) sizes.push_back(k == 3 ? 0 : k == 5 ? 9000 : 1 + 37 * k);
  std::vector<rt::Tensor> one_w, many_w, many_g;
  std::vector<rt::optim::OptimizerState> one_state(sizes.size()), many_state(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    const rt::Tensor w = attention::random({sizes[k]}, 200 + static_cast<unsigned>(k));
    one_w.push_back(rt::to_device(*device, w));
    many_w.push_back(rt::to_device(*device, w));
  }
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<rt::optim::Optimizer::WeightStep> steps;
    many_g.clear();
    many_g.reserve(sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) {
      const rt::Tensor g =
          attention::random({sizes[k]}, 300 + static_cast<unsigned>(k * 7 + step), -2.0f, 2.0f);
      opt->step(*device, one_w[k], rt::to_device(*device, g), one_state[k], c.lr, step);
      many_g.push_back(rt::to_device(*device, g));
    }
    for (size_t k = 0; k < sizes.size(); ++k)
      steps.push_back({&many_w[k], &many_g[k], &many_state[k]});
    opt->step_many(*device, steps, c.lr, step);
    device->synchronize();
    for (size_t k = 0; k < sizes.size(); ++k) {
      CAPTURE(k);
      const rt::Tensor a = rt::to_host(*device, one_w[k]), b = rt::to_host(*device, many_w[k]);
      CHECK(std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())) == 0);
      const rt::Tensor g = rt::to_host(*device, many_g[k]);
      CHECK(std::all_of(g.as<float>(), g.as<float>() + g.numel(), [](float x) { return x == 0; }));
      for (const std::string name : {"m", "v"}) {
        const rt::Tensor sa = rt::to_host(*device, one_state[k].at(name)),
                         sb = rt::to_host(*device, many_state[k].at(name));
        CHECK(std::memcmp(sa.data, sb.data, static_cast<size_t>(sa.bytes())) == 0);
      }
    }
  }
}

}  // namespace
}  // namespace stagecraft::testing
