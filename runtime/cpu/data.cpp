// Kernels of the data family (see families.h): ops that move elements without arithmetic.
// They work on every fixed-size dtype by copying elements as opaque chunks of their size, and
// they recompute the output shape from their inputs and attributes to check it against the
// shape the compiler recorded, so a disagreement is an error rather than a wrong result.
//
// Transpose, Slice and Expand are one primitive: a dense output read from the input through
// per-dimension strides (permuted, stepped or zero for a broadcast dim).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/data_shape.h"
#include "runtime/ops/layout.h"

namespace stagecraft::rt::cpu {

namespace {

// Copies at least this many bytes use all of the worker's threads.
constexpr int64_t kParallelBytes = int64_t{1} << 18;

// An element moved as an opaque value of N bytes.
template <int N>
struct Chunk {
  std::byte bytes[N];
};

// Calls `body(Chunk<size>{})` for an element size of 1, 2, 4, 8 or 16 bytes.
template <class Body>
void by_element_size(int64_t size, Body&& body) {
  switch (size) {
    case 1: body(Chunk<1>{}); return;
    case 2: body(Chunk<2>{}); return;
    case 4: body(Chunk<4>{}); return;
    case 8: body(Chunk<8>{}); return;
    case 16: body(Chunk<16>{}); return;
    default: fail(ErrorKind::kUnsupported, "elements of {} bytes cannot be moved", size);
  }
}

// memcpy for possibly large, possibly empty ranges.
void copy_bytes(std::byte* dst, const std::byte* src, int64_t bytes) {
  if (bytes <= 0) return;
  if (bytes < kParallelBytes) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
  constexpr int64_t kBlock = int64_t{1} << 16;
  int64_t blocks = (bytes + kBlock - 1) / kBlock;
#pragma omp parallel for
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t begin = b * kBlock;
    std::memcpy(dst + begin, src + begin, static_cast<size_t>(std::min(kBlock, bytes - begin)));
  }
}

// Fills the dense `out` (shape `shape`) with input elements: the element at coordinate c is
// `in[base + sum(c[d] * strides[d])]` (strides in elements, possibly zero or negative).
void strided_copy(const Tensor& in, Tensor& out, Shape shape, std::vector<int64_t> strides, int64_t base) {
  if (shape_numel(shape) == 0) return;
  // Named references, not a structured binding: clang 14 (the fuzzing build) cannot use a
  // binding inside the OpenMP region below.
  const ops::StridedWalk walk = ops::merge_strided_dims(shape, strides);
  const auto& dims = walk.dims;
  const auto& steps = walk.steps;
  by_element_size(dtype_size(in.dtype), [&](auto tag) {
    using T = decltype(tag);
    const T* src = in.as<T>() + base;
    T* dst = out.as<T>();
    const int64_t rank = static_cast<int64_t>(dims.size());
    const int64_t inner = dims.back(), step = steps.back();
    const int64_t rows = shape_numel(dims) / inner;
#pragma omp parallel for if (rows * inner * static_cast<int64_t>(sizeof(T)) >= kParallelBytes)
    for (int64_t r = 0; r < rows; ++r) {
      int64_t offset = 0, rest = r;
      for (int64_t d = rank - 2; d >= 0; --d) {
        offset += (rest % dims[d]) * steps[d];
        rest /= dims[d];
      }
      const T* from = src + offset;
      T* to = dst + r * inner;
      if (step == 1) {
        std::memcpy(to, from, static_cast<size_t>(inner) * sizeof(T));
      } else {
        for (int64_t i = 0; i < inner; ++i) to[i] = from[i * step];
      }
    }
  });
}

// The values of input `k`, which must be int32 or int64.
std::vector<int64_t> read_ints(const KernelArgs& a, size_t k) {
  return ops::read_ints(a, a.input(k), k);
}

// An axis list from attribute `name` or, when absent, from input `k`; empty when neither.
std::vector<int64_t> axes_from(const KernelArgs& a, std::string_view name, size_t k) {
  return ops::axes_from(a, name, k, [&](size_t input) { return read_ints(a, input); });
}

// Output 0 takes input 0's bytes unchanged (ops that only change the shape).
void copy_through(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  Tensor& out = *a.out[0];
  if (in.bytes() != out.bytes())
    fail(ErrorKind::kShape, "{} maps {} onto {}: the element counts differ", a.op_type, in.describe(), out.describe());
  if (in.data != out.data) copy_bytes(out.data, in.data, out.bytes());
}

void identity(const KernelArgs& a) {
  expect_shape(a, 0, a.input(0).shape);
  copy_through(a);
}

// Reshape: the target shape from input 1 (0 copies the input dim unless allowzero, -1 is
// inferred).
void reshape(const KernelArgs& a) {
  expect_shape(a, 0, ops::reshape_shape(a, a.input(0).shape, read_ints(a, 1)));
  copy_through(a);
}

void flatten(const KernelArgs& a) {
  expect_shape(a, 0, ops::flatten_shape(a, a.input(0).shape));
  copy_through(a);
}

// Squeeze: the listed axes (or every size-1 dim) removed.
void squeeze(const KernelArgs& a) {
  expect_shape(a, 0, ops::squeeze_shape(a, a.input(0).shape, axes_from(a, "axes", 1)));
  copy_through(a);
}

// Unsqueeze: size-1 dims inserted at the listed axes of the output.
void unsqueeze(const KernelArgs& a) {
  expect_shape(a, 0, ops::unsqueeze_shape(a, a.input(0).shape, axes_from(a, "axes", 1)));
  copy_through(a);
}

// Transpose: output dim d is input dim perm[d] (default: the dims reversed).
void transpose(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  std::vector<int64_t> in_strides = ops::dense_strides(in.shape), strides;
  Shape expected;
  for (int64_t d : ops::transpose_perm(a, in.rank())) {
    expected.push_back(in.shape[d]);
    strides.push_back(in_strides[d]);
  }
  expect_shape(a, 0, expected);
  strided_copy(in, *a.out[0], expected, strides, 0);
}

// Concat: each output row (the dims before `axis`) is the inputs' rows one after another.
void concat(const KernelArgs& a) {
  Tensor& out = *a.out[0];
  const Tensor& first = a.input(0);
  int64_t axis = ops::normalize_axis(a, a.attrs.required_i("axis"), first.rank());
  Shape expected = first.shape;
  expected[axis] = 0;
  for (size_t k = 0; k < a.num_inputs(); ++k) {
    const Tensor& in = a.input(k);
    bool same = in.rank() == first.rank();
    for (int64_t d = 0; same && d < in.rank(); ++d) same = d == axis || in.shape[d] == first.shape[d];
    if (!same)
      fail(ErrorKind::kShape, "Concat along axis {} of {} and {}: the other dims differ", axis, first.describe(),
           in.describe());
    expected[axis] += in.shape[axis];
  }
  expect_shape(a, 0, expected);
  int64_t rows = 1;
  for (int64_t d = 0; d < axis; ++d) rows *= expected[d];
  int64_t row_bytes = out.bytes() / std::max<int64_t>(rows, 1);
  if (out.bytes() == 0) return;
  // Where each input's part of a row starts, in bytes.
  std::vector<int64_t> starts, sizes;
  int64_t start = 0;
  for (size_t k = 0; k < a.num_inputs(); ++k) {
    int64_t size = rows == 0 ? 0 : a.input(k).bytes() / rows;
    starts.push_back(start);
    sizes.push_back(size);
    start += size;
  }
  const int64_t parts = static_cast<int64_t>(starts.size());
#pragma omp parallel for if (out.bytes() >= kParallelBytes)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < parts; ++k)
      if (sizes[k] > 0) std::memcpy(out.data + r * row_bytes + starts[k], a.in[k]->data + r * sizes[k], sizes[k]);
}

// Split: consecutive pieces along `axis`, sized by the `split` attribute (opset < 13), input 1
// (opset 13) or else in equal parts.
void split(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  int64_t axis = ops::normalize_axis(a, a.attrs.i("axis", 0), in.rank());
  const int64_t n = static_cast<int64_t>(a.out.size()), dim = in.shape[axis];
  std::vector<int64_t> sizes = axes_from(a, "split", 1);
  if (sizes.empty()) {
    int64_t piece = (dim + n - 1) / n;
    for (int64_t k = 0; k < n; ++k) sizes.push_back(std::max<int64_t>(0, std::min(piece, dim - k * piece)));
  }
  if (static_cast<int64_t>(sizes.size()) != n)
    fail(ErrorKind::kModel, "Split lists {} sizes for {} outputs", sizes.size(), n);
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) fail(ErrorKind::kModel, "Split size {} is negative", s);
    total += s;
  }
  if (total != dim) fail(ErrorKind::kModel, "Split sizes add up to {} but axis {} has {}", total, axis, dim);
  int64_t rows = 1;
  for (int64_t d = 0; d < axis; ++d) rows *= in.shape[d];
  int64_t in_row = rows == 0 ? 0 : in.bytes() / rows;
  int64_t unit = dim == 0 ? 0 : in_row / dim;  // bytes of one step along the axis
  int64_t offset = 0;
  for (int64_t k = 0; k < n; ++k) {
    Tensor* out = a.out[k];
    if (out != nullptr) {
      Shape expected = in.shape;
      expected[axis] = sizes[k];
      expect_shape(a, k, expected);
      int64_t piece = sizes[k] * unit;
#pragma omp parallel for if (out->bytes() >= kParallelBytes)
      for (int64_t r = 0; r < rows; ++r)
        if (piece > 0) std::memcpy(out->data + r * piece, in.data + r * in_row + offset, piece);
    }
    offset += sizes[k] * unit;
  }
}

// Trilu: X's elements outside the triangle zeroed, any element type (bytes moved as they are).
void trilu(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::TriluShape s = ops::trilu_shape(a, x.shape, a.has_input(1) ? &a.input(1) : nullptr);
  expect_shape(a, 0, x.shape);
  const int64_t n = x.numel(), size = dtype_size(x.dtype);
  const auto* from = static_cast<const std::byte*>(x.data);
  auto* to = static_cast<std::byte*>(a.out[0]->data);
#pragma omp parallel for if (n * size >= kParallelBytes)
  for (int64_t e = 0; e < n; ++e) {
    if (ops::trilu_keeps(s, e))
      std::memcpy(to + e * size, from + e * size, static_cast<size_t>(size));
    else
      std::memset(to + e * size, 0, static_cast<size_t>(size));
  }
}

// Slice: starts/ends/axes/steps from inputs 1-4 (opset 10 on) or the attributes of opset 1;
// ends clamp to the dim, negative values count from the end, steps may be negative.
void slice(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  const ops::SliceView view = ops::slice_view(
      a, in.shape, a.num_inputs(), [&](size_t k) { return a.has_input(k) ? a.in[k] : nullptr; });
  expect_shape(a, 0, view.shape);
  strided_copy(in, *a.out[0], view.shape, view.strides, view.base);
}

// Gather: out[o, i..., r] = data[o, indices[i...], r] along `axis`; negative indices count from
// the end.
void gather(const KernelArgs& a) {
  const Tensor& data = a.input(0);
  const Tensor& index_tensor = a.input(1);
  Tensor& out = *a.out[0];
  int64_t axis = ops::normalize_axis(a, a.attrs.i("axis", 0), data.rank());
  expect_shape(a, 0, ops::gather_shape(data.shape, index_tensor.shape, axis));
  const int64_t dim = data.shape[axis];
  const std::vector<int64_t> indices = ops::gather_indices_in_range(read_ints(a, 1), axis, dim);
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= data.shape[d];
  if (out.bytes() == 0) return;
  const int64_t count = static_cast<int64_t>(indices.size());
  const int64_t piece = out.bytes() / (outer * count);  // bytes of one gathered slice
#pragma omp parallel for if (out.bytes() >= kParallelBytes)
  for (int64_t job = 0; job < outer * count; ++job) {
    int64_t o = job / count, i = job % count;
    std::memcpy(out.data + job * piece, data.data + (o * dim + indices[i]) * piece, piece);
  }
}

// Expand: input 0 broadcast (numpy rules) to the output shape, which input 1 must agree with.
void expand(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  Tensor& out = *a.out[0];
  Shape requested = read_ints(a, 1);
  // The output shape is the broadcast of the input shape and the requested one.
  size_t rank = std::max(in.shape.size(), requested.size());
  Shape expected(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    int64_t x = d + in.shape.size() >= rank ? in.shape[d + in.shape.size() - rank] : 1;
    int64_t y = d + requested.size() >= rank ? requested[d + requested.size() - rank] : 1;
    if (x != y && x != 1 && y != 1)
      fail(ErrorKind::kShape, "Expand cannot broadcast {} to {}", in.describe(), shape_string(requested));
    expected[d] = x == 1 ? y : x;
  }
  expect_shape(a, 0, expected);
  std::vector<int64_t> in_strides = ops::dense_strides(in.shape), strides(rank, 0);
  for (size_t d = 0; d < in.shape.size(); ++d)
    strides[d + rank - in.shape.size()] = in.shape[d] == 1 ? 0 : in_strides[d];
  strided_copy(in, out, out.shape, strides, 0);
}

// --- Checks -----------------------------------------------------------------------------------

// "" when the first `data_inputs` inputs (all when negative) and every output share one
// fixed-size dtype.
std::string check_moves(const OpSignature& s, int data_inputs) {
  if (s.inputs.empty() || s.inputs[0] == DType::kUndefined) return fmt::format("{} has no data input", s.op_type);
  DType dtype = s.inputs[0];
  if (dtype_size(dtype) <= 0) return fmt::format("{} on {} is not supported", s.op_type, dtype_name(dtype));
  size_t n = data_inputs < 0 ? s.inputs.size() : std::min<size_t>(data_inputs, s.inputs.size());
  for (size_t k = 0; k < n; ++k)
    if (s.inputs[k] != dtype)
      return fmt::format("{} mixes {} and {} inputs", s.op_type, dtype_name(dtype), dtype_name(s.inputs[k]));
  for (DType d : s.outputs)
    if (d != DType::kUndefined && d != dtype)
      return fmt::format("{} from {} to {} is not supported (it does not convert)", s.op_type, dtype_name(dtype),
                         dtype_name(d));
  return "";
}

// "" when the optional inputs from `first` on are absent, int64, or (with `int32`) int32.
std::string check_index_inputs(const OpSignature& s, size_t first, bool int32) {
  for (size_t k = first; k < s.inputs.size(); ++k) {
    DType d = s.inputs[k];
    if (d != DType::kUndefined && d != DType::kInt64 && !(int32 && d == DType::kInt32))
      return fmt::format("{} input {} is {}; it must be {}", s.op_type, k, dtype_name(d),
                         int32 ? "int32 or int64" : "int64");
  }
  return "";
}

std::string check_single(const OpSignature& s) { return check_moves(s, 1); }

std::string check_with_int64(const OpSignature& s) {
  std::string why = check_moves(s, 1);
  return why.empty() ? check_index_inputs(s, 1, false) : why;
}

std::string check_with_int32_or_int64(const OpSignature& s) {
  std::string why = check_moves(s, 1);
  return why.empty() ? check_index_inputs(s, 1, true) : why;
}

std::string check_concat(const OpSignature& s) { return check_moves(s, -1); }

constexpr KernelEntry kKernels[] = {
    {"Identity", identity, check_single},
    {"Trilu", trilu, check_with_int64},
    {"Reshape", reshape, check_with_int64},
    {"Flatten", flatten, check_single},
    {"Squeeze", squeeze, check_with_int64},
    {"Unsqueeze", unsqueeze, check_with_int64},
    {"Transpose", transpose, check_single},
    {"Concat", concat, check_concat},
    {"Split", split, check_with_int64},
    {"Slice", slice, check_with_int32_or_int64},
    {"Gather", gather, check_with_int32_or_int64},
    {"Expand", expand, check_with_int64},
};

}  // namespace

std::span<const KernelEntry> data_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
