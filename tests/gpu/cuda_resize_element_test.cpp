// Resize's per-element arithmetic (runtime/ops/resize_element.h), which the CPU backend and
// the CUDA kernels both run, checked on the host without a GPU on random shapes, modes,
// coordinate modes, roundings, scales and sizes:
// - the CPU backend's Resize against an independent transcription of ONNX's reference
//   (onnx/backend/test/case/node/resize.py: dim by dim, the neighbours picked from the input
//   padded with its edge, the nearest and linear coefficients), in double;
// - ResizeGrad as the adjoint of Resize: <dX, X'> = <dY, Resize(X')> for random X' and dY;
// - the tables laid out as the CUDA backend uploads them (one int64 array, one float array,
//   copied) give the CPU's results bit for bit.
#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/resize_shape.h"

namespace stagecraft::rt {
namespace {

int pick(std::mt19937& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

void set_string(onnx::NodeProto& node, const std::string& name, const std::string& value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(value);
}

void set_int(onnx::NodeProto& node, const std::string& name, int64_t value) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void run_cpu(std::string_view op, const Attrs& attrs, const std::vector<const Tensor*>& in,
             const std::vector<Tensor*>& out, DeviceContext& device) {
  cpu_backend().kernel(op)(KernelArgs{"case", op, attrs, in, out, device});
}

Tensor random_floats(std::mt19937& rng, const Shape& shape) {
  Tensor t = Tensor::owned(DType::kFloat32, shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.as<float>()[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
  return t;
}

struct ResizeCase {
  onnx::NodeProto node;
  std::string mode, coordinates, rounding;
  Shape x_shape;
  bool by_sizes = false;
  std::vector<float> scales;
  std::vector<int64_t> sizes;
};

ResizeCase random_case(std::mt19937& rng) {
  ResizeCase c;
  const char* modes[] = {"nearest", "linear"};
  const char* coordinates[] = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                               "tf_half_pixel_for_nn"};
  const char* roundings[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  c.mode = modes[pick(rng, 0, 1)];
  c.coordinates = coordinates[pick(rng, 0, 4)];
  c.rounding = roundings[pick(rng, 0, 3)];
  set_string(c.node, "mode", c.mode);
  set_string(c.node, "coordinate_transformation_mode", c.coordinates);
  set_string(c.node, "nearest_mode", c.rounding);
  const int rank = pick(rng, 1, 4);
  c.by_sizes = pick(rng, 0, 1) == 1;
  // Scales that float holds exactly, from shrinking by 4 to growing by 4.
  const float scales[] = {0.25f, 0.5f, 0.75f, 1.0f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f, 4.0f};
  for (int d = 0; d < rank; ++d) {
    c.x_shape.push_back(pick(rng, 1, 6));
    c.scales.push_back(scales[pick(rng, 0, 9)]);
    c.sizes.push_back(pick(rng, 1, 9));
  }
  return c;
}

// ONNX's reference for one dim: the coefficients and the (edge-padded, so clamped) neighbours
// of output index o, transcribed from resize.py with the coordinate in long double.
struct Neighbours {
  int64_t index[2];
  double coefficient[2];
};

Neighbours reference_neighbours(const ResizeCase& c, int64_t o, int64_t length, long double num,
                                long double den, long double resized) {
  const long double x = static_cast<long double>(o);
  long double x_ori = 0;
  if (c.coordinates == "half_pixel") x_ori = (x + 0.5L) * den / num - 0.5L;
  if (c.coordinates == "pytorch_half_pixel")
    x_ori = resized == 1 ? -0.5L : (x + 0.5L) * den / num - 0.5L;
  if (c.coordinates == "align_corners")
    x_ori = resized == 1 ? 0.0L : x * static_cast<long double>(length - 1) / (resized - 1);
  if (c.coordinates == "asymmetric") x_ori = x * den / num;
  if (c.coordinates == "tf_half_pixel_for_nn") x_ori = (x + 0.5L) * den / num;
  const long double x_int = std::floor(x_ori);
  const bool integer = x_ori == x_int;
  const double ratio = integer ? 1.0 : static_cast<double>(x_ori - x_int);
  Neighbours n{};
  if (c.mode == "linear") {
    n.coefficient[0] = 1 - ratio;
    n.coefficient[1] = ratio;
  } else if (integer) {
    n.coefficient[0] = 0;
    n.coefficient[1] = 1;
  } else {
    bool up = false;
    if (c.rounding == "round_prefer_floor") up = ratio > 0.5;
    if (c.rounding == "round_prefer_ceil") up = ratio >= 0.5;
    if (c.rounding == "ceil") up = true;
    n.coefficient[0] = up ? 0 : 1;
    n.coefficient[1] = up ? 1 : 0;
  }
  // get_neighbor: the 2 nearest indices of the input padded by one edge element each side,
  // ties to the smaller, in ascending order; back to the input's indices (the pads are edges).
  std::vector<int64_t> padded(static_cast<size_t>(length + 2));
  for (int64_t p = 0; p < length + 2; ++p) padded[p] = p;
  const long double target = x_ori + 1;
  std::stable_sort(padded.begin(), padded.end(), [&](int64_t a, int64_t b) {
    return std::fabs(target - a) < std::fabs(target - b);
  });
  std::sort(padded.begin(), padded.begin() + 2);
  for (int t = 0; t < 2; ++t) n.index[t] = std::clamp<int64_t>(padded[t] - 1, 0, length - 1);
  return n;
}

// The reference Resize of `x`: per dim the neighbours, then the nested interpolation.
std::vector<double> reference_resize(const ResizeCase& c, const Tensor& x, const Shape& y_shape) {
  const size_t rank = x.shape.size();
  std::vector<std::vector<Neighbours>> per_dim(rank);
  for (size_t d = 0; d < rank; ++d) {
    const long double num = c.by_sizes ? c.sizes[d] : c.scales[d];
    const long double den = c.by_sizes ? x.shape[d] : 1;
    const long double resized = c.by_sizes ? c.sizes[d] : x.shape[d] * num;
    for (int64_t o = 0; o < y_shape[d]; ++o)
      per_dim[d].push_back(reference_neighbours(c, o, x.shape[d], num, den, resized));
  }
  const std::vector<int64_t> strides = ops::dense_strides(x.shape);
  std::vector<double> y(static_cast<size_t>(shape_numel(y_shape)));
  std::vector<int64_t> coords(rank);
  for (int64_t e = 0; e < static_cast<int64_t>(y.size()); ++e) {
    int64_t rest = e;
    for (size_t d = rank; d-- > 0;) {
      coords[d] = rest % y_shape[d];
      rest /= y_shape[d];
    }
    auto interpolate = [&](auto&& self, size_t d, int64_t base) -> double {
      if (d == rank) return x.as<float>()[base];
      const Neighbours& n = per_dim[d][coords[d]];
      double sum = 0;
      for (int t = 0; t < 2; ++t)
        if (n.coefficient[t] != 0)
          sum += n.coefficient[t] * self(self, d + 1, base + n.index[t] * strides[d]);
      return sum;
    };
    y[e] = interpolate(interpolate, 0, 0);
  }
  return y;
}

TEST_CASE("resize: the cpu kernels against ONNX's reference, their adjoint, and the cuda tables") {
  std::mt19937 rng(15);
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  int checked = 0, linear = 0, nearest = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const ResizeCase c = random_case(rng);
    const Attrs attrs(c.node);
    const Tensor x = random_floats(rng, c.x_shape);
    Tensor scales = Tensor::owned(DType::kFloat32, {static_cast<int64_t>(c.scales.size())});
    std::copy(c.scales.begin(), c.scales.end(), scales.as<float>());
    Tensor sizes = Tensor::owned(DType::kInt64, {static_cast<int64_t>(c.sizes.size())});
    std::copy(c.sizes.begin(), c.sizes.end(), sizes.as<int64_t>());
    const Tensor empty = Tensor::owned(DType::kFloat32, {0});
    // Opset 13 with sizes: X, "", "", sizes; with scales as opset 11 writes them: X, roi, scales.
    const std::vector<const Tensor*> in =
        c.by_sizes ? std::vector<const Tensor*>{&x, nullptr, nullptr, &sizes}
                   : std::vector<const Tensor*>{&x, &empty, &scales};
    const ops::ResizeGeometry g =
        ops::resize_geometry(KernelArgs{"case", "Resize", attrs, in, {}, *device}, x.shape,
                             c.by_sizes ? nullptr : &scales, c.by_sizes ? &sizes : nullptr);
    if (shape_numel(g.y_shape) == 0) continue;
    CAPTURE(c.node.DebugString());
    CAPTURE(shape_string(x.shape));
    CAPTURE(shape_string(g.y_shape));
    Tensor y = Tensor::owned(DType::kFloat32, g.y_shape);
    run_cpu("Resize", attrs, in, {&y}, *device);

    const std::vector<double> want = reference_resize(c, x, g.y_shape);
    for (int64_t e = 0; e < y.numel(); ++e) {
      CAPTURE(e);
      REQUIRE(std::fabs(y.as<float>()[e] - want[e]) <= 1e-5);
    }

    // The gradient at a random dY, and the adjoint identity with a second input X'.
    onnx::NodeProto grad_node = c.node;
    set_int(grad_node, std::string(grad::kForwardInputsAttr), static_cast<int64_t>(in.size()));
    const Attrs grad_attrs(grad_node);
    const Tensor dy = random_floats(rng, g.y_shape);
    Tensor dx = Tensor::owned(DType::kFloat32, x.shape);
    std::vector<const Tensor*> grad_in = in;
    grad_in.push_back(&y);
    grad_in.push_back(&dy);
    std::vector<Tensor*> grad_out(in.size(), nullptr);
    grad_out[0] = &dx;
    run_cpu("ResizeGrad", grad_attrs, grad_in, grad_out, *device);
    double lhs = 0, rhs = 0, scale = 0;
    for (int64_t i = 0; i < x.numel(); ++i) lhs += double{dx.as<float>()[i]} * x.as<float>()[i];
    for (int64_t e = 0; e < y.numel(); ++e) {
      rhs += double{dy.as<float>()[e]} * y.as<float>()[e];
      scale += std::fabs(double{dy.as<float>()[e]} * y.as<float>()[e]);
    }
    REQUIRE(std::fabs(lhs - rhs) <= 1e-5 * std::max(1.0, scale));

    // The CUDA backend's uploads: the same tables, copied, give the same bits.
    for (const bool gradient : {false, true}) {
      const ops::SeparableTableData data =
          gradient ? ops::resize_gradient_tables(g) : ops::resize_forward_tables(g);
      const std::vector<int64_t> ints = data.ints;
      const std::vector<float> floats = data.floats;
      const ops::SeparableTable table = data.at(ints.data(), floats.data());
      const Tensor& source = gradient ? dy : x;
      const Tensor& result = gradient ? dx : y;
      for (int64_t e = 0; e < result.numel(); ++e) {
        const float got = ops::separable_sum(table, source.as<float>(), e);
        REQUIRE(std::memcmp(&got, result.as<float>() + e, sizeof got) == 0);
      }
    }
    (c.mode == "linear" ? linear : nearest) += 1;
    ++checked;
  }
  CHECK(checked >= 350);
  CHECK(linear >= 150);
  CHECK(nearest >= 150);
}

TEST_CASE("resize: a size of 4 from 6 maps output 2 to input 3 (the scale kept as a ratio)") {
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  onnx::NodeProto node;
  set_string(node, "mode", "nearest");
  set_string(node, "coordinate_transformation_mode", "asymmetric");
  set_string(node, "nearest_mode", "floor");
  const Attrs attrs(node);
  Tensor x = Tensor::owned(DType::kFloat32, {6});
  for (int i = 0; i < 6; ++i) x.as<float>()[i] = static_cast<float>(i);
  Tensor sizes = Tensor::owned(DType::kInt64, {1});
  sizes.as<int64_t>()[0] = 4;
  Tensor y = Tensor::owned(DType::kFloat32, {4});
  run_cpu("Resize", attrs, {&x, nullptr, nullptr, &sizes}, {&y}, *device);
  // torch's nearest: floor(o * 6 / 4) = 0, 1, 3, 4.
  const float want[] = {0, 1, 3, 4};
  for (int o = 0; o < 4; ++o) CHECK(y.as<float>()[o] == want[o]);
}

TEST_CASE("resize: one-line refusals naming the node and the values") {
  std::unique_ptr<DeviceContext> device = cpu_backend().make_device(0, 1);
  onnx::NodeProto node;
  const Attrs attrs(node);
  const Tensor x = Tensor::owned(DType::kFloat32, {1, 2, 3, 3});
  Tensor scales = Tensor::owned(DType::kFloat32, {3});
  Tensor sizes = Tensor::owned(DType::kInt64, {4});
  auto message = [&](std::vector<const Tensor*> in) {
    try {
      ops::resize_geometry(KernelArgs{"up", "Resize", attrs, in, {}, *device}, x.shape,
                           in.size() > 2 ? in[2] : nullptr, in.size() > 3 ? in[3] : nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(message({&x, nullptr, &scales}) == "Resize 'up': 3 scales for a rank-4 input [1, 2, 3, 3]");
  CHECK(message({&x, nullptr, nullptr, &sizes}) ==
        "Resize 'up': size 0 of dim 0 (input [1, 2, 3, 3]) must be positive");
  CHECK(message({&x, nullptr, nullptr, nullptr}) ==
        "Resize 'up' needs exactly one of scales and sizes; it has neither");
  const std::vector<int64_t> four = {1, 2, 6, 6};
  std::copy(four.begin(), four.end(), sizes.as<int64_t>());
  Tensor good_scales = Tensor::owned(DType::kFloat32, {4});
  CHECK(message({&x, nullptr, &good_scales, &sizes}) ==
        "Resize 'up' needs exactly one of scales and sizes; it has both");
  CHECK(message({&x, nullptr, nullptr, &sizes}) == "accepted");
}

TEST_CASE("resize: the backends' checks accept what torch writes and refuse the rest alike") {
  onnx::NodeProto plain, cubic, crop, grad_node;
  set_string(cubic, "mode", "cubic");
  set_string(crop, "coordinate_transformation_mode", "tf_crop_and_resize");
  set_int(grad_node, std::string(grad::kForwardInputsAttr), 4);
  const Attrs none(plain), cubic_attrs(cubic), crop_attrs(crop), grad_attrs(grad_node);
  const DType f32 = DType::kFloat32, f64 = DType::kFloat64, i64 = DType::kInt64,
              absent = DType::kUndefined;
  struct Case {
    std::vector<DType> in, out;
    const Attrs* attrs;
    std::string op, why;  // "" where accepted
  };
  const std::vector<Case> cases = {
      {{f32, absent, f32}, {f32}, &none, "Resize", ""},
      {{f32, absent, absent, i64}, {f32}, &none, "Resize", ""},
      {{f32, f32, f32}, {f32}, &none, "Resize", ""},
      {{f32, f32, f32, i64}, {f32}, &none, "Resize", ""},
      {{f32, absent, absent, i64, f32, f32},
       {f32, absent, absent, absent},
       &grad_attrs,
       "ResizeGrad",
       ""},
      {{f32, f32},
       {f32},
       &none,
       "Resize",
       "Resize with 2 inputs (opset 10's X and scales) is not supported; export at opset 11 or "
       "later"},
      {{f64, absent, f32},
       {f64},
       &none,
       "Resize",
       "Resize from float64 to float64 is not supported (float32 only)"},
      {{f32, absent, i64}, {f32}, &none, "Resize", "Resize's scales are int64, expected float32"},
      {{f32, absent, f32}, {f32}, &cubic_attrs, "Resize", ""},
      {{f32, absent, f32},
       {f32},
       &crop_attrs,
       "Resize",
       "Resize coordinate_transformation_mode 'tf_crop_and_resize' is not supported (half_pixel, "
       "pytorch_half_pixel, align_corners, asymmetric, tf_half_pixel_for_nn)"},
      {{f32, absent, absent, i64, f32, f32},
       {f32, absent, absent, i64},
       &grad_attrs,
       "ResizeGrad",
       "ResizeGrad gives no gradient of roi, scales or sizes"},
  };
  const Backend* cuda = cuda_backend();
  for (const Case& c : cases) {
    CAPTURE(c.op);
    CAPTURE(c.why);
    const OpSignature signature{c.op, c.in, c.out, *c.attrs};
    CHECK(cpu_backend().check(signature) == c.why);
    if (cuda != nullptr) CHECK(cuda->check(signature) == c.why);
  }
}

}  // namespace
}  // namespace stagecraft::rt
