// The CUDA backend's data family (families.h): layout and indexing ops, over the same ops,
// attributes and dtypes as the CPU backend's data.cpp. Each kernel recomputes its output shape
// as the CPU's does and checks it against the recorded one; small integer operands (shapes,
// axes, slice bounds, gather indices) are read to the host first.
//
// Shape-only ops are device-to-device copies; Concat and Split are 2-D copies (one row per
// index of the dims before the axis); Transpose, Slice and Expand are one strided gather on
// raw bytes (data_kernels.cu), so every fixed-size dtype works.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/cuda/data_common.h"
#include "runtime/cuda/families.h"
#include "runtime/ops/data_shape.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::dense_strides;
using ops::normalize_axis;

// An axis list from attribute `name` or, when absent, from input `k`; empty when neither.
std::vector<int64_t> axes_from(const KernelArgs& a, std::string_view name, size_t k) {
  return ops::axes_from(a, name, k, [&](size_t input) { return read_ints(context(a), a.input(input)); });
}

// Output 0 takes input 0's bytes unchanged (ops that only change the shape).
void copy_through(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  Tensor& out = *a.out[0];
  if (in.bytes() != out.bytes())
    fail(ErrorKind::kShape, "{} maps {} onto {}: the element counts differ", a.op_type,
         in.describe(), out.describe());
  device_copy(context(a), out.data, in.data, out.bytes());
}

// Fills the dense output 0 from input 0 through per-dim strides from `base` (elements).
void strided_copy(const KernelArgs& a, const Shape& shape, const std::vector<int64_t>& strides,
                  int64_t base) {
  const Tensor& in = a.input(0);
  Tensor& out = *a.out[0];
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  const int64_t size = movable_size(a, in.dtype);
  CudaContext& ctx = context(a);
  launch_strided_gather(out.data, in.data + base * size, size, n, index_map(a, shape, strides),
                        ctx.stream());
  check_launch(a);
}

void identity(const KernelArgs& a) {
  expect_shape(a, 0, a.input(0).shape);
  copy_through(a);
}

void reshape(const KernelArgs& a) {
  expect_shape(a, 0, ops::reshape_shape(a, a.input(0).shape, read_ints(context(a), a.input(1))));
  copy_through(a);
}

void flatten(const KernelArgs& a) {
  expect_shape(a, 0, ops::flatten_shape(a, a.input(0).shape));
  copy_through(a);
}

void squeeze(const KernelArgs& a) {
  expect_shape(a, 0, ops::squeeze_shape(a, a.input(0).shape, axes_from(a, "axes", 1)));
  copy_through(a);
}

void unsqueeze(const KernelArgs& a) {
  expect_shape(a, 0, ops::unsqueeze_shape(a, a.input(0).shape, axes_from(a, "axes", 1)));
  copy_through(a);
}

void transpose(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  const std::vector<int64_t> in_strides = dense_strides(in.shape);
  std::vector<int64_t> strides;
  Shape expected;
  for (int64_t d : ops::transpose_perm(a, in.rank())) {
    expected.push_back(in.shape[d]);
    strides.push_back(in_strides[d]);
  }
  expect_shape(a, 0, expected);
  strided_copy(a, expected, strides, 0);
}

// Concat: each output row (the dims before `axis`) is the inputs' rows one after another.
void concat(const KernelArgs& a) {
  Tensor& out = *a.out[0];
  const Tensor& first = a.input(0);
  const int64_t axis = normalize_axis(a, a.attrs.required_i("axis"), first.rank());
  Shape expected = first.shape;
  expected[axis] = 0;
  for (size_t k = 0; k < a.num_inputs(); ++k) {
    const Tensor& in = a.input(k);
    bool same = in.rank() == first.rank();
    for (int64_t d = 0; same && d < in.rank(); ++d)
      same = d == axis || in.shape[d] == first.shape[d];
    if (!same)
      fail(ErrorKind::kShape, "Concat along axis {} of {} and {}: the other dims differ", axis,
           first.describe(), in.describe());
    expected[axis] += in.shape[axis];
  }
  expect_shape(a, 0, expected);
  if (out.bytes() == 0) return;
  int64_t rows = 1;
  for (int64_t d = 0; d < axis; ++d) rows *= expected[d];
  const int64_t row_bytes = out.bytes() / rows;
  CudaContext& ctx = context(a);
  int64_t start = 0;
  for (size_t k = 0; k < a.num_inputs(); ++k) {
    const int64_t size = a.input(k).bytes() / rows;
    copy_rows(ctx, out.data + start, row_bytes, a.input(k).data, size, size, rows);
    start += size;
  }
}

void split(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  const int64_t axis = normalize_axis(a, a.attrs.i("axis", 0), in.rank());
  const int64_t n = static_cast<int64_t>(a.out.size()), dim = in.shape[axis];
  std::vector<int64_t> sizes = axes_from(a, "split", 1);
  if (sizes.empty()) {
    const int64_t piece = (dim + n - 1) / n;
    for (int64_t k = 0; k < n; ++k)
      sizes.push_back(std::max<int64_t>(0, std::min(piece, dim - k * piece)));
  }
  if (static_cast<int64_t>(sizes.size()) != n)
    fail(ErrorKind::kModel, "Split lists {} sizes for {} outputs", sizes.size(), n);
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) fail(ErrorKind::kModel, "Split size {} is negative", s);
    total += s;
  }
  if (total != dim)
    fail(ErrorKind::kModel, "Split sizes add up to {} but axis {} has {}", total, axis, dim);
  int64_t rows = 1;
  for (int64_t d = 0; d < axis; ++d) rows *= in.shape[d];
  const int64_t in_row = rows == 0 ? 0 : in.bytes() / rows;
  const int64_t unit = dim == 0 ? 0 : in_row / dim;  // bytes of one step along the axis
  CudaContext& ctx = context(a);
  int64_t offset = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (Tensor* out = a.out[k]; out != nullptr) {
      Shape expected = in.shape;
      expected[axis] = sizes[k];
      expect_shape(a, k, expected);
      const int64_t piece = sizes[k] * unit;
      copy_rows(ctx, out->data, piece, in.data + offset, in_row, piece, rows);
    }
    offset += sizes[k] * unit;
  }
}

void slice(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  const ops::SliceView view = slice_view(a, context(a), in.shape, a.num_inputs(), [&](size_t k) {
    return a.has_input(k) ? a.in[k] : nullptr;
  });
  expect_shape(a, 0, view.shape);
  strided_copy(a, view.shape, view.strides, view.base);
}

// The largest unit (16, 8, 4, 2 or 1 bytes) that divides `bytes` and the alignment of `ptrs`.
int64_t widest_unit(int64_t bytes, std::initializer_list<const void*> ptrs) {
  for (int64_t unit = 16; unit > 1; unit /= 2) {
    bool fits = bytes % unit == 0;
    for (const void* p : ptrs) fits = fits && reinterpret_cast<uintptr_t>(p) % unit == 0;
    if (fits) return unit;
  }
  return 1;
}

void gather(const KernelArgs& a) {
  const Tensor& data = a.input(0);
  const Tensor& index_tensor = a.input(1);
  Tensor& out = *a.out[0];
  const int64_t axis = normalize_axis(a, a.attrs.i("axis", 0), data.rank());
  expect_shape(a, 0, ops::gather_shape(data.shape, index_tensor.shape, axis));
  CudaContext& ctx = context(a);
  const int64_t dim = data.shape[axis];
  const std::vector<int64_t> indices = gather_indices(ctx, index_tensor, axis, dim);
  if (out.bytes() == 0) return;
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= data.shape[d];
  const int64_t count = static_cast<int64_t>(indices.size());
  const int64_t piece = out.bytes() / (outer * count);  // bytes of one gathered slice
  movable_size(a, data.dtype);
  const int64_t unit = widest_unit(piece, {out.data, data.data});
  const Tensor device_indices = upload_ints(ctx, indices);
  launch_gather(out.data, data.data, device_indices.as<int64_t>(), outer, count, dim, piece / unit,
                unit, ctx.stream());
  check_launch(a);
}

void expand(const KernelArgs& a) {
  const Tensor& in = a.input(0);
  Tensor& out = *a.out[0];
  const Shape requested = read_ints(context(a), a.input(1));
  const size_t rank = std::max(in.shape.size(), requested.size());
  Shape expected(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t x = d + in.shape.size() >= rank ? in.shape[d + in.shape.size() - rank] : 1;
    const int64_t y = d + requested.size() >= rank ? requested[d + requested.size() - rank] : 1;
    if (x != y && x != 1 && y != 1)
      fail(ErrorKind::kShape, "Expand cannot broadcast {} to {}", in.describe(),
           shape_string(requested));
    expected[d] = x == 1 ? y : x;
  }
  expect_shape(a, 0, expected);
  const std::vector<int64_t> in_strides = dense_strides(in.shape);
  std::vector<int64_t> strides(rank, 0);
  for (size_t d = 0; d < in.shape.size(); ++d)
    strides[d + rank - in.shape.size()] = in.shape[d] == 1 ? 0 : in_strides[d];
  strided_copy(a, out.shape, strides, 0);
}

// Every op takes what the CPU backend's takes (every fixed-size dtype for the moves).
// Trilu: the triangle kept, the rest zeroed (any element type); k read to the host.
void trilu(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  CudaContext& ctx = context(a);
  const Tensor k = host_ints(ctx, a.has_input(1) ? &a.input(1) : nullptr);
  const ops::TriluShape s = ops::trilu_shape(a, x.shape, a.has_input(1) ? &k : nullptr);
  expect_shape(a, 0, x.shape);
  launch_trilu(a.out[0]->data, x.data, dtype_size(x.dtype), x.numel(), s, ctx.stream());
  check_launch(a);
}

constexpr KernelEntry kKernels[] = {
    {"Identity", identity, same_as_cpu},   {"Reshape", reshape, same_as_cpu},
    {"Trilu", trilu, same_as_cpu},         {"Flatten", flatten, same_as_cpu},
    {"Squeeze", squeeze, same_as_cpu},     {"Unsqueeze", unsqueeze, same_as_cpu},
    {"Transpose", transpose, same_as_cpu}, {"Concat", concat, same_as_cpu},
    {"Split", split, same_as_cpu},         {"Slice", slice, same_as_cpu},
    {"Gather", gather, same_as_cpu},       {"Expand", expand, same_as_cpu},
};

}  // namespace

std::span<const KernelEntry> data_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
