// Gradients of Conv and pooling. The contract every gradient kernel follows is
// runtime/format/grad_ops.h: inputs x0..x{n-1}, y0..y{m-1}, dy0..dy{m-1}; outputs dx0..dx{n-1}.
//
// ConvGrad: dX through oneDNN's convolution_backward_data, dW through
// convolution_backward_weights (both on the dense row-major tensors, with a forward-training
// primitive descriptor as their hint), dB as the sum of dY over the batch and spatial dims.
// Pooling gradients are plain loop nests with the forward kernels' (pool.cpp) geometry: MaxPool
// routes each dy to the first maximum of its window (recomputed from X), AveragePool spreads dy
// over its window divided by the forward divisor, GlobalAveragePool spreads dy / size.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/window.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"

namespace stagecraft::rt::cpu {

namespace {

using dnnl::memory;

bool wants(const KernelArgs& a, size_t k) { return k < a.out.size() && a.out[k] != nullptr; }

// The gradient op's forward input count n; checks that the node has n + 2m inputs.
int64_t forward_inputs(const KernelArgs& a, int64_t lo, int64_t hi, size_t m_lo, size_t m_hi) {
  const int64_t n = a.attrs.i(grad::kForwardInputsAttr, -1);
  const size_t rest = a.num_inputs() >= static_cast<size_t>(std::max<int64_t>(n, 0))
                          ? a.num_inputs() - static_cast<size_t>(std::max<int64_t>(n, 0))
                          : 0;
  if (n < lo || n > hi || rest % 2 != 0 || rest / 2 < m_lo || rest / 2 > m_hi)
    fail(ErrorKind::kModel,
         "{}: expected {} to {} forward inputs, the outputs and their gradients; got {} inputs",
         a.op_type, lo, hi, a.num_inputs());
  return n;
}

// "" when every present input and output is float32 except inputs listed in `int_inputs`
// (which may be int64).
std::string float32_except(const OpSignature& s, std::initializer_list<size_t> int_inputs) {
  for (size_t k = 0; k < s.inputs.size(); ++k) {
    const DType d = s.inputs[k];
    if (d == DType::kUndefined || d == DType::kFloat32) continue;
    if (d == DType::kInt64 &&
        std::find(int_inputs.begin(), int_inputs.end(), k) != int_inputs.end())
      continue;
    return fmt::format("{} on {} is not supported (float32 only)", s.op_type, dtype_name(d));
  }
  for (DType d : s.outputs)
    if (d != DType::kUndefined && d != DType::kFloat32)
      return fmt::format("{} producing {} is not supported (float32 only)", s.op_type,
                         dtype_name(d));
  return "";
}

// ---------------------------------------------------------------------------------------------
// ConvGrad

struct ConvGeometry {
  memory::dims src, weights, dst;  // weights are [group, M/group, C/group, k...] when grouped
  memory::dims strides, dilates;   // dilates as oneDNN counts them: 0 is a dense kernel
  memory::dims pad_l, pad_r;
};

// Conv's attributes resolved exactly as conv.cpp does; dY must have the forward output's shape.
ConvGeometry conv_geometry(const KernelArgs& a, const Tensor& x, const Tensor& w,
                           const Tensor& dy) {
  if (x.rank() < 3 || x.rank() > 5)
    fail(ErrorKind::kUnsupported,
         "ConvGrad on a rank-{} input is not supported (1-D to 3-D convolutions only)", x.rank());
  if (w.rank() != x.rank())
    fail(ErrorKind::kModel, "ConvGrad weights {} do not match the input {}", shape_string(w.shape),
         shape_string(x.shape));
  const size_t spatial = static_cast<size_t>(x.rank() - 2);
  const int64_t n = x.shape[0], c = x.shape[1], m = w.shape[0];
  const int64_t group = a.attrs.i("group", 1);
  if (group < 1 || c % group != 0 || m % group != 0 || w.shape[1] * group != c)
    fail(ErrorKind::kModel, "ConvGrad with group {} cannot take input {} and weights {}", group,
         shape_string(x.shape), shape_string(w.shape));
  const std::vector<int64_t> kernel(w.shape.begin() + 2, w.shape.end());
  if (a.attrs.has("kernel_shape") && a.attrs.ints("kernel_shape") != kernel)
    fail(ErrorKind::kModel, "ConvGrad kernel_shape does not match the weights {}",
         shape_string(w.shape));
  const std::vector<int64_t> strides = per_dim(a, "strides", spatial, 1);
  const std::vector<int64_t> dilations = per_dim(a, "dilations", spatial, 1);
  std::vector<int64_t> pads = per_dim(a, "pads", 2 * spatial, 0);
  const std::string auto_pad = a.attrs.s("auto_pad", "NOTSET");
  ConvGeometry g;
  g.src = x.shape;
  g.dst = {n, m};
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t in = x.shape[2 + i], s = strides[i], d = dilations[i];
    if (s < 1 || d < 1 || kernel[i] < 1)
      fail(ErrorKind::kModel, "ConvGrad strides, dilations and kernel must be positive");
    const int64_t reach = (kernel[i] - 1) * d + 1;
    const auto [begin, end] =
        resolve_padding(a, auto_pad, in, s, reach, pads[i], pads[spatial + i]);
    if (in + begin + end < reach)
      fail(ErrorKind::kShape, "ConvGrad window {} is larger than the padded input", reach);
    g.dst.push_back((in + begin + end - reach) / s + 1);
    g.strides.push_back(s);
    g.dilates.push_back(d - 1);
    g.pad_l.push_back(begin);
    g.pad_r.push_back(end);
  }
  if (dy.shape != Shape(g.dst.begin(), g.dst.end()))
    fail(ErrorKind::kShape, "ConvGrad: dY {} should be {}", dy.describe(),
         shape_string(Shape(g.dst.begin(), g.dst.end())));
  g.weights = w.shape;
  if (group > 1) {
    g.weights[0] = m / group;
    g.weights.insert(g.weights.begin(), group);
  }
  return g;
}

void conv_grad(const KernelArgs& a) {
  const int64_t n_in = forward_inputs(a, 2, 3, 1, 1);
  const Tensor& x = a.input(0);
  const Tensor& w = a.input(1);
  const size_t dy_at = static_cast<size_t>(n_in) + 1;
  if (!a.has_input(dy_at)) return;  // no output gradient: all zeros
  const Tensor& dy = a.input(dy_at);
  const ConvGeometry g = conv_geometry(a, x, w, dy);
  if (wants(a, 0)) expect_shape(a, 0, x.shape);
  if (wants(a, 1)) expect_shape(a, 1, w.shape);
  if (wants(a, 2)) {
    if (n_in < 3 || !a.has_input(2))
      fail(ErrorKind::kModel, "ConvGrad: a bias gradient without a bias input");
    expect_shape(a, 2, a.input(2).shape);
    if (a.input(2).shape != Shape{w.shape[0]})
      fail(ErrorKind::kModel, "ConvGrad bias {} should be [{}]", a.input(2).describe(), w.shape[0]);
  }
  if (dy.numel() == 0 || x.numel() == 0) return;
  CpuContext& ctx = context(a);
  const memory::desc src_d = plain_desc(g.src), w_d = plain_desc(g.weights),
                     dst_d = plain_desc(g.dst);
  try {
    if (wants(a, 0) || wants(a, 1)) {
      dnnl::convolution_forward::desc fwd(dnnl::prop_kind::forward_training,
                                          dnnl::algorithm::convolution_direct, src_d, w_d, dst_d,
                                          g.strides, g.dilates, g.pad_l, g.pad_r);
      dnnl::convolution_forward::primitive_desc hint(fwd, ctx.engine);
      memory diff_dst(dst_d, ctx.engine, dy.data);
      if (wants(a, 0)) {
        dnnl::convolution_backward_data::desc desc(dnnl::algorithm::convolution_direct, src_d, w_d,
                                                   dst_d, g.strides, g.dilates, g.pad_l, g.pad_r);
        dnnl::convolution_backward_data::primitive_desc pd(desc, ctx.engine, hint);
        dnnl::convolution_backward_data(pd).execute(
            ctx.stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                         {DNNL_ARG_WEIGHTS, memory(w_d, ctx.engine, w.data)},
                         {DNNL_ARG_DIFF_SRC, memory(src_d, ctx.engine, a.out[0]->data)}});
      }
      if (wants(a, 1)) {
        dnnl::convolution_backward_weights::desc desc(dnnl::algorithm::convolution_direct, src_d,
                                                      w_d, dst_d, g.strides, g.dilates, g.pad_l,
                                                      g.pad_r);
        dnnl::convolution_backward_weights::primitive_desc pd(desc, ctx.engine, hint);
        dnnl::convolution_backward_weights(pd).execute(
            ctx.stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                         {DNNL_ARG_SRC, memory(src_d, ctx.engine, x.data)},
                         {DNNL_ARG_DIFF_WEIGHTS, memory(w_d, ctx.engine, a.out[1]->data)}});
      }
      ctx.stream.wait();
    }
  } catch (const dnnl::error& e) {
    fail(ErrorKind::kUnsupported, "oneDNN cannot run this ConvGrad ({}): {}", shape_string(x.shape),
         e.what());
  }
  if (wants(a, 2)) {
    const int64_t batch = g.dst[0], m = g.dst[1],
                  size = dy.numel() / std::max<int64_t>(batch * m, 1);
    const float* d = dy.as<float>();
    float* db = a.out[2]->as<float>();
#pragma omp parallel for if (dy.numel() > 32768)
    for (int64_t c = 0; c < m; ++c) {
      double s = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const float* p = d + (b * m + c) * size;
        for (int64_t i = 0; i < size; ++i) s += p[i];
      }
      db[c] = static_cast<float>(s);
    }
  }
}

std::string check_conv_grad(const OpSignature& s) {
  if (std::string why = all_float32(s); !why.empty()) return why;
  const std::string auto_pad = s.attrs.s("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      auto_pad != "VALID")
    return "ConvGrad auto_pad '" + auto_pad +
           "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID";
  if (s.attrs.i("group", 1) < 1) return "ConvGrad group must be at least 1";
  if (s.attrs.ints("kernel_shape").size() > 3)
    return "Conv with more than 3 spatial dims is not supported";
  return "";
}

// ---------------------------------------------------------------------------------------------
// Pooling gradients (geometry as in pool.cpp)

struct PoolGeometry {
  int64_t planes = 0;
  size_t spatial = 0;
  Shape out_shape;
  std::array<int64_t, 3> in{1, 1, 1}, out{1, 1, 1}, kernel{1, 1, 1}, stride{1, 1, 1},
      dilation{1, 1, 1};
  std::array<int64_t, 3> pad_l{0, 0, 0}, pad_r{0, 0, 0};
  int64_t in_plane() const { return in[0] * in[1] * in[2]; }
  int64_t out_plane() const { return out[0] * out[1] * out[2]; }
};

struct Window {
  int64_t start, first, last, padded;
};

Window window(const PoolGeometry& g, size_t d, int64_t o) {
  const int64_t start = o * g.stride[d] - g.pad_l[d], step = g.dilation[d], k = g.kernel[d];
  auto below = [&](int64_t bound) {
    return std::clamp<int64_t>((bound - start + step - 1) / step, 0, k);
  };
  const int64_t first = start >= 0 ? 0 : std::min(k, (-start + step - 1) / step);
  return {start, first, std::max(first, below(g.in[d])), below(g.in[d] + g.pad_r[d])};
}

PoolGeometry pool_geometry(const KernelArgs& a, const Tensor& x) {
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
    const int64_t reach = (k - 1) * step + 1;
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
    for (int64_t o = 0; o < g.out[d]; ++o)
      if (const Window w = window(g, d, o); w.first >= w.last)
        fail(ErrorKind::kUnsupported, "{} window {} of spatial dim {} covers only padding",
             a.op_type, o, i);
  }
  return g;
}

std::array<std::vector<Window>, 3> windows(const PoolGeometry& g) {
  std::array<std::vector<Window>, 3> w;
  for (size_t d = 0; d < 3; ++d)
    for (int64_t o = 0; o < g.out[d]; ++o) w[d].push_back(window(g, d, o));
  return w;
}

// Reads X and dY (the last input) of a single-output pooling gradient; checks shapes.
struct PoolArgs {
  const Tensor* x = nullptr;
  const Tensor* dy = nullptr;
};

PoolArgs pool_args(const KernelArgs& a, size_t m_hi) {
  const int64_t n = forward_inputs(a, 1, 1, 1, m_hi);
  const size_t m = (a.num_inputs() - static_cast<size_t>(n)) / 2;
  PoolArgs p;
  p.x = &a.input(0);
  const size_t dy_at = static_cast<size_t>(n) + m;
  p.dy = a.has_input(dy_at) ? &a.input(dy_at) : nullptr;
  if (wants(a, 0)) expect_shape(a, 0, p.x->shape);
  return p;
}

void max_pool_grad(const KernelArgs& a) {
  const PoolArgs p = pool_args(a, 2);
  if (!wants(a, 0) || !p.dy) return;
  const PoolGeometry g = pool_geometry(a, *p.x);
  if (p.dy->shape != g.out_shape)
    fail(ErrorKind::kShape, "MaxPoolGrad: dY {} should be {}", p.dy->describe(),
         shape_string(g.out_shape));
  const auto w = windows(g);
  const int64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  const int64_t H = g.in[1], W = g.in[2];
  const float* x = p.x->as<float>();
  const float* dy = p.dy->as<float>();
  float* dx = a.out[0]->as<float>();
#pragma omp parallel for if (g.planes * out_plane > 4096)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    const float* xp = x + pl * in_plane;
    float* dxp = dx + pl * in_plane;
    int64_t o = pl * out_plane;
    for (const Window& wd : w[0])
      for (const Window& wh : w[1])
        for (const Window& ww : w[2]) {
          float best = std::numeric_limits<float>::lowest();
          int64_t at = -1;
          for (int64_t jd = wd.first; jd < wd.last; ++jd) {
            const int64_t id = wd.start + jd * g.dilation[0];
            for (int64_t jh = wh.first; jh < wh.last; ++jh) {
              const int64_t ih = wh.start + jh * g.dilation[1];
              for (int64_t jw = ww.first; jw < ww.last; ++jw) {
                const int64_t i = (id * H + ih) * W + ww.start + jw * g.dilation[2];
                if (at < 0 || xp[i] > best) {
                  best = xp[i];
                  at = i;
                }
              }
            }
          }
          if (at >= 0) dxp[at] += dy[o];
          ++o;
        }
  }
}

void average_pool_grad(const KernelArgs& a) {
  const PoolArgs p = pool_args(a, 1);
  if (!wants(a, 0) || !p.dy) return;
  const PoolGeometry g = pool_geometry(a, *p.x);
  if (p.dy->shape != g.out_shape)
    fail(ErrorKind::kShape, "AveragePoolGrad: dY {} should be {}", p.dy->describe(),
         shape_string(g.out_shape));
  const bool include_pad = a.attrs.i("count_include_pad", 0) != 0;
  const auto w = windows(g);
  const int64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  const int64_t H = g.in[1], W = g.in[2];
  const float* dy = p.dy->as<float>();
  float* dx = a.out[0]->as<float>();
#pragma omp parallel for if (g.planes * out_plane > 4096)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    float* dxp = dx + pl * in_plane;
    int64_t o = pl * out_plane;
    for (const Window& wd : w[0])
      for (const Window& wh : w[1])
        for (const Window& ww : w[2]) {
          const int64_t count =
              include_pad ? wd.padded * wh.padded * ww.padded
                          : (wd.last - wd.first) * (wh.last - wh.first) * (ww.last - ww.first);
          const float v = dy[o++] / static_cast<float>(count);
          for (int64_t jd = wd.first; jd < wd.last; ++jd) {
            const int64_t id = wd.start + jd * g.dilation[0];
            for (int64_t jh = wh.first; jh < wh.last; ++jh) {
              const int64_t ih = wh.start + jh * g.dilation[1];
              for (int64_t jw = ww.first; jw < ww.last; ++jw)
                dxp[(id * H + ih) * W + ww.start + jw * g.dilation[2]] += v;
            }
          }
        }
  }
}

void global_average_pool_grad(const KernelArgs& a) {
  const PoolArgs p = pool_args(a, 1);
  if (!wants(a, 0) || !p.dy) return;
  const Tensor& x = *p.x;
  if (x.rank() < 2)
    fail(ErrorKind::kModel, "GlobalAveragePoolGrad needs an input of rank 2 or more, not {}",
         x.rank());
  const int64_t planes = x.shape[0] * x.shape[1];
  if (planes == 0) return;
  if (p.dy->numel() != planes)
    fail(ErrorKind::kShape, "GlobalAveragePoolGrad: dY {} should have {} values", p.dy->describe(),
         planes);
  const int64_t size = x.numel() / planes;
  const float* dy = p.dy->as<float>();
  float* dx = a.out[0]->as<float>();
#pragma omp parallel for if (planes * size > 32768)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float v = dy[pl] / static_cast<float>(size);
    for (int64_t i = 0; i < size; ++i) dx[pl * size + i] = v;
  }
}

std::string check_pool_grad_attrs(const OpSignature& s) {
  const std::string auto_pad = s.attrs.s("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      auto_pad != "VALID")
    return fmt::format("{} auto_pad '{}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID",
                       s.op_type, auto_pad);
  const size_t spatial = s.attrs.ints("kernel_shape").size();
  if (spatial < 1 || spatial > 3)
    return fmt::format("{} needs kernel_shape with 1 to 3 values (1-D to 3-D pooling only)",
                       s.op_type);
  return "";
}

std::string check_max_pool_grad(const OpSignature& s) {
  // Inputs: X, Y, [Indices (int64)], dY, [dIndices].
  if (std::string why = float32_except(s, {2}); !why.empty()) return why;
  return check_pool_grad_attrs(s);
}

std::string check_average_pool_grad(const OpSignature& s) {
  if (std::string why = all_float32(s); !why.empty()) return why;
  return check_pool_grad_attrs(s);
}

constexpr KernelEntry kKernels[] = {
    {"ConvGrad", conv_grad, check_conv_grad},
    {"MaxPoolGrad", max_pool_grad, check_max_pool_grad},
    {"AveragePoolGrad", average_pool_grad, check_average_pool_grad},
    {"GlobalAveragePoolGrad", global_average_pool_grad, all_float32},
};

}  // namespace

std::span<const KernelEntry> grad_conv_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
