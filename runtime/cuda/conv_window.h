#pragma once
/// \file
/// What one thread of the CUDA pooling kernels computes (conv_kernels.cu), as plain inline
/// functions that nvcc compiles for the device and the host compiler for tests: the kernels are
/// grid-stride loops around these, and tests/gpu/cuda_conv_window_test.cpp runs the same
/// functions on the host against the CPU backend's pooling kernels, so the index arithmetic is
/// checked without a GPU. Nothing here includes a CUDA header.
///
/// Tensors are dense NCHW: N * C "planes", each its spatial dims row-major, front-filled to
/// three dims (depth, height, width) with size-one dims as the shared PoolGeometry
/// (runtime/ops/window.h) fills them. Windows follow that header's rules exactly (`Span` is
/// its `Window`). The gradients gather: one input element sums the windows that hold it in
/// output order, which is the order the CPU's loops add them in.

#include <cstddef>
#include <cstdint>

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::cuda {

/// One pooling node resolved (ops::PoolGeometry as plain data): per front-filled dim the input
/// and output sizes, the window, and the explicit pads (pad_r without the ceil_mode extension,
/// which only the include-padding divisor looks at).
struct PoolShape {
  int64_t planes = 0;  ///< N * C
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1}, stride[3] = {1, 1, 1}, dilation[3] = {1, 1, 1};
  int64_t pad_l[3] = {0, 0, 0}, pad_r[3] = {0, 0, 0};

  STAGECRAFT_HOST_DEVICE int64_t in_plane() const { return in[0] * in[1] * in[2]; }
  STAGECRAFT_HOST_DEVICE int64_t out_plane() const { return out[0] * out[1] * out[2]; }
};

/// `g` (a ops::PoolGeometry; a template so that device code never sees oneDNN's headers,
/// which runtime/ops/window.h includes) as a PoolShape.
template <class Geometry>
PoolShape pool_shape(const Geometry& g) {
  PoolShape s;
  s.planes = g.planes;
  for (size_t d = 0; d < 3; ++d) {
    s.in[d] = g.in[d];
    s.out[d] = g.out[d];
    s.kernel[d] = g.kernel[d];
    s.stride[d] = g.stride[d];
    s.dilation[d] = g.dilation[d];
    s.pad_l[d] = g.pad_l[d];
    s.pad_r[d] = g.pad_r[d];
  }
  return s;
}

namespace window_detail {
STAGECRAFT_HOST_DEVICE inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
STAGECRAFT_HOST_DEVICE inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
}  // namespace window_detail

/// Output position o's window along dim d (ops::window): the input position of kernel index 0,
/// the kernel indices [first, last) inside the input, and how many lie inside the explicitly
/// padded input.
struct Span {
  int64_t start, first, last, padded;
};

STAGECRAFT_HOST_DEVICE inline Span window_along(const PoolShape& s, int d, int64_t o) {
  using window_detail::max64;
  using window_detail::min64;
  const int64_t start = o * s.stride[d] - s.pad_l[d], step = s.dilation[d], k = s.kernel[d];
  // The kernel indices j (at start + j * step) below a bound, clamped to [0, k].
  const int64_t below_in = min64(max64((s.in[d] - start + step - 1) / step, 0), k);
  const int64_t below_padded = min64(max64((s.in[d] + s.pad_r[d] - start + step - 1) / step, 0), k);
  const int64_t first = start >= 0 ? 0 : min64(k, (-start + step - 1) / step);
  return {start, first, max64(first, below_in), below_padded};
}

/// A flat index over [planes, dims[0], dims[1], dims[2]] split into its plane and position.
struct Position {
  int64_t plane, d, h, w;
};

STAGECRAFT_HOST_DEVICE inline Position split(int64_t e, const int64_t (&dims)[3]) {
  Position p;
  p.w = e % dims[2];
  e /= dims[2];
  p.h = e % dims[1];
  e /= dims[1];
  p.d = e % dims[0];
  p.plane = e / dims[0];
  return p;
}

/// The first maximum (window order d, h, w; the CPU's `!found || v > best`) of output `o`'s
/// window in plane `xp`, and its position. Every window holds an input element
/// (ops::pool_geometry refuses a window over padding alone).
template <class T>
struct WindowMax {
  T value;
  int64_t d, h, w;
};

template <class T>
STAGECRAFT_HOST_DEVICE WindowMax<T> window_max(const PoolShape& s, const T* xp, const Position& o) {
  const Span wd = window_along(s, 0, o.d), wh = window_along(s, 1, o.h),
             ww = window_along(s, 2, o.w);
  const int64_t H = s.in[1], W = s.in[2];
  WindowMax<T> best{T(), 0, 0, 0};
  bool found = false;
  for (int64_t jd = wd.first; jd < wd.last; ++jd) {
    const int64_t id = wd.start + jd * s.dilation[0];
    for (int64_t jh = wh.first; jh < wh.last; ++jh) {
      const int64_t ih = wh.start + jh * s.dilation[1];
      for (int64_t jw = ww.first; jw < ww.last; ++jw) {
        const int64_t iw = ww.start + jw * s.dilation[2];
        const T v = xp[(id * H + ih) * W + iw];
        if (!found || v > best.value) {
          best = {v, id, ih, iw};
          found = true;
        }
      }
    }
  }
  return best;
}

/// MaxPool's output e (a flat index over [planes, out...]): the maximum, and its flat index
/// into X (plane * in_plane + the spatial offset, row-major or with `column_major`
/// column-major) into `index`.
template <class T>
STAGECRAFT_HOST_DEVICE T max_pool_element(const PoolShape& s, const T* x, int64_t e,
                                          bool column_major, int64_t& index) {
  const Position o = split(e, s.out);
  const WindowMax<T> m = window_max(s, x + o.plane * s.in_plane(), o);
  index = o.plane * s.in_plane() + (column_major ? m.d + m.h * s.in[0] + m.w * s.in[0] * s.in[1]
                                                 : (m.d * s.in[1] + m.h) * s.in[2] + m.w);
  return m.value;
}

/// The row-major offset in its plane of output e's first maximum (MaxPoolGrad's routing).
STAGECRAFT_HOST_DEVICE inline int64_t argmax_element(const PoolShape& s, const float* x,
                                                     int64_t e) {
  const Position o = split(e, s.out);
  const WindowMax<float> m = window_max(s, x + o.plane * s.in_plane(), o);
  return (m.d * s.in[1] + m.h) * s.in[2] + m.w;
}

/// The divisor of a window: its positions inside the input, or with include_pad inside the
/// explicitly padded input (never the ceil_mode extension).
STAGECRAFT_HOST_DEVICE inline float average_divisor(const Span& wd, const Span& wh, const Span& ww,
                                                    bool include_pad) {
  const int64_t count = include_pad
                            ? wd.padded * wh.padded * ww.padded
                            : (wd.last - wd.first) * (wh.last - wh.first) * (ww.last - ww.first);
  return static_cast<float>(count);
}

/// AveragePool's output e: the window's sum in float (window order) over its divisor.
STAGECRAFT_HOST_DEVICE inline float average_pool_element(const PoolShape& s, const float* x,
                                                         int64_t e, bool include_pad) {
  const Position o = split(e, s.out);
  const float* xp = x + o.plane * s.in_plane();
  const Span wd = window_along(s, 0, o.d), wh = window_along(s, 1, o.h),
             ww = window_along(s, 2, o.w);
  const int64_t H = s.in[1], W = s.in[2];
  float sum = 0.0f;
  for (int64_t jd = wd.first; jd < wd.last; ++jd) {
    const int64_t id = wd.start + jd * s.dilation[0];
    for (int64_t jh = wh.first; jh < wh.last; ++jh) {
      const int64_t ih = wh.start + jh * s.dilation[1];
      for (int64_t jw = ww.first; jw < ww.last; ++jw)
        sum += xp[(id * H + ih) * W + ww.start + jw * s.dilation[2]];
    }
  }
  return sum / average_divisor(wd, wh, ww, include_pad);
}

/// The outputs [lo, hi] along dim d whose windows span input position i:
/// o * stride - pad_l <= i <= o * stride - pad_l + (kernel - 1) * dilation. (With dilation a
/// window may span i and step over it: `reads` tells.)
struct Covering {
  int64_t lo, hi;
};

STAGECRAFT_HOST_DEVICE inline Covering covering(const PoolShape& s, int d, int64_t i) {
  const int64_t top = i + s.pad_l[d];  // o * stride <= top
  const int64_t bottom = top - (s.kernel[d] - 1) * s.dilation[d];
  return {bottom <= 0 ? 0 : (bottom + s.stride[d] - 1) / s.stride[d],
          window_detail::min64(s.out[d] - 1, top / s.stride[d])};
}

/// Whether output o's window along dim d, which spans input position i, reads it.
STAGECRAFT_HOST_DEVICE inline bool reads(const PoolShape& s, int d, int64_t o, int64_t i) {
  return (i + s.pad_l[d] - o * s.stride[d]) % s.dilation[d] == 0;
}

/// MaxPoolGrad's input element e: the sum, in output order, of dy over the windows whose first
/// maximum (`argmax`, per output as argmax_element gives it) is e.
STAGECRAFT_HOST_DEVICE inline float max_pool_grad_element(const PoolShape& s, const float* dy,
                                                          const int64_t* argmax, int64_t e) {
  const Position i = split(e, s.in);
  const int64_t here = (i.d * s.in[1] + i.h) * s.in[2] + i.w;
  const Covering cd = covering(s, 0, i.d), ch = covering(s, 1, i.h), cw = covering(s, 2, i.w);
  float sum = 0.0f;
  for (int64_t od = cd.lo; od <= cd.hi; ++od)
    for (int64_t oh = ch.lo; oh <= ch.hi; ++oh)
      for (int64_t ow = cw.lo; ow <= cw.hi; ++ow) {
        const int64_t o = i.plane * s.out_plane() + (od * s.out[1] + oh) * s.out[2] + ow;
        if (argmax[o] == here) sum += dy[o];
      }
  return sum;
}

/// AveragePoolGrad's input element e: the sum, in output order, of dy / divisor over the
/// windows that read it.
STAGECRAFT_HOST_DEVICE inline float average_pool_grad_element(const PoolShape& s, const float* dy,
                                                              int64_t e, bool include_pad) {
  const Position i = split(e, s.in);
  const Covering cd = covering(s, 0, i.d), ch = covering(s, 1, i.h), cw = covering(s, 2, i.w);
  float sum = 0.0f;
  for (int64_t od = cd.lo; od <= cd.hi; ++od) {
    if (!reads(s, 0, od, i.d)) continue;
    const Span wd = window_along(s, 0, od);
    for (int64_t oh = ch.lo; oh <= ch.hi; ++oh) {
      if (!reads(s, 1, oh, i.h)) continue;
      const Span wh = window_along(s, 1, oh);
      for (int64_t ow = cw.lo; ow <= cw.hi; ++ow) {
        if (!reads(s, 2, ow, i.w)) continue;
        const Span ww = window_along(s, 2, ow);
        const int64_t o = i.plane * s.out_plane() + (od * s.out[1] + oh) * s.out[2] + ow;
        sum += dy[o] / average_divisor(wd, wh, ww, include_pad);
      }
    }
  }
  return sum;
}

}  // namespace stagecraft::rt::cuda
