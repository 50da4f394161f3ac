// The CUDA kernels' 16-byte paths against the CPU backend, bit for bit, beside shapes that take
// the element-by-element path: binary ops on operands of the output's shape (a transformer's
// residual Adds) or repeating a row (its bias Adds) (elementwise_kernels.cu), in float32, both
// 16-bit floats (against the CPU's widened run: the float32 op on the exact operands, rounded to
// nearest even) and int32; and strided moves that keep a whole number of units innermost
// (attention's head transposes; data_kernels.cu) in every width.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/backend.h"
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

}  // namespace
}  // namespace stagecraft::testing
