#pragma once
/// \file
/// ConvTranspose's geometry (ONNX semantics, opsets 11 to 17), shared by the CPU kernels
/// (runtime/cpu/conv_transpose.cpp: oneDNN's deconvolution), the CUDA ones
/// (runtime/cuda/conv_transpose.cpp: cuDNN's convolution backward-data) and the import check
/// (passes/check_nodes.cpp), so all three accept, refuse and size a node alike. Each refusal is one
/// line naming the node and the numbers.
///
/// X [N, C, in...], W [C, M / group, kernel...], optional B [M]; Y [N, M, out...] with, per
/// spatial dim, the full result of s * (in - 1) + (k - 1) * d + 1 positions cropped by the pads
/// (begin, end) and extended by output_padding:
///   out = s * (in - 1) + output_padding + (k - 1) * d + 1 - begin - end.
/// The pads are the explicit `pads` (auto_pad NOTSET), none (VALID), or, where `output_shape` is
/// given or auto_pad is SAME_* (then out = in * s), the total padding the output size implies,
/// split as ONNX's reference does (floor division; the odd one after for SAME_UPPER, before
/// otherwise). A negative total (output_shape past the full result) extends the output at the
/// end as output_padding does.
///
/// ConvTranspose is the input gradient of the Conv that maps Y's shape to X's with the same W,
/// strides, dilations and pads: both libraries run it so. Their convolution takes a right pad
/// `pad_r` >= 0 with floor((out + begin + pad_r - reach) / s) + 1 = in: the end pad less the
/// output extension when that is not negative, else 0, which holds while the extension is less
/// than the stride (ONNX allows output_padding up to the stride or the dilation; a larger one is
/// refused).

#include <fmt/format.h>

#include <string>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/window.h"

namespace stagecraft::rt::ops {

/// One ConvTranspose node resolved.
struct ConvTransposeGeometry {
  Shape x, w, y;      ///< X, W and the output Y
  int64_t group = 1;  ///< C and M are x[1] and y[1]
  bool bias = false;  ///< a bias input B [M] is given
  /// Per spatial dim: strides, dilations (ONNX's, 1 is dense), the pad before and the
  /// convolution's right pad (see the file comment), all >= 0.
  std::vector<int64_t> strides, dilations, pad_l, pad_r;

  size_t spatial() const { return x.size() - 2; }
};

/// ONNX's floor division (Python's //), which splits a negative total padding.
inline int64_t floor_div2(int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }

/// Resolves a ConvTranspose of X (shape `x`) and W (shape `w`) with the node's attributes.
inline ConvTransposeGeometry conv_transpose_geometry(const KernelArgs& a, const Shape& x,
                                                     const Shape& w) {
  const std::string_view name = a.name;
  if (x.size() < 3 || x.size() > 5)
    fail(ErrorKind::kUnsupported,
         "ConvTranspose '{}' on a rank-{} input {}: 1-D to 3-D transposed convolutions only", name,
         x.size(), shape_string(x));
  if (w.size() != x.size())
    fail(ErrorKind::kModel, "ConvTranspose '{}': weights {} (rank {}) do not match the input {}",
         name, shape_string(w), w.size(), shape_string(x));
  ConvTransposeGeometry g;
  g.x = x;
  g.w = w;
  const size_t spatial = x.size() - 2;
  const int64_t c = x[1];
  g.group = a.attrs.i("group", 1);
  if (g.group < 1 || c % g.group != 0)
    fail(ErrorKind::kModel, "ConvTranspose '{}': group {} does not divide the {} input channels of {}",
         name, g.group, c, shape_string(x));
  if (w[0] != c)
    fail(ErrorKind::kModel,
         "ConvTranspose '{}': weights {} have {} input channels, the input {} has {}", name,
         shape_string(w), w[0], shape_string(x), c);
  const int64_t m = w[1] * g.group;
  const std::vector<int64_t> kernel(w.begin() + 2, w.end());
  if (a.attrs.has("kernel_shape") && a.attrs.ints("kernel_shape") != kernel)
    fail(ErrorKind::kModel, "ConvTranspose '{}': kernel_shape {} does not match the weights {}",
         name, shape_string(a.attrs.ints("kernel_shape")), shape_string(w));
  const std::vector<int64_t> strides = per_dim(a, "strides", spatial, 1);
  const std::vector<int64_t> dilations = per_dim(a, "dilations", spatial, 1);
  const std::vector<int64_t> pads = per_dim(a, "pads", 2 * spatial, 0);
  const std::vector<int64_t> output_padding = per_dim(a, "output_padding", spatial, 0);
  const std::vector<int64_t> output_shape = a.attrs.ints("output_shape");
  if (!output_shape.empty() && output_shape.size() != spatial)
    fail(ErrorKind::kModel,
         "ConvTranspose '{}': output_shape {} has {} values, the input {} has {} spatial dims",
         name, shape_string(output_shape), output_shape.size(), shape_string(x), spatial);
  const std::string auto_pad = a.attrs.s("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      auto_pad != "VALID")
    fail(ErrorKind::kModel,
         "ConvTranspose '{}': auto_pad '{}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID",
         name, auto_pad);

  g.y = {x[0], m};
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t in = x[2 + i], s = strides[i], d = dilations[i], k = kernel[i],
                  extra = output_padding[i];
    if (s < 1 || d < 1 || k < 1 || in < 1)
      fail(ErrorKind::kModel,
           "ConvTranspose '{}': spatial dim {} has stride {}, dilation {}, kernel {} and input "
           "size {}; each must be at least 1",
           name, i, s, d, k, in);
    if (extra < 0 || (extra >= s && extra >= d))
      fail(ErrorKind::kModel,
           "ConvTranspose '{}': output_padding {} of spatial dim {} must be in [0, max(stride {}, "
           "dilation {}))",
           name, extra, i, s, d);
    const int64_t reach = (k - 1) * d + 1;
    const int64_t full = s * (in - 1) + extra + reach;
    int64_t begin = 0, end = 0;
    const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
    if (!output_shape.empty() || same) {
      const int64_t wanted = output_shape.empty() ? in * s : output_shape[i];
      const int64_t total = full - wanted;
      begin = auto_pad == "SAME_UPPER" ? floor_div2(total) : total - floor_div2(total);
      end = total - begin;
    } else if (auto_pad == "NOTSET") {
      begin = pads[i];
      end = pads[spatial + i];
      if (begin < 0 || end < 0)
        fail(ErrorKind::kModel, "ConvTranspose '{}': pads {} and {} of spatial dim {} are negative",
             name, begin, end, i);
    }
    if (begin < 0)
      fail(ErrorKind::kUnsupported,
           "ConvTranspose '{}': the output of spatial dim {} would start {} positions before the "
           "first window (a negative pad before); not supported",
           name, i, -begin);
    const int64_t out = full - begin - end;
    if (out < 1)
      fail(ErrorKind::kModel,
           "ConvTranspose '{}': spatial dim {} has output size {} (the {} positions of the result "
           "less pads {} and {})",
           name, i, out, full, begin, end);
    const int64_t cut = end - extra;  // positions cropped past the last window; < 0: extended
    if (cut <= -s)
      fail(ErrorKind::kUnsupported,
           "ConvTranspose '{}': the output of spatial dim {} runs {} positions past the last "
           "window (output_padding or output_shape); at most stride - 1 = {} is supported",
           name, i, -cut, s - 1);
    g.y.push_back(out);
    g.strides.push_back(s);
    g.dilations.push_back(d);
    g.pad_l.push_back(begin);
    g.pad_r.push_back(cut > 0 ? cut : 0);
  }
  return g;
}

/// The geometry of a ConvTranspose kernel's node: X and W (inputs 0, 1), B (input 2) checked to
/// be [M], and Y (output 0) checked against the output shape.
inline ConvTransposeGeometry conv_transpose_forward_geometry(const KernelArgs& a) {
  ConvTransposeGeometry g = conv_transpose_geometry(a, a.input(0).shape, a.input(1).shape);
  if (a.has_input(2)) {
    if (a.input(2).shape != Shape{g.y[1]})
      fail(ErrorKind::kModel, "ConvTranspose '{}': bias {} should be [{}]", a.name,
           shape_string(a.input(2).shape), g.y[1]);
    g.bias = true;
  }
  expect_shape(a, 0, g.y);
  return g;
}

/// The Conv whose input gradient this ConvTranspose is, as the Conv kernels' geometry: src is
/// Y's shape, dst X's, weights W in oneDNN's grouped order ([group, C / group, M / group,
/// kernel...] when grouped).
inline ConvGeometry conv_of_transpose(const ConvTransposeGeometry& g) {
  ConvGeometry c;
  c.src = g.y;
  c.dst = g.x;
  c.weights = g.w;
  if (g.group > 1) {
    c.weights[0] = g.w[0] / g.group;
    c.weights.insert(c.weights.begin(), g.group);
  }
  c.bias = 0;
  c.strides = g.strides;
  for (int64_t d : g.dilations) c.dilates.push_back(d - 1);
  c.pad_l = g.pad_l;
  c.pad_r = g.pad_r;
  return c;
}

}  // namespace stagecraft::rt::ops
