#pragma once
/// \file
/// Pad's host-side rules, shared by the CPU kernels (runtime/cpu/pad.cpp) and the CUDA ones
/// (runtime/cuda/pad.cpp): the mode, the pads (input 1 from opset 11, the attribute `pads`
/// before), the output shape, which input index each output index reads along each dim, and
/// the constant in X's dtype. Both backends read a Pad node through these, so they pad, crop and
/// refuse alike.

#include <fmt/format.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/layout.h"

namespace stagecraft::rt::ops {

enum class PadMode { kConstant, kReflect, kEdge };

/// Where each output element reads from: per dim, per output index, the input index along that
/// dim, or -1 for the constant.
struct PadGeometry {
  PadMode mode = PadMode::kConstant;
  Shape y_shape;
  std::vector<std::vector<int64_t>> source;
};

/// The node's `mode` attribute; throws `Error(kUnsupported)` for another mode.
inline PadMode pad_mode(const KernelArgs& a) {
  const std::string mode = a.attrs.s("mode", "constant");
  if (mode == "constant") return PadMode::kConstant;
  if (mode == "reflect") return PadMode::kReflect;
  if (mode == "edge") return PadMode::kEdge;
  fail(ErrorKind::kUnsupported, "Pad '{}': mode '{}' is not supported (constant, reflect, edge)",
       a.name, mode);
}

/// The input index that output index `o` of a dim of `n` elements, `begin` of them padded before,
/// reads in `mode`; -1 for the constant. Reflect mirrors about the first and last elements and
/// repeats the mirror for pads longer than the dim, as numpy.pad (ONNX's reference) does.
inline int64_t pad_source(PadMode mode, int64_t o, int64_t begin, int64_t n) {
  const int64_t i = o - begin;
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case PadMode::kConstant:
      return -1;
    case PadMode::kEdge:
      return i < 0 ? 0 : n - 1;
    case PadMode::kReflect: {
      if (n == 1) return 0;
      const int64_t period = 2 * (n - 1);
      const int64_t m = ((i % period) + period) % period;
      return m < n ? m : period - m;
    }
  }
  return -1;
}

/// The geometry of a Pad of X (shape `x_shape`); `pads_input` is the pads operand in host
/// memory (null in the attribute form of opsets 2-10). Negative pads crop; a dim cropped below
/// zero, or an empty dim padded in reflect or edge mode, is a model error.
inline PadGeometry pad_geometry(const KernelArgs& a, const Shape& x_shape,
                                const Tensor* pads_input) {
  PadGeometry g;
  g.mode = pad_mode(a);
  std::vector<int64_t> pads;
  if (a.attrs.has("pads")) {
    pads = a.attrs.ints("pads");
  } else {
    if (pads_input == nullptr) fail(ErrorKind::kModel, "Pad '{}' has no pads input", a.name);
    pads = read_ints(a, *pads_input, 1);
  }
  const size_t rank = x_shape.size();
  if (pads.size() != 2 * rank)
    fail(ErrorKind::kModel, "Pad '{}': {} pads for a rank-{} input {} (expected {})", a.name,
         pads.size(), rank, shape_string(x_shape), 2 * rank);
  g.source.resize(rank);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t n = x_shape[d], begin = pads[d], end = pads[d + rank];
    const int64_t out = n + begin + end;
    if (out < 0)
      fail(ErrorKind::kModel, "Pad '{}': pads {} and {} leave dim {} of size {} below zero", a.name,
           begin, end, d, n);
    if (n == 0 && out > 0 && g.mode != PadMode::kConstant)
      fail(ErrorKind::kModel, "Pad '{}': {} padding of dim {}, which is empty", a.name,
           a.attrs.s("mode", "constant"), d);
    g.y_shape.push_back(out);
    g.source[d].resize(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) g.source[d][o] = pad_source(g.mode, o, begin, n);
  }
  return g;
}

/// One element of the constant in X's dtype: `constant` (input 2, in host memory; null when
/// omitted), else the attribute `value` (opsets 2-10), else 0.
inline std::vector<std::byte> pad_constant(const KernelArgs& a, const Tensor& x,
                                           const Tensor* constant) {
  const size_t size = static_cast<size_t>(dtype_size(x.dtype));
  std::vector<std::byte> bytes(size, std::byte{0});
  if (constant != nullptr) {
    const Tensor& c = *constant;
    if (c.dtype != x.dtype || c.numel() != 1)
      fail(ErrorKind::kModel, "Pad '{}': constant_value is {}, expected one {} element", a.name,
           c.describe(), dtype_name(x.dtype));
    std::memcpy(bytes.data(), c.data, size);
    return bytes;
  }
  const float value = a.attrs.f("value", 0.0f);
  auto put = [&](auto v) { std::memcpy(bytes.data(), &v, sizeof(v)); };
  switch (x.dtype) {
    case DType::kFloat32:
      put(value);
      break;
    case DType::kFloat64:
      put(static_cast<double>(value));
      break;
    case DType::kInt32:
      put(static_cast<int32_t>(value));
      break;
    case DType::kInt64:
      put(static_cast<int64_t>(value));
      break;
    case DType::kInt8:
      put(static_cast<int8_t>(value));
      break;
    case DType::kUInt8:
    case DType::kBool:
      put(static_cast<uint8_t>(value));
      break;
    default:
      fail(ErrorKind::kUnsupported, "Pad '{}' on {} is not supported", a.name, dtype_name(x.dtype));
  }
  return bytes;
}

}  // namespace stagecraft::rt::ops
