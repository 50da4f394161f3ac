#pragma once
/// \file
/// Resize's host-side rules, shared by the CPU kernels (runtime/cpu/resize.cpp), the CUDA ones
/// (runtime/cuda/resize.cpp) and the importer's check (compiler/import.cpp): the attributes
/// stagecraft runs, the output shape from scales or sizes, and per dim which input indices each
/// output index reads with which weights (ONNX's reference, onnx/backend/test/case/node/
/// resize.py, for modes nearest, linear and cubic). Everything reads a Resize node through these,
/// so both backends and the compiler accept, refuse and interpolate alike.
///
/// Opsets 11 and 13 (inputs X, roi, scales, sizes; an empty tensor counts as omitted); opset
/// 10's two-input form is refused. Coordinate modes half_pixel, pytorch_half_pixel,
/// align_corners, asymmetric and tf_half_pixel_for_nn; tf_crop_and_resize (which reads roi) is
/// refused. exclude_outside changes nothing for nearest and linear (their taps outside the input
/// are the edge element, which is what renormalising gives); for cubic it zeroes the taps outside
/// and renormalises the rest, as the reference does.

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/resize_element.h"

namespace stagecraft::rt::ops {

enum class ResizeMode { kNearest, kLinear, kCubic };
enum class ResizeCoordinates {
  kHalfPixel,
  kPytorchHalfPixel,
  kAlignCorners,
  kAsymmetric,
  kTfHalfPixelForNn
};
enum class NearestRounding { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil };

/// A Resize node's attributes, as the kernels run them.
struct ResizeAttributes {
  ResizeMode mode = ResizeMode::kNearest;
  ResizeCoordinates coordinates = ResizeCoordinates::kHalfPixel;
  NearestRounding rounding = NearestRounding::kRoundPreferFloor;
  double cubic_a = -0.75;        ///< cubic_coeff_a (torch's bicubic: -0.75, ONNX's default)
  bool exclude_outside = false;  ///< cubic: taps outside the input weigh 0, the rest renormalised
};

/// The attributes of a Resize node, or (`error` not empty) one line saying which value of which
/// attribute stagecraft does not run.
struct ResizeAttributesOr {
  ResizeAttributes attributes;
  std::string error;
};

inline ResizeAttributesOr read_resize_attributes(const Attrs& attrs) {
  ResizeAttributesOr r;
  const std::string mode = attrs.s("mode", "nearest");
  if (mode == "nearest") {
    r.attributes.mode = ResizeMode::kNearest;
  } else if (mode == "linear") {
    r.attributes.mode = ResizeMode::kLinear;
  } else if (mode == "cubic") {
    r.attributes.mode = ResizeMode::kCubic;
    r.attributes.cubic_a = attrs.f("cubic_coeff_a", -0.75f);
    r.attributes.exclude_outside = attrs.i("exclude_outside", 0) != 0;
  } else {
    r.error = fmt::format("Resize mode '{}' is not an ONNX mode (nearest, linear, cubic)", mode);
    return r;
  }
  const std::string coordinates = attrs.s("coordinate_transformation_mode", "half_pixel");
  if (coordinates == "half_pixel") {
    r.attributes.coordinates = ResizeCoordinates::kHalfPixel;
  } else if (coordinates == "pytorch_half_pixel") {
    r.attributes.coordinates = ResizeCoordinates::kPytorchHalfPixel;
  } else if (coordinates == "align_corners") {
    r.attributes.coordinates = ResizeCoordinates::kAlignCorners;
  } else if (coordinates == "asymmetric") {
    r.attributes.coordinates = ResizeCoordinates::kAsymmetric;
  } else if (coordinates == "tf_half_pixel_for_nn") {
    r.attributes.coordinates = ResizeCoordinates::kTfHalfPixelForNn;
  } else {
    r.error = fmt::format(
        "Resize coordinate_transformation_mode '{}' is not supported (half_pixel, "
        "pytorch_half_pixel, align_corners, asymmetric, tf_half_pixel_for_nn)",
        coordinates);
    return r;
  }
  const std::string rounding = attrs.s("nearest_mode", "round_prefer_floor");
  if (rounding == "round_prefer_floor") {
    r.attributes.rounding = NearestRounding::kRoundPreferFloor;
  } else if (rounding == "round_prefer_ceil") {
    r.attributes.rounding = NearestRounding::kRoundPreferCeil;
  } else if (rounding == "floor") {
    r.attributes.rounding = NearestRounding::kFloor;
  } else if (rounding == "ceil") {
    r.attributes.rounding = NearestRounding::kCeil;
  } else {
    r.error = fmt::format(
        "Resize nearest_mode '{}' is not an ONNX mode (round_prefer_floor, round_prefer_ceil, "
        "floor, ceil)",
        rounding);
  }
  return r;
}

/// The per-dim scales of a Resize of X (shape `x_shape`) and its output shape: from `sizes`
/// when given (the scale of dim d is then sizes[d] / x_shape[d]), else from `scales` (output
/// dim floor(x_shape[d] * scales[d]), in float as ONNX's shape inference computes it). A scale
/// is kept as a ratio, so that dividing by it is exact wherever the quotient is an integer (a
/// size of 4 from 6 maps output 2 to input 3, not to 2.9999998 as a float scale of 0.6666667
/// would, and as torch's nearest does).
struct ResizeScales {
  Shape y_shape;
  /// Per dim, scale = scale_numerator / scale_denominator: sizes[d] / x_shape[d], or scales[d]
  /// / 1.
  std::vector<double> scale_numerator, scale_denominator;
  /// Per dim, the output length the coordinate formulas use: sizes[d], or x_shape[d] * scale
  /// (not rounded, as ONNX's reference has it).
  std::vector<double> resized_length;
};

/// `scales` and `sizes` are the operands in host memory, null when omitted (an empty one
/// counts as omitted). Throws `Error(kModel)` naming the node and the values when neither or
/// both are given, their length is not X's rank, or a scale or size is not positive.
inline ResizeScales resize_scales(const KernelArgs& a, const Shape& x_shape, const Tensor* scales,
                                  const Tensor* sizes) {
  if (scales != nullptr && scales->numel() == 0) scales = nullptr;
  if (sizes != nullptr && sizes->numel() == 0) sizes = nullptr;
  const size_t rank = x_shape.size();
  ResizeScales s;
  if ((scales == nullptr) == (sizes == nullptr))
    fail(ErrorKind::kModel, "Resize '{}' needs exactly one of scales and sizes; it has {}", a.name,
         scales == nullptr ? "neither" : "both");
  if (sizes != nullptr) {
    const std::vector<int64_t> values = read_ints(a, *sizes, 3);
    if (values.size() != rank)
      fail(ErrorKind::kModel, "Resize '{}': {} sizes for a rank-{} input {}", a.name, values.size(),
           rank, shape_string(x_shape));
    for (size_t d = 0; d < rank; ++d) {
      if (values[d] <= 0 || x_shape[d] <= 0)
        fail(ErrorKind::kModel, "Resize '{}': size {} of dim {} (input {}) must be positive",
             a.name, values[d], d, shape_string(x_shape));
      s.y_shape.push_back(values[d]);
      s.scale_numerator.push_back(static_cast<double>(values[d]));
      s.scale_denominator.push_back(static_cast<double>(x_shape[d]));
      s.resized_length.push_back(static_cast<double>(values[d]));
    }
    return s;
  }
  if (scales->dtype != DType::kFloat32)
    fail(ErrorKind::kModel, "Resize '{}': scales are {}, expected float32", a.name,
         dtype_name(scales->dtype));
  if (static_cast<size_t>(scales->numel()) != rank)
    fail(ErrorKind::kModel, "Resize '{}': {} scales for a rank-{} input {}", a.name,
         scales->numel(), rank, shape_string(x_shape));
  for (size_t d = 0; d < rank; ++d) {
    const float scale = scales->as<float>()[d];
    if (!(scale > 0.0f) || !std::isfinite(scale))
      fail(ErrorKind::kModel, "Resize '{}': scale {} of dim {} must be positive and finite", a.name,
           scale, d);
    const float length = static_cast<float>(x_shape[d]) * scale;
    if (!(length < 9.0e18f))
      fail(ErrorKind::kModel, "Resize '{}': scale {} of dim {} gives {} elements", a.name, scale, d,
           length);
    s.y_shape.push_back(static_cast<int64_t>(std::floor(length)));
    s.scale_numerator.push_back(scale);
    s.scale_denominator.push_back(1.0);
    s.resized_length.push_back(static_cast<double>(x_shape[d]) * scale);
  }
  return s;
}

/// Where output index `o` of a dim reads, in input coordinates (before rounding or clamping):
/// ONNX's coordinate_transformation_mode formulas for a dim of `length` input elements resized
/// by scale = `numerator` / `denominator` to `resized` elements (ResizeScales), in double.
inline double resize_source_coordinate(ResizeCoordinates mode, int64_t o, double numerator,
                                       double denominator, double resized, int64_t length) {
  const double x = static_cast<double>(o);
  auto unscale = [&](double v) { return v * denominator / numerator; };
  switch (mode) {
    case ResizeCoordinates::kHalfPixel:
      return unscale(x + 0.5) - 0.5;
    case ResizeCoordinates::kPytorchHalfPixel:
      return resized > 1.0 ? unscale(x + 0.5) - 0.5 : 0.0;
    case ResizeCoordinates::kAlignCorners:
      return resized == 1.0 ? 0.0 : x * static_cast<double>(length - 1) / (resized - 1.0);
    case ResizeCoordinates::kAsymmetric:
      return unscale(x);
    case ResizeCoordinates::kTfHalfPixelForNn:
      return unscale(x + 0.5);
  }
  return x;
}

/// A Resize node resolved: the output shape and, per dim, the taps of every output index
/// (input indices, not yet multiplied by a stride, and their weights).
struct ResizeGeometry {
  ResizeAttributes attributes;
  Shape x_shape, y_shape;
  std::vector<SeparableDim> taps;  ///< Offsets in input indices along the dim.
};

/// Cubic's four taps at the coordinate's floor i and fraction r (ONNX's reference: r taken as 1,
/// at the index below, where the coordinate is an integer, so the weights are 0, 0, 1, 0): input
/// indices i - 1 .. i + 2 with Keys' weights for coefficient a; with `exclude_outside`, those
/// outside [0, length) weigh 0 and the rest are renormalised; indices clamped (the edge element).
inline void cubic_taps(SeparableDim& dim, const ResizeAttributes& at, int64_t length, int64_t i,
                       double r) {
  if (r == 0.0) {
    i -= 1;
    r = 1.0;
  }
  const double a = at.cubic_a;
  auto far = [a](double t) { return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a; };  // 1 < t < 2
  auto near = [a](double t) { return ((a + 2) * t - (a + 3)) * t * t + 1; };       // t <= 1
  double w[4] = {far(r + 1), near(r), near(1 - r), far(2 - r)};
  if (at.exclude_outside) {
    double sum = 0;
    for (int k = 0; k < 4; ++k) {
      const int64_t index = i - 1 + k;
      if (index < 0 || index >= length) w[k] = 0;
      sum += w[k];
    }
    for (double& v : w) v = sum != 0 ? v / sum : 0;
  }
  for (int k = 0; k < 4; ++k) {
    if (w[k] == 0.0) continue;
    const int64_t index = i - 1 + k;
    dim.add(index < 0 ? 0 : (index >= length ? length - 1 : index), static_cast<float>(w[k]));
  }
}

/// The taps of one dim: nearest reads the input index its rounding picks; linear reads the two
/// indices around the coordinate, weights 1 - r and r, or only the first where r is 0 for every
/// output index of the dim (a dim left at its size); cubic reads four (`cubic_taps`). Indices
/// past either end are clamped (the reference pads with the edge element).
inline SeparableDim resize_dim_taps(const ResizeAttributes& at, int64_t length, int64_t out,
                                    double numerator, double denominator, double resized) {
  SeparableDim dim;
  auto clamp = [&](int64_t i) { return i < 0 ? 0 : (i >= length ? length - 1 : i); };
  std::vector<int64_t> low(static_cast<size_t>(out));
  std::vector<double> ratio(static_cast<size_t>(out));
  bool two = false;
  for (int64_t o = 0; o < out; ++o) {
    const double c =
        resize_source_coordinate(at.coordinates, o, numerator, denominator, resized, length);
    const double f = std::floor(c);
    low[o] = static_cast<int64_t>(f);
    ratio[o] = c - f;
    two = two || ratio[o] != 0.0;
  }
  for (int64_t o = 0; o < out; ++o) {
    const double r = ratio[o];
    if (at.mode == ResizeMode::kNearest) {
      bool up = false;
      if (r != 0.0) {
        switch (at.rounding) {
          case NearestRounding::kRoundPreferFloor:
            up = r > 0.5;
            break;
          case NearestRounding::kRoundPreferCeil:
            up = r >= 0.5;
            break;
          case NearestRounding::kFloor:
            up = false;
            break;
          case NearestRounding::kCeil:
            up = true;
            break;
        }
      }
      dim.add(clamp(low[o] + (up ? 1 : 0)), 1.0f);
    } else if (at.mode == ResizeMode::kCubic) {
      cubic_taps(dim, at, length, low[o], r);
    } else {
      dim.add(clamp(low[o]), static_cast<float>(1.0 - r));
      if (two) dim.add(clamp(low[o] + 1), static_cast<float>(r));
    }
    dim.close();
  }
  return dim;
}

/// The geometry of a Resize of X (shape `x_shape`), its scales and sizes operands in host
/// memory (null when omitted). Throws naming the node for an attribute it does not run, a rank
/// past kMaxResizeRank, or scales and sizes that break `resize_scales`.
inline ResizeGeometry resize_geometry(const KernelArgs& a, const Shape& x_shape,
                                      const Tensor* scales, const Tensor* sizes) {
  const ResizeAttributesOr read = read_resize_attributes(a.attrs);
  if (!read.error.empty()) fail(ErrorKind::kUnsupported, "Resize '{}': {}", a.name, read.error);
  if (x_shape.size() > static_cast<size_t>(kMaxResizeRank))
    fail(ErrorKind::kUnsupported, "Resize '{}' of a rank-{} input: at most rank {}", a.name,
         x_shape.size(), kMaxResizeRank);
  ResizeGeometry g;
  g.attributes = read.attributes;
  g.x_shape = x_shape;
  const ResizeScales s = resize_scales(a, x_shape, scales, sizes);
  g.y_shape = s.y_shape;
  for (size_t d = 0; d < x_shape.size(); ++d)
    g.taps.push_back(resize_dim_taps(g.attributes, x_shape[d], g.y_shape[d], s.scale_numerator[d],
                                     s.scale_denominator[d], s.resized_length[d]));
  return g;
}

/// The forward table: destination Y, each output index's taps as offsets into X.
inline SeparableTableData resize_forward_tables(const ResizeGeometry& g) {
  const std::vector<int64_t> x_strides = dense_strides(g.x_shape);
  std::vector<SeparableDim> dims = g.taps;
  for (size_t d = 0; d < dims.size(); ++d)
    for (int64_t& offset : dims[d].offsets) offset *= x_strides[d];
  return separable_tables(dims);
}

/// The gradient's table: destination X; along each dim, input index i is read by every output
/// index with a tap on i (in ascending output order, a tap of weight 0 left out), with that
/// tap's weight, as offsets into dY.
inline SeparableTableData resize_gradient_tables(const ResizeGeometry& g) {
  const std::vector<int64_t> y_strides = dense_strides(g.y_shape);
  std::vector<SeparableDim> dims(g.taps.size());
  for (size_t d = 0; d < g.taps.size(); ++d) {
    const SeparableDim& taps = g.taps[d];
    std::vector<std::vector<std::pair<int64_t, float>>> readers(static_cast<size_t>(g.x_shape[d]));
    for (size_t o = 0; o + 1 < taps.bounds.size(); ++o)
      for (int64_t k = taps.bounds[o]; k < taps.bounds[o + 1]; ++k)
        if (taps.weights[k] != 0.0f)
          readers[taps.offsets[k]].emplace_back(static_cast<int64_t>(o) * y_strides[d],
                                                taps.weights[k]);
    for (const auto& list : readers) {
      for (const auto& [offset, weight] : list) dims[d].add(offset, weight);
      dims[d].close();
    }
  }
  return separable_tables(dims);
}

}  // namespace stagecraft::rt::ops
