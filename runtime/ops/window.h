#pragma once
/// \file
/// What sliding-window ops (Conv, MaxPool, AveragePool and their gradients) share:
/// per-spatial-dim attributes, ONNX's padding rules (explicit pads or auto_pad) and the Conv
/// and pooling geometries, read alike by the CPU kernels (runtime/cpu/conv.cpp, pool.cpp,
/// grad_conv.cpp) and the CUDA ones (runtime/cuda/conv.cpp, grad_conv.cpp).

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::ops {

/// The attribute `name` with one value per spatial dim (`count` values), or `fallback` for
/// every dim when absent.
inline std::vector<int64_t> per_dim(const KernelArgs& a, std::string_view name, size_t count,
                                    int64_t fallback) {
  std::vector<int64_t> v = a.attrs.ints(name);
  if (v.empty()) return std::vector<int64_t>(count, fallback);
  if (v.size() != count)
    fail(ErrorKind::kModel, "{} attribute '{}' has {} values, the input has {} spatial dims",
         a.op_type, name, v.size(), count);
  return v;
}

/// The padding (before, after) of one spatial dim of `in` positions for a window spanning
/// `reach` positions at `stride`: the explicit `begin`/`end` under auto_pad NOTSET, none under
/// VALID, and under SAME_UPPER / SAME_LOWER enough for ceil(in / stride) outputs, the odd one
/// after (UPPER) or before (LOWER).
inline std::pair<int64_t, int64_t> resolve_padding(const KernelArgs& a, const std::string& auto_pad,
                                                   int64_t in, int64_t stride, int64_t reach,
                                                   int64_t begin, int64_t end) {
  if (auto_pad == "VALID") {
    begin = end = 0;
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    const int64_t total =
        std::max<int64_t>(0, ((in + stride - 1) / stride - 1) * stride + reach - in);
    begin = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
    end = total - begin;
  } else if (auto_pad != "NOTSET") {
    fail(ErrorKind::kModel, "{} auto_pad '{}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID",
         a.op_type, auto_pad);
  }
  if (begin < 0 || end < 0)
    fail(ErrorKind::kUnsupported, "{} with negative pads is not supported", a.op_type);
  return {begin, end};
}

/// One Conv node (ONNX semantics) resolved into oneDNN's terms (its `memory::dims` is a
/// std::vector<int64_t>, so the CPU kernels pass these as they are); shared by Conv and ConvGrad.
struct ConvGeometry {
  using Dims = std::vector<int64_t>;
  Dims src, weights, dst;  ///< weights are [group, M/group, C/group, k...] when grouped
  int64_t bias = 0;        ///< Bias values; set by the forward when it has a bias input.
  Dims strides, dilates;   ///< dilates as oneDNN counts them: 0 is a dense kernel
  Dims pad_l, pad_r;
};

/// Resolves a Conv's input X, weights W and attributes (groups, kernel_shape, strides,
/// dilations, pads or auto_pad) into the geometry; messages name `a.op_type`. The caller checks
/// its own output (Conv: Y; ConvGrad: dY) against `dst`.
inline ConvGeometry conv_geometry(const KernelArgs& a, const Tensor& x, const Tensor& w) {
  if (x.rank() < 3 || x.rank() > 5)
    fail(ErrorKind::kUnsupported,
         "{} on a rank-{} input is not supported (1-D to 3-D convolutions only)", a.op_type,
         x.rank());
  if (w.rank() != x.rank())
    fail(ErrorKind::kModel, "{} weights {} do not match the input {}", a.op_type,
         shape_string(w.shape), shape_string(x.shape));
  const size_t spatial = static_cast<size_t>(x.rank() - 2);
  const int64_t n = x.shape[0], c = x.shape[1], m = w.shape[0];
  const int64_t group = a.attrs.i("group", 1);
  if (group < 1 || c % group != 0 || m % group != 0 || w.shape[1] * group != c)
    fail(ErrorKind::kModel, "{} with group {} cannot take input {} and weights {}", a.op_type,
         group, shape_string(x.shape), shape_string(w.shape));
  const std::vector<int64_t> kernel(w.shape.begin() + 2, w.shape.end());
  if (a.attrs.has("kernel_shape") && a.attrs.ints("kernel_shape") != kernel)
    fail(ErrorKind::kModel, "{} kernel_shape does not match the weights {}", a.op_type,
         shape_string(w.shape));
  const std::vector<int64_t> strides = per_dim(a, "strides", spatial, 1);
  const std::vector<int64_t> dilations = per_dim(a, "dilations", spatial, 1);
  const std::vector<int64_t> pads = per_dim(a, "pads", 2 * spatial, 0);
  const std::string auto_pad = a.attrs.s("auto_pad", "NOTSET");

  ConvGeometry g;
  g.src = x.shape;
  g.dst = {n, m};
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t in = x.shape[2 + i], s = strides[i], d = dilations[i];
    if (s < 1 || d < 1 || kernel[i] < 1)
      fail(ErrorKind::kModel, "{} strides, dilations and kernel must be positive", a.op_type);
    const int64_t reach = (kernel[i] - 1) * d + 1;  // the span of one window
    const auto [begin, end] =
        resolve_padding(a, auto_pad, in, s, reach, pads[i], pads[spatial + i]);
    if (in + begin + end < reach)
      fail(ErrorKind::kShape, "{} window {} is larger than the padded input", a.op_type, reach);
    g.dst.push_back((in + begin + end - reach) / s + 1);
    g.strides.push_back(s);
    g.dilates.push_back(d - 1);
    g.pad_l.push_back(begin);
    g.pad_r.push_back(end);
  }
  g.weights = w.shape;
  if (group > 1) {
    g.weights[0] = m / group;
    g.weights.insert(g.weights.begin(), group);
  }
  return g;
}

/// Conv's geometry with its output Y checked against `dst` and its optional bias B (input 2)
/// against [M]: where every backend's Conv kernel starts.
inline ConvGeometry conv_forward_geometry(const KernelArgs& a) {
  ConvGeometry g = conv_geometry(a, a.input(0), a.input(1));
  expect_shape(a, 0, Shape(g.dst.begin(), g.dst.end()));
  if (a.has_input(2)) {
    const int64_t m = a.input(1).shape[0];
    const Tensor& b = a.input(2);
    if (b.shape != Shape{m})
      fail(ErrorKind::kModel, "Conv bias {} should be [{}]", shape_string(b.shape), m);
    g.bias = m;
  }
  return g;
}

/// ConvGrad's geometry: Conv's for X and W, with dY checked to have the forward output's shape.
inline ConvGeometry conv_grad_geometry(const KernelArgs& a, const Tensor& x, const Tensor& w,
                                       const Tensor& dy) {
  ConvGeometry g = conv_geometry(a, x, w);
  if (dy.shape != Shape(g.dst.begin(), g.dst.end()))
    fail(ErrorKind::kShape, "ConvGrad: dY {} should be {}", dy.describe(),
         shape_string(Shape(g.dst.begin(), g.dst.end())));
  return g;
}

/// Checks the ConvGrad outputs a node names (outputs 0, 1, 2: dX, dW, dB) against X, W and the
/// bias B, which must be given, and be [M], where dB is wanted.
inline void check_conv_grad_outputs(const KernelArgs& a, const Tensor& x, const Tensor& w,
                                    const Tensor* bias, bool want_dx, bool want_dw, bool want_db) {
  if (want_dx) expect_shape(a, 0, x.shape);
  if (want_dw) expect_shape(a, 1, w.shape);
  if (want_db) {
    if (bias == nullptr) fail(ErrorKind::kModel, "ConvGrad: a bias gradient without a bias input");
    expect_shape(a, 2, bias->shape);
    if (bias->shape != Shape{w.shape[0]})
      fail(ErrorKind::kModel, "ConvGrad bias {} should be [{}]", bias->describe(), w.shape[0]);
  }
}

/// One pooling node resolved. Spatial sizes are front-filled to three dims (depth, height,
/// width) with size-one dims, so one loop nest serves 1-D to 3-D pooling.
struct PoolGeometry {
  int64_t planes = 0;  // N * C
  size_t spatial = 0;  // 1 to 3
  Shape out_shape;
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, kernel{1, 1, 1}, stride{1, 1, 1},
      dilation{1, 1, 1};
  std::array<int64_t, 3> pad_l{0, 0, 0}, pad_r{0, 0, 0};  // pad_r without the ceil_mode extension
  bool ceil_extends = false;  // some window reaches past the right padding (ceil_mode)

  int64_t in_plane() const { return in[0] * in[1] * in[2]; }
  int64_t out_plane() const { return out[0] * out[1] * out[2]; }
  // The right padding that makes exactly `out` windows, which ceil_mode may make larger than pad_r.
  int64_t reached_pad_r(size_t d) const {
    return std::max(
        pad_r[d], (out[d] - 1) * stride[d] + (kernel[d] - 1) * dilation[d] + 1 - in[d] - pad_l[d]);
  }
};

/// Output position `o`'s window along dim `d`: the input position of kernel index 0, the kernel
/// indices [first, last) that land inside the input, and how many land inside the padded input.
struct Window {
  int64_t start, first, last, padded;
};

inline Window window(const PoolGeometry& g, size_t d, int64_t o) {
  const int64_t start = o * g.stride[d] - g.pad_l[d], step = g.dilation[d], k = g.kernel[d];
  // Index j lies at start + j * step; count the j below a bound.
  auto below = [&](int64_t bound) {
    return std::clamp<int64_t>((bound - start + step - 1) / step, 0, k);
  };
  const int64_t first = start >= 0 ? 0 : std::min(k, (-start + step - 1) / step);
  return {start, first, std::max(first, below(g.in[d])), below(g.in[d] + g.pad_r[d])};
}

/// Resolves a pooling node's input X and attributes (ONNX MaxPool and AveragePool semantics up
/// to opset 17); messages name `a.op_type`. The caller checks its outputs against `out_shape`.
inline PoolGeometry pool_geometry(const KernelArgs& a, const Tensor& x) {
  if (x.rank() < 3 || x.rank() > 5)
    fail(ErrorKind::kUnsupported,
         "{} on a rank-{} input is not supported (1-D to 3-D pooling only)", a.op_type, x.rank());
  PoolGeometry g;
  g.spatial = static_cast<size_t>(x.rank() - 2);
  g.planes = x.shape[0] * x.shape[1];
  g.out_shape = {x.shape[0], x.shape[1]};
  const std::vector<int64_t> kernel = a.attrs.ints("kernel_shape");
  if (kernel.size() != g.spatial)
    fail(ErrorKind::kModel, "{} kernel_shape has {} values, the input has {} spatial dims",
         a.op_type, kernel.size(), g.spatial);
  const std::vector<int64_t> strides = per_dim(a, "strides", g.spatial, 1);
  const std::vector<int64_t> dilations = per_dim(a, "dilations", g.spatial, 1);
  const std::vector<int64_t> pads = per_dim(a, "pads", 2 * g.spatial, 0);
  const std::string auto_pad = a.attrs.s("auto_pad", "NOTSET");
  const bool ceil_mode = a.attrs.i("ceil_mode", 0) != 0;
  for (size_t i = 0; i < g.spatial; ++i) {
    const size_t d = 3 - g.spatial + i;
    const int64_t in = x.shape[2 + i], k = kernel[i], s = strides[i], step = dilations[i];
    if (k < 1 || s < 1 || step < 1)
      fail(ErrorKind::kModel, "{} kernel_shape, strides and dilations must be positive", a.op_type);
    const int64_t reach = (k - 1) * step + 1;  // the span of one window
    const auto [begin, end] =
        resolve_padding(a, auto_pad, in, s, reach, pads[i], pads[g.spatial + i]);
    const int64_t positions = in + begin + end - reach;
    if (positions < 0)
      fail(ErrorKind::kShape, "{} window {} is larger than the padded input", a.op_type, reach);
    g.in[d] = in;
    g.out[d] = (ceil_mode ? (positions + s - 1) / s : positions / s) + 1;
    g.kernel[d] = k;
    g.stride[d] = s;
    g.dilation[d] = step;
    g.pad_l[d] = begin;
    g.pad_r[d] = end;
    g.out_shape.push_back(g.out[d]);
    g.ceil_extends |= g.reached_pad_r(d) > end;
    // A window over padding alone has no value (ONNX opset 19 drops such ceil_mode windows).
    for (int64_t o = 0; o < g.out[d]; ++o)
      if (const Window w = window(g, d, o); w.first >= w.last)
        fail(ErrorKind::kUnsupported, "{} window {} of spatial dim {} covers only padding",
             a.op_type, o, i);
  }
  return g;
}

/// A pooling node's geometry with its outputs (Y and MaxPool's optional Indices) checked
/// against `out_shape`: where every backend's MaxPool and AveragePool kernels start.
inline PoolGeometry pool_forward_geometry(const KernelArgs& a) {
  const PoolGeometry g = pool_geometry(a, a.input(0));
  expect_shape(a, 0, g.out_shape);
  if (a.out.size() > 1 && a.out[1] != nullptr) expect_shape(a, 1, g.out_shape);
  return g;
}

/// A pooling gradient's geometry (of its forward input `x`), with `dy` checked to have the
/// forward output's shape.
inline PoolGeometry pool_grad_geometry(const KernelArgs& a, const Tensor& x, const Tensor& dy) {
  PoolGeometry g = pool_geometry(a, x);
  if (dy.shape != g.out_shape)
    fail(ErrorKind::kShape, "{}: dY {} should be {}", a.op_type, dy.describe(),
         shape_string(g.out_shape));
  return g;
}

/// GlobalAveragePool's planes (N * C) of X, with its output checked to be [N, C, 1, ...].
inline int64_t global_pool_planes(const KernelArgs& a, const Tensor& x) {
  if (x.rank() < 2)
    fail(ErrorKind::kModel, "GlobalAveragePool needs an input of rank 2 or more, not {}", x.rank());
  Shape out_shape(x.shape.size(), 1);
  out_shape[0] = x.shape[0];
  out_shape[1] = x.shape[1];
  expect_shape(a, 0, out_shape);
  return x.shape[0] * x.shape[1];
}

/// GlobalAveragePoolGrad's planes (N * C) of X, with dY checked to hold one value per plane.
inline int64_t global_pool_grad_planes(const Tensor& x, const Tensor& dy) {
  if (x.rank() < 2)
    fail(ErrorKind::kModel, "GlobalAveragePoolGrad needs an input of rank 2 or more, not {}",
         x.rank());
  const int64_t planes = x.shape[0] * x.shape[1];
  if (planes > 0 && dy.numel() != planes)
    fail(ErrorKind::kShape, "GlobalAveragePoolGrad: dY {} should have {} values", dy.describe(),
         planes);
  return planes;
}

/// Every output position's window, per (front-filled) dim.
inline std::array<std::vector<Window>, 3> windows(const PoolGeometry& g) {
  std::array<std::vector<Window>, 3> w;
  for (size_t d = 0; d < 3; ++d)
    for (int64_t o = 0; o < g.out[d]; ++o) w[d].push_back(window(g, d, o));
  return w;
}

/// The conv family's gradient ops' operand counts (runtime/format/grad_ops.h): n forward inputs,
/// m forward outputs.
inline constexpr GradArity kConvGradArity{.n_min = 2, .n_max = 3, .m_min = 1, .m_max = 1};
inline constexpr GradArity kMaxPoolGradArity{.n_min = 1, .n_max = 1, .m_min = 1, .m_max = 2};  // Y, [Indices]
inline constexpr GradArity kPoolGradArity{.n_min = 1, .n_max = 1, .m_min = 1, .m_max = 1};

/// A pooling gradient's X, dY (null when omitted) and dX (null when not wanted, else checked to
/// have X's shape).
struct PoolGradOperands {
  const Tensor* x = nullptr;
  const Tensor* dy = nullptr;
  Tensor* dx = nullptr;
};

inline PoolGradOperands pool_grad_operands(const KernelArgs& a, const GradArity& arity) {
  const GradIo io(a, arity);
  PoolGradOperands p{&io.need_x(0), io.dy(0), io.dx(0)};
  if (p.dx != nullptr) expect_shape(a, 0, p.x->shape);
  return p;
}

}  // namespace stagecraft::rt::ops
