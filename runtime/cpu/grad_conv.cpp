// Gradients of Conv and pooling. The contract every gradient kernel follows is
// runtime/format/grad_ops.h: inputs x0..x{n-1}, y0..y{m-1}, dy0..dy{m-1}; outputs dx0..dx{n-1}.
//
// ConvGrad: dX and dW by oneDNN's backward primitives (conv_backward.h: on its blocked layouts
// where they run faster), dB as the sum of dY over the batch and spatial dims.
// Pooling gradients are plain loop nests with the forward kernels' (pool.cpp) geometry: MaxPool
// routes each dy to the first maximum of its window (recomputed from X), AveragePool spreads dy
// over its window divided by the forward divisor, GlobalAveragePool spreads dy / size.
#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "runtime/cpu/conv_backward.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/vectorise.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/window.h"

namespace stagecraft::rt::cpu {

namespace {

using dnnl::memory;

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

// The sum of channel c of dY [batch, channels, size] (the bias's gradient), in double, in loops
// vectorised per vector unit.
STAGECRAFT_CPU_CLONES float channel_sum(const float* d, int64_t batch, int64_t channels,
                                        int64_t size, int64_t c) {
  double s = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const float* p = d + (b * channels + c) * size;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < size; ++i) s += p[i];
  }
  return static_cast<float>(s);
}

// Writes every element of every requested output: oneDNN's backward primitives overwrite dX
// (zeros where no window reads an input) and dW, and dB is one sum per channel.
void conv_grad(const KernelArgs& a) {
  const ops::GradIo io(a, ops::kConvGradArity);
  const Tensor& x = io.need_x(0);
  const Tensor& w = io.need_x(1);
  if (io.dy(0) == nullptr) return ops::zero_outputs(a);
  const Tensor& dy = *io.dy(0);
  const ops::ConvGeometry g = ops::conv_grad_geometry(a, x, w, dy);
  ops::check_conv_grad_outputs(a, x, w, io.x(2), io.wants(0), io.wants(1), io.wants(2));
  if (dy.numel() == 0 || x.numel() == 0) return ops::zero_outputs(a);
  try {
    conv_backward(context(a), g, x, w, dy, io.wants(0) ? io.dx(0) : nullptr,
                  io.wants(1) ? io.dx(1) : nullptr);
  } catch (const dnnl::error& e) {
    fail(ErrorKind::kUnsupported, "oneDNN cannot run this ConvGrad ({}): {}", shape_string(x.shape),
         e.what());
  }
  if (io.wants(2)) {
    const int64_t batch = g.dst[0], m = g.dst[1],
                  size = dy.numel() / std::max<int64_t>(batch * m, 1);
    const float* d = dy.as<float>();
    float* db = io.dx(2)->as<float>();
#pragma omp parallel for if (dy.numel() > 32768)
    for (int64_t c = 0; c < m; ++c) db[c] = channel_sum(d, batch, m, size, c);
  }
}

std::string check_conv_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, ops::kConvGradArity); !why.empty()) return why;
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
// Pooling gradients (geometry: window.h, as the forward)

// One kernel position of every window of an output row: window ow takes x[base + ow * stride]
// where it is its first element or larger than its best so far. Bit selects, not a branch (the
// compiler turned `?:` back into one), in a loop vectorised per vector unit.
STAGECRAFT_CPU_CLONES void window_step(const float* x, int64_t base, int64_t stride, int64_t lo,
                                       int64_t hi, float* best, int64_t* at) {
#pragma omp simd
  for (int64_t ow = lo; ow < hi; ++ow) {
    const int64_t i = base + ow * stride;
    const float v = x[i];
    // All ones where v is taken.
    const int64_t take = -static_cast<int64_t>((at[ow] < 0) | (v > best[ow]));
    const auto keep = static_cast<uint32_t>(take);
    at[ow] = (i & take) | (at[ow] & ~take);
    best[ow] = std::bit_cast<float>((std::bit_cast<uint32_t>(v) & keep) |
                                    (std::bit_cast<uint32_t>(best[ow]) & ~keep));
  }
}

// MaxPool and AveragePool add into dX, so each zeroes one plane of dX just before it adds into
// it (while the plane is in cache) instead of the runtime zeroing all of dX first: the kernels
// write every element.
void max_pool_grad(const KernelArgs& a) {
  const ops::PoolGradOperands p = ops::pool_grad_operands(a, ops::kMaxPoolGradArity);
  if (p.dx == nullptr) return;
  if (p.dy == nullptr) return ops::zero(*p.dx);
  const ops::PoolGeometry g = ops::pool_grad_geometry(a, *p.x, *p.dy);
  const auto w = ops::windows(g);
  const int64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  const int64_t H = g.in[1], W = g.in[2];
  const float* x = p.x->as<float>();
  const float* dy = p.dy->as<float>();
  float* dx = p.dx->as<float>();
  // Along the last dim, every window of an output row is searched at once: for each kernel
  // position, the row's windows that reach the input take one more element each. The windows'
  // choices do not wait on one another (a window's own elements are still met in order, so the
  // first largest wins as before), and the scatter into dX keeps the output order, so the sums
  // are the same bytes. A window chooses without a branch (window_step): on a ReLU's output
  // (ties of zeros, signs that change every microbatch) a branch mispredicted about every other
  // element (in-run MaxPoolGrad of [2,32,26,26] took 160-179 us a call; now 78-112 us).
  const int64_t OW = g.out[2], KW = g.kernel[2], SW = g.stride[2], DW = g.dilation[2];
#pragma omp parallel for if (g.planes * out_plane > 4096)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    const float* xp = x + pl * in_plane;
    float* dxp = dx + pl * in_plane;
    std::fill_n(dxp, in_plane, 0.0f);
    std::vector<float> best(static_cast<size_t>(OW));
    std::vector<int64_t> at(static_cast<size_t>(OW));
    int64_t o = pl * out_plane;
    for (const ops::Window& wd : w[0])
      for (const ops::Window& wh : w[1]) {
        std::fill(best.begin(), best.end(), -std::numeric_limits<float>::infinity());
        std::fill(at.begin(), at.end(), int64_t{-1});
        for (int64_t jd = wd.first; jd < wd.last; ++jd) {
          const int64_t id = wd.start + jd * g.dilation[0];
          for (int64_t jh = wh.first; jh < wh.last; ++jh) {
            const int64_t row = (id * H + wh.start + jh * g.dilation[1]) * W;
            for (int64_t jw = 0; jw < KW; ++jw) {
              // The windows ow whose kernel position jw lands inside the row: 0 <= ow * SW +
              // offset < W.
              const int64_t offset = jw * DW - g.pad_l[2];
              const int64_t lo = offset >= 0 ? 0 : (-offset + SW - 1) / SW;
              const int64_t hi = W - 1 - offset < 0 ? 0 : std::min(OW, (W - 1 - offset) / SW + 1);
              window_step(xp, row + offset, SW, lo, hi, best.data(), at.data());
            }
          }
        }
        for (int64_t ow = 0; ow < OW; ++ow, ++o)
          if (at[ow] >= 0) dxp[at[ow]] += dy[o];
      }
  }
}

void average_pool_grad(const KernelArgs& a) {
  const ops::PoolGradOperands p = ops::pool_grad_operands(a, ops::kPoolGradArity);
  if (p.dx == nullptr) return;
  if (p.dy == nullptr) return ops::zero(*p.dx);
  const ops::PoolGeometry g = ops::pool_grad_geometry(a, *p.x, *p.dy);
  const bool include_pad = a.attrs.i("count_include_pad", 0) != 0;
  const auto w = ops::windows(g);
  const int64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  const int64_t H = g.in[1], W = g.in[2];
  const float* dy = p.dy->as<float>();
  float* dx = p.dx->as<float>();
#pragma omp parallel for if (g.planes * out_plane > 4096)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    float* dxp = dx + pl * in_plane;
    std::fill_n(dxp, in_plane, 0.0f);
    int64_t o = pl * out_plane;
    for (const ops::Window& wd : w[0])
      for (const ops::Window& wh : w[1])
        for (const ops::Window& ww : w[2]) {
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
  const ops::PoolGradOperands p = ops::pool_grad_operands(a, ops::kPoolGradArity);
  if (p.dx == nullptr) return;
  if (p.dy == nullptr) return ops::zero(*p.dx);
  const Tensor& x = *p.x;
  const int64_t planes = ops::global_pool_grad_planes(x, *p.dy);
  if (planes == 0) return;
  const int64_t size = x.numel() / planes;
  const float* dy = p.dy->as<float>();
  float* dx = p.dx->as<float>();
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
  if (std::string why = ops::grad_arity_error(s, ops::kMaxPoolGradArity); !why.empty()) return why;
  if (std::string why = float32_except(s, {2}); !why.empty()) return why;
  return check_pool_grad_attrs(s);
}

std::string check_average_pool_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, ops::kPoolGradArity); !why.empty()) return why;
  if (std::string why = all_float32(s); !why.empty()) return why;
  return check_pool_grad_attrs(s);
}

std::string check_global_average_pool_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, ops::kPoolGradArity); !why.empty()) return why;
  return all_float32(s);
}

// Every kernel here writes every element of the outputs it is given (see each kernel).
constexpr KernelEntry kKernels[] = {
    {"ConvGrad", conv_grad, check_conv_grad, /*writes_every_output=*/true},
    {"MaxPoolGrad", max_pool_grad, check_max_pool_grad, /*writes_every_output=*/true},
    {"AveragePoolGrad", average_pool_grad, check_average_pool_grad, /*writes_every_output=*/true},
    {"GlobalAveragePoolGrad", global_average_pool_grad, check_global_average_pool_grad,
     /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> grad_conv_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
