// Kernels of the pool family (see families.h): MaxPool, AveragePool and GlobalAveragePool.
//
// MaxPool and AveragePool run on oneDNN's dilated pooling (pooling_v2). ceil_mode becomes
// extra right padding, which neither a max nor an exclude-padding average sees. What oneDNN
// cannot express (MaxPool's Indices output, an include-padding average whose windows reach
// into that extra padding, a geometry oneDNN refuses) runs on a plain loop nest with ONNX's
// semantics. GlobalAveragePool is a plain mean per channel.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/window.h"

namespace stagecraft::rt::cpu {

namespace {

using dnnl::memory;

enum class PoolKind { kMax, kAverageExcludePad, kAverageIncludePad };

// Runs the pooling on oneDNN; false when oneDNN has no implementation for it.
bool pool_onednn(const KernelArgs& a, const ops::PoolGeometry& g, PoolKind kind) {
  memory::dims strides, kernel, dilation, pad_l, pad_r;
  for (size_t d = 3 - g.spatial; d < 3; ++d) {
    strides.push_back(g.stride[d]);
    kernel.push_back(g.kernel[d]);
    dilation.push_back(g.dilation[d] - 1);  // oneDNN counts a dense window as dilation 0
    pad_l.push_back(g.pad_l[d]);
    pad_r.push_back(g.reached_pad_r(d));
  }
  const dnnl::algorithm algorithm = kind == PoolKind::kMax                ? dnnl::algorithm::pooling_max
                                    : kind == PoolKind::kAverageIncludePad ? dnnl::algorithm::pooling_avg_include_padding
                                                                           : dnnl::algorithm::pooling_avg_exclude_padding;
  CpuContext& ctx = context(a);
  memory src = wrap(a.input(0), ctx);
  memory dst = wrap(*a.out[0], ctx);
  dnnl::pooling_v2_forward::primitive_desc pd;
  try {
    dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, algorithm, src.get_desc(), dst.get_desc(),
                                        strides, kernel, dilation, pad_l, pad_r);
    pd = dnnl::pooling_v2_forward::primitive_desc(desc, ctx.engine);
  } catch (const dnnl::error&) {
    return false;
  }
  dnnl::pooling_v2_forward(pd).execute(ctx.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
  ctx.stream.wait();
  return true;
}

// Max pooling as a loop nest; fills `indices` (when not null) with each maximum's flat index
// into the input, its spatial part row-major or, with `column_major`, column-major.
template <class T>
void max_pool_loops(const ops::PoolGeometry& g, const T* x, T* y, int64_t* indices,
                    bool column_major) {
  const auto w = ops::windows(g);
  const int64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  const int64_t D = g.in[0], H = g.in[1], W = g.in[2];
#pragma omp parallel for if (g.planes * out_plane > 4096)
  for (int64_t p = 0; p < g.planes; ++p) {
    const T* xp = x + p * in_plane;
    int64_t o = p * out_plane;
    for (const ops::Window& wd : w[0])
      for (const ops::Window& wh : w[1])
        for (const ops::Window& ww : w[2]) {
          T best = std::numeric_limits<T>::lowest();
          int64_t bd = 0, bh = 0, bw = 0;
          bool found = false;
          for (int64_t jd = wd.first; jd < wd.last; ++jd) {
            const int64_t id = wd.start + jd * g.dilation[0];
            for (int64_t jh = wh.first; jh < wh.last; ++jh) {
              const int64_t ih = wh.start + jh * g.dilation[1];
              for (int64_t jw = ww.first; jw < ww.last; ++jw) {
                const int64_t iw = ww.start + jw * g.dilation[2];
                const T v = xp[(id * H + ih) * W + iw];
                if (!found || v > best) {
                  best = v;
                  bd = id;
                  bh = ih;
                  bw = iw;
                  found = true;
                }
              }
            }
          }
          y[o] = best;
          if (indices != nullptr)
            indices[o] = p * in_plane + (column_major ? bd + bh * D + bw * D * H : (bd * H + bh) * W + bw);
          ++o;
        }
  }
}

// Average pooling as a loop nest: the divisor counts the window's positions inside the input,
// or with include-padding those inside the explicitly padded input (never the ceil_mode extension).
void average_pool_loops(const ops::PoolGeometry& g, const float* x, float* y, bool include_pad) {
  const auto w = ops::windows(g);
  const int64_t in_plane = g.in_plane(), out_plane = g.out_plane();
  const int64_t H = g.in[1], W = g.in[2];
#pragma omp parallel for if (g.planes * out_plane > 4096)
  for (int64_t p = 0; p < g.planes; ++p) {
    const float* xp = x + p * in_plane;
    int64_t o = p * out_plane;
    for (const ops::Window& wd : w[0])
      for (const ops::Window& wh : w[1])
        for (const ops::Window& ww : w[2]) {
          float sum = 0;
          for (int64_t jd = wd.first; jd < wd.last; ++jd) {
            const int64_t id = wd.start + jd * g.dilation[0];
            for (int64_t jh = wh.first; jh < wh.last; ++jh) {
              const int64_t ih = wh.start + jh * g.dilation[1];
              for (int64_t jw = ww.first; jw < ww.last; ++jw) sum += xp[(id * H + ih) * W + ww.start + jw * g.dilation[2]];
            }
          }
          const int64_t count = include_pad ? wd.padded * wh.padded * ww.padded
                                            : (wd.last - wd.first) * (wh.last - wh.first) * (ww.last - ww.first);
          y[o++] = sum / static_cast<float>(count);
        }
  }
}

void max_pool(const KernelArgs& a) {
  const ops::PoolGeometry g = ops::pool_forward_geometry(a);
  if (a.out[0]->numel() == 0) return;
  const bool want_indices = a.out.size() > 1 && a.out[1] != nullptr;
  if (!want_indices && pool_onednn(a, g, PoolKind::kMax)) return;
  int64_t* indices = want_indices ? a.out[1]->as<int64_t>() : nullptr;
  const bool column_major = a.attrs.i("storage_order", 0) == 1;
  const Tensor& x = a.input(0);
  switch (x.dtype) {
    case DType::kFloat32: max_pool_loops(g, x.as<float>(), a.out[0]->as<float>(), indices, column_major); break;
    case DType::kInt8: max_pool_loops(g, x.as<int8_t>(), a.out[0]->as<int8_t>(), indices, column_major); break;
    case DType::kUInt8: max_pool_loops(g, x.as<uint8_t>(), a.out[0]->as<uint8_t>(), indices, column_major); break;
    default: fail(ErrorKind::kUnsupported, "MaxPool on {} is not supported", dtype_name(x.dtype));
  }
}

void average_pool(const KernelArgs& a) {
  const ops::PoolGeometry g = ops::pool_forward_geometry(a);
  if (a.out[0]->numel() == 0) return;
  const bool include_pad = a.attrs.i("count_include_pad", 0) != 0;
  // oneDNN's include-padding divisor would count the ceil_mode extension as padding.
  if (!(include_pad && g.ceil_extends) &&
      pool_onednn(a, g, include_pad ? PoolKind::kAverageIncludePad : PoolKind::kAverageExcludePad))
    return;
  average_pool_loops(g, a.input(0).as<float>(), a.out[0]->as<float>(), include_pad);
}

void global_average_pool(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const int64_t planes = ops::global_pool_planes(a, x);
  if (planes == 0) return;
  const int64_t size = x.numel() / planes;
  const float* xp = x.as<float>();
  float* y = a.out[0]->as<float>();
#pragma omp parallel for if (planes * size > 32768)
  for (int64_t p = 0; p < planes; ++p) {
    double sum = 0;
    for (int64_t i = 0; i < size; ++i) sum += xp[p * size + i];
    y[p] = static_cast<float>(sum / static_cast<double>(size));
  }
}

// The reason a MaxPool or AveragePool attribute set is refused, or "".
std::string check_pool_attrs(const OpSignature& sig) {
  const std::string auto_pad = sig.attrs.s("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" && auto_pad != "VALID")
    return fmt::format("{} auto_pad '{}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", sig.op_type, auto_pad);
  const size_t spatial = sig.attrs.ints("kernel_shape").size();
  if (spatial < 1 || spatial > 3)
    return fmt::format("{} needs kernel_shape with 1 to 3 values (1-D to 3-D pooling only)", sig.op_type);
  const int64_t ceil_mode = sig.attrs.i("ceil_mode", 0);
  if (ceil_mode != 0 && ceil_mode != 1) return fmt::format("{} ceil_mode must be 0 or 1", sig.op_type);
  return "";
}

std::string check_max_pool(const OpSignature& sig) {
  if (sig.inputs.size() != 1 || sig.outputs.empty() || sig.outputs.size() > 2) return "MaxPool takes one input";
  const DType t = sig.inputs[0];
  if (t != DType::kFloat32 && t != DType::kInt8 && t != DType::kUInt8)
    return fmt::format("MaxPool on {} is not supported (float32, int8 and uint8 only)", dtype_name(t));
  if (sig.outputs[0] != t) return "MaxPool output Y must have the input's dtype";
  if (sig.outputs.size() == 2 && sig.outputs[1] != DType::kUndefined && sig.outputs[1] != DType::kInt64)
    return "MaxPool output Indices must be int64";
  const int64_t storage_order = sig.attrs.i("storage_order", 0);
  if (storage_order != 0 && storage_order != 1) return "MaxPool storage_order must be 0 or 1";
  return check_pool_attrs(sig);
}

std::string check_average_pool(const OpSignature& sig) {
  if (std::string why = all_float32(sig); !why.empty()) return why;
  if (sig.inputs.size() != 1 || sig.outputs.size() != 1) return "AveragePool takes one input and gives one output";
  const int64_t include = sig.attrs.i("count_include_pad", 0);
  if (include != 0 && include != 1) return "AveragePool count_include_pad must be 0 or 1";
  return check_pool_attrs(sig);
}

std::string check_global_average_pool(const OpSignature& sig) {
  if (std::string why = all_float32(sig); !why.empty()) return why;
  if (sig.inputs.size() != 1 || sig.outputs.size() != 1) return "GlobalAveragePool takes one input and gives one output";
  return "";
}

constexpr KernelEntry kPoolKernels[] = {
    {"MaxPool", max_pool, check_max_pool},
    {"AveragePool", average_pool, check_average_pool},
    {"GlobalAveragePool", global_average_pool, check_global_average_pool},
};

}  // namespace

std::span<const KernelEntry> pool_kernels() { return kPoolKernels; }

}  // namespace stagecraft::rt::cpu
