// Pad and its gradient (see families.h). Pad (opsets 2-17): pads as input 1 (opset 11+) or as
// the attribute `pads` (opsets 2-10), the constant as the optional input 2 or the attribute
// `value`; modes constant, reflect and edge; negative pads crop. Opset 18's `axes` input is
// not supported (stagecraft imports opsets <= 17). The forward kernel moves elements of any
// fixed-size dtype; PadGrad (float32, contract: runtime/format/grad_ops.h) gives dx[i] = the
// sum of dy over every output position that reads x[i]: the inner block for constant mode, the
// mirrored or replicated positions as well for reflect and edge.
#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/pad_shape.h"

namespace stagecraft::rt::cpu {

namespace {

// Loops over at least this many elements use all of the worker's threads.
constexpr int64_t kParallelElements = int64_t{1} << 15;

// Output row r (every dim but the last) -> the offset of the input row it reads, or -1 when the
// row lies in the constant padding.
int64_t source_row(const ops::PadGeometry& g, const std::vector<int64_t>& x_strides, int64_t r) {
  int64_t offset = 0;
  for (int64_t d = static_cast<int64_t>(g.y_shape.size()) - 2; d >= 0; --d) {
    const int64_t s = g.source[d][r % g.y_shape[d]];
    r /= g.y_shape[d];
    if (s < 0) return -1;
    offset += s * x_strides[d];
  }
  return offset;
}

template <class T>
void pad_typed(const Tensor& x, Tensor& y, const ops::PadGeometry& g, const std::byte* constant) {
  T value;
  std::memcpy(&value, constant, sizeof(T));
  const T* src = x.as<T>();
  T* dst = y.as<T>();
  if (g.y_shape.empty()) {
    dst[0] = src[0];
    return;
  }
  const std::vector<int64_t> x_strides = ops::dense_strides(x.shape);
  const std::vector<int64_t>& inner_source = g.source.back();
  const int64_t inner = g.y_shape.back();
  const int64_t rows = inner == 0 ? 0 : y.numel() / inner;
#pragma omp parallel for if (y.numel() >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    T* out = dst + r * inner;
    const int64_t base = source_row(g, x_strides, r);
    if (base < 0) {
      for (int64_t j = 0; j < inner; ++j) out[j] = value;
      continue;
    }
    const T* in = src + base;
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t s = inner_source[j];
      out[j] = s < 0 ? value : in[s];
    }
  }
}

void pad(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::PadGeometry g = ops::pad_geometry(a, x.shape, a.has_input(1) ? a.in[1] : nullptr);
  expect_shape(a, 0, g.y_shape);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  const std::vector<std::byte> constant =
      ops::pad_constant(a, x, a.has_input(2) ? a.in[2] : nullptr);
  switch (dtype_size(x.dtype)) {
    case 1:
      return pad_typed<uint8_t>(x, y, g, constant.data());
    case 4:
      return pad_typed<uint32_t>(x, y, g, constant.data());
    case 8:
      return pad_typed<uint64_t>(x, y, g, constant.data());
    default:
      fail(ErrorKind::kUnsupported, "Pad '{}' on {} is not supported", a.name, dtype_name(x.dtype));
  }
}

// dx[i] = sum of dy[o] over every output position o that reads x[i]. Each dx row gathers from
// the dy rows that read it (the product of each outer dim's readers), in ascending order, so the
// result does not depend on the thread count.
void pad_grad(const KernelArgs& a) {
  ops::GradIo io(a, {.n_min = 1, .n_max = 3, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (!io.input0(dx, dy, x)) return;
  const ops::PadGeometry g = ops::pad_geometry(a, x->shape, io.x(1));
  ops::expect_dy_shape(a, *dy, g.y_shape);
  float* dxs = dx->as<float>();
  if (dx->numel() == 0) return;
  if (x->shape.empty()) {
    dxs[0] = dy->as<float>()[0];
    return;
  }
  // readers[d][i]: the dy offsets along dim d (index times dy's stride) that read index i.
  const size_t rank = x->shape.size();
  const std::vector<int64_t> dy_strides = ops::dense_strides(g.y_shape);
  std::vector<std::vector<std::vector<int64_t>>> readers(rank);
  for (size_t d = 0; d < rank; ++d) {
    readers[d].resize(static_cast<size_t>(x->shape[d]));
    for (int64_t o = 0; o < g.y_shape[d]; ++o)
      if (const int64_t s = g.source[d][o]; s >= 0) readers[d][s].push_back(o * dy_strides[d]);
  }
  const float* dys = dy->as<float>();
  const int64_t inner = x->shape.back();
  const int64_t rows = dx->numel() / inner;
  const auto& inner_readers = readers.back();
#pragma omp parallel if (dy->numel() >= kParallelElements)
  {
    std::vector<int64_t> bases, next, index(rank - 1);
#pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
      bases.assign(1, 0);
      int64_t rest = r;
      for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
        index[d] = rest % x->shape[d];
        rest /= x->shape[d];
      }
      for (size_t d = 0; d + 1 < rank; ++d) {
        next.clear();
        for (int64_t base : bases)
          for (int64_t off : readers[d][index[d]]) next.push_back(base + off);
        bases.swap(next);
      }
      float* out = dxs + r * inner;
      for (int64_t j = 0; j < inner; ++j) {
        float sum = 0.0f;
        for (int64_t base : bases)
          for (int64_t off : inner_readers[j]) sum += dys[base + off];
        out[j] = sum;
      }
    }
  }
}

std::string check_pad(const OpSignature& s) {
  if (s.inputs.empty() || s.inputs.size() > 3 || s.outputs.size() != 1)
    return fmt::format(
        "Pad with {} inputs and {} outputs is not supported (data, pads, constant_value; opset "
        "18's axes input is not)",
        s.inputs.size(), s.outputs.size());
  const DType d = s.inputs[0];
  if (d == DType::kUndefined || d == DType::kString || d == DType::kFloat16 ||
      d == DType::kComplex64 || d == DType::kComplex128 || d == DType::kUInt16 ||
      d == DType::kInt16 || d == DType::kUInt32 || d == DType::kUInt64)
    return fmt::format(
        "Pad on {} is not supported (float32, float64, int32, int64, int8, uint8, bool)",
        dtype_name(d));
  if (s.outputs[0] != d)
    return fmt::format("Pad from {} to {} is not a valid signature", dtype_name(d),
                       dtype_name(s.outputs[0]));
  if (s.inputs.size() > 1 && s.inputs[1] != DType::kInt64)
    return fmt::format("Pad's pads are {}, expected int64", dtype_name(s.inputs[1]));
  if (s.inputs.size() > 2 && s.inputs[2] != DType::kUndefined && s.inputs[2] != d)
    return fmt::format("Pad's constant_value is {} but its data is {}", dtype_name(s.inputs[2]),
                       dtype_name(d));
  return "";
}

std::string check_pad_grad(const OpSignature& s) {
  const ops::GradArity arity{.n_min = 1, .n_max = 3, .m_min = 1, .m_max = 1};
  if (auto why = ops::grad_arity_error(s, arity); !why.empty()) return why;
  const size_t n = s.outputs.size();
  const DType dy = s.inputs[n + 1];
  if (dy != DType::kFloat32 && dy != DType::kUndefined)
    return fmt::format("PadGrad with a {} output gradient is not supported (float32 only)",
                       dtype_name(dy));
  if (s.outputs[0] != DType::kUndefined &&
      (s.outputs[0] != DType::kFloat32 || s.inputs[0] != DType::kFloat32))
    return fmt::format("PadGrad of a {} input is not supported (float32 only)",
                       dtype_name(s.inputs[0]));
  for (size_t k = 1; k < n; ++k)
    if (s.outputs[k] != DType::kUndefined)
      return "PadGrad gives no gradient of pads or constant_value";
  return "";
}

// The gradient writes every element of dx (or zeroes it when dy is omitted).
constexpr KernelEntry kKernels[] = {
    {"Pad", pad, check_pad},
    {"PadGrad", pad_grad, check_pad_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> pad_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
