// The CUDA backend's gradients of the data ops and ReduceMean (families.h), float32 (the pure
// moves, shape-only ops, Transpose, Concat and Split, also bfloat16 and float16), following
// the contract of runtime/format/grad_ops.h and the CPU backend's grad_data.cpp: shape-only ops
// copy dy, Transpose gathers through the inverse permutation, Slice scatters into zeros,
// Concat and Split split and join with 2-D copies, Gather adds rows with one thread per dX
// element over its indices' positions (no atomics, so a run is reproducible), Expand sums
// over the broadcast dims and ReduceMean spreads dy / count.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "runtime/cuda/data_common.h"
#include "runtime/cuda/families.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/grad_layout.h"
#include "runtime/ops/reduce_shape.h"

namespace stagecraft::rt::cuda {
namespace {

using ops::dense_strides;
using ops::GradIo;
using ops::normalize_axis;

void copy_grad(const KernelArgs& a) {
  const GradIo io(a);
  Tensor* dx;
  const Tensor *dy, *x;
  if (!io.input0(dx, dy, x)) return;
  if (dy->bytes() != dx->bytes())
    fail(ErrorKind::kShape, "{} maps the gradient {} onto {}: the element counts differ", a.op_type,
         dy->describe(), dx->describe());
  device_copy(context(a), dx->data, dy->data, dx->bytes());
}

void transpose_grad(const KernelArgs& a) {
  const GradIo io(a);
  Tensor* dx;
  const Tensor *dy, *px;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  const std::vector<int64_t> strides = ops::transpose_grad_strides(a, x, *dy);
  if (x.numel() == 0) return;
  launch_strided_gather(dx->data, dy->data, dtype_size(dy->dtype), x.numel(),
                        index_map(a, x.shape, strides), context(a).stream());
  check_launch(a);
}

void concat_grad(const KernelArgs& a) {
  const GradIo io(a);
  const Tensor* dy = io.dy(0);
  if (dy == nullptr) return zero_outputs(a);
  const ops::ConcatPieces p = ops::concat_grad_pieces(a, io, *dy);
  const int64_t f = dtype_size(dy->dtype);  // float32, or a 16-bit float (same_as_cpu_16bit)
  CudaContext& ctx = context(a);
  for (size_t k = 0; k < io.n; ++k) {
    Tensor* dx = io.dx(k);
    if (dx == nullptr) continue;
    const int64_t piece = p.sizes[k] * f;
    copy_rows(ctx, dx->data, piece, dy->data + p.starts[k] * f, p.row * f, piece, p.rows);
  }
}

// Split: dx is the dys joined along the axis; an omitted dy contributes zeros.
void split_grad(const KernelArgs& a) {
  const GradIo io(a);
  Tensor* dx = io.dx(0);
  if (dx == nullptr) return;
  const Tensor& x = io.need_x(0);
  expect_shape(a, 0, x.shape);
  const int64_t axis = normalize_axis(a, a.attrs.i("axis", 0), x.rank());
  const int64_t n = static_cast<int64_t>(io.m), dim = x.shape[axis];
  CudaContext& ctx = context(a);
  std::vector<int64_t> given;
  if (a.attrs.has("split"))
    given = a.attrs.ints("split");
  else if (io.x(1) != nullptr)
    given = read_ints(ctx, *io.x(1));
  const std::vector<int64_t> sizes = ops::split_sizes(std::move(given), n, dim, axis);
  int64_t rows = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) rows *= x.shape[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.shape[d];
  const int64_t f = dtype_size(dx->dtype), row = dim * inner * f;  // float32 or 16-bit
  int64_t start = 0;
  for (int64_t k = 0; k < n; ++k) {
    const Tensor* dy = io.dy(static_cast<size_t>(k));
    const int64_t piece = sizes[k] * inner * f;
    std::byte* at = dx->data + start * inner * f;
    if (dy != nullptr) {
      Shape expected = x.shape;
      expected[axis] = sizes[k];
      expect_dy_shape(a, *dy, expected);
      copy_rows(ctx, at, row, dy->data, piece, piece, rows);
    } else if (rows > 0 && piece > 0) {
      check(cudaMemset2DAsync(at, static_cast<size_t>(row), 0, static_cast<size_t>(piece),
                              static_cast<size_t>(rows), ctx.stream()),
            "cudaMemset2DAsync");
    }
    start += sizes[k];
  }
}

void slice_grad(const KernelArgs& a) {
  const GradIo io(a);
  Tensor* dx = io.dx(0);
  if (dx == nullptr) return;
  const Tensor& x = io.need_x(0);
  expect_shape(a, 0, x.shape);
  CudaContext& ctx = context(a);
  ctx.fill_zero(*dx);
  const Tensor* dy = io.dy(0);
  if (dy == nullptr) return;
  const ops::SliceView view = slice_view(a, ctx, x.shape, io.n, [&](size_t k) { return io.x(k); });
  expect_dy_shape(a, *dy, view.shape);
  const int64_t n = shape_numel(view.shape);
  if (n == 0) return;
  launch_strided_scatter(dx->as<float>() + view.base, dy->data, sizeof(float), n,
                         index_map(a, view.shape, view.strides), ctx.stream());
  check_launch(a);
}

void gather_grad(const KernelArgs& a) {
  const GradIo io(a);
  Tensor* dx = io.dx(0);
  if (dx == nullptr) return;
  const Tensor& data = io.need_x(0);
  expect_shape(a, 0, data.shape);
  CudaContext& ctx = context(a);
  const Tensor* dy = io.dy(0);
  if (dy == nullptr) return ctx.fill_zero(*dx);
  const Tensor& index_tensor = io.need_x(1);
  const int64_t axis = normalize_axis(a, a.attrs.i("axis", 0), data.rank());
  expect_dy_shape(a, *dy, ops::gather_shape(data.shape, index_tensor.shape, axis));
  const int64_t dim = data.shape[axis];
  const std::vector<int64_t> indices = gather_indices(ctx, index_tensor, axis, dim);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= data.shape[d];
  for (int64_t d = axis + 1; d < data.rank(); ++d) inner *= data.shape[d];
  const int64_t count = static_cast<int64_t>(indices.size());
  if (count == 0 || outer * inner == 0) return ctx.fill_zero(*dx);
  // Positions grouped by index (a counting sort, ascending within each index): dx row d sums
  // dy rows positions[offsets[d] .. offsets[d + 1]) in the order the CPU adds them. A padding
  // row takes no position: its dx row is zeros.
  const std::vector<uint8_t> padding = ops::padding_row_mask(a, dim);
  auto counted = [&](int64_t index) {
    return padding.empty() || !padding[static_cast<size_t>(index)];
  };
  std::vector<int64_t> offsets(static_cast<size_t>(dim) + 1, 0);
  for (int64_t index : indices)
    if (counted(index)) ++offsets[index + 1];
  for (int64_t d = 0; d < dim; ++d) offsets[d + 1] += offsets[d];
  if (offsets[dim] == 0) return ctx.fill_zero(*dx);  // every position a padding row
  std::vector<int64_t> positions(static_cast<size_t>(offsets[dim]));
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < count; ++i)
    if (counted(indices[i])) positions[next[indices[i]]++] = i;
  const Tensor device_offsets = upload_ints(ctx, offsets);
  const Tensor device_positions = upload_ints(ctx, positions);
  launch_gather_grad(dx->as<float>(), dy->as<float>(), device_offsets.as<int64_t>(),
                     device_positions.as<int64_t>(), outer, count, dim, inner, ctx.stream());
  check_launch(a);
}

// Expand: dy summed over the dims x broadcast along (numpy rules, x's shape aligned right).
void expand_grad(const KernelArgs& a) {
  const GradIo io(a);
  Tensor* dx;
  const Tensor *dy, *px;
  if (!io.input0(dx, dy, px)) return;
  const Shape& shape = px->shape;
  const Shape& full = dy->shape;
  if (shape.size() > full.size())
    fail(ErrorKind::kShape, "cannot sum {} to the larger-rank {}", shape_string(full),
         shape_string(shape));
  const size_t lead = full.size() - shape.size();
  std::vector<bool> reduced(full.size());
  for (size_t i = 0; i < full.size(); ++i) {
    const int64_t s = i < lead ? 1 : shape[i - lead];
    if (s != full[i] && s != 1)
      fail(ErrorKind::kShape, "{} does not broadcast to {}", shape_string(shape),
           shape_string(full));
    reduced[i] = s != full[i];
  }
  if (dx->numel() == 0) return;
  if (shape_numel(full) == 0) return context(a).fill_zero(*dx);
  reduce_sum_f32(context(a), dx->as<float>(), dy->as<float>(), dx->numel(),
                 reduce_map(a, full, reduced));
  check_launch(a);
}

void reduce_mean_grad(const KernelArgs& a) {
  const GradIo io(a);
  Tensor* dx;
  const Tensor *dy, *px;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  std::vector<int64_t> axes = a.attrs.ints("axes");
  if (!a.attrs.has("axes") && io.x(1) != nullptr) axes = read_ints(context(a), *io.x(1));
  const ops::MeanRule rule = ops::mean_rule(a, x.shape, axes);
  const std::vector<bool>& reduced = rule.reduced;
  const Shape& kept_shape = rule.kept_shape;
  const int64_t count = rule.count;
  expect_dy_shape(a, *dy, rule.y_shape);
  if (x.numel() == 0) return;
  // dx at coordinate c reads dy at c with the reduced dims at 0.
  std::vector<int64_t> strides = dense_strides(kept_shape);
  for (size_t i = 0; i < strides.size(); ++i)
    if (reduced[i]) strides[i] = 0;
  launch_broadcast_scale(dx->as<float>(), dy->as<float>(), x.numel(),
                         index_map(a, x.shape, strides), 1.0f / static_cast<float>(count),
                         context(a).stream());
  check_launch(a);
}

// The CPU backend's checks decide (float32 gradients, the contract's arity). Every kernel
// writes every element of the outputs it is given, as the CPU's do.
// TriluGrad: dX is dY inside the triangle, zero outside; k gets no gradient.
void trilu_grad(const KernelArgs& a) {
  const GradIo io(a, {.n_min = 1, .n_max = 2, .m_min = 1, .m_max = 1});
  CudaContext& ctx = context(a);
  if (io.n > 1 && io.dx(1) != nullptr) ctx.fill_zero(*io.dx(1));
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (!io.input0(dx, dy, x)) return;
  const Tensor k = host_ints(ctx, io.x(1));
  const ops::TriluShape s = ops::trilu_shape(a, x->shape, io.x(1) != nullptr ? &k : nullptr);
  expect_dy_shape(a, *dy, x->shape);
  launch_trilu(dx->data, dy->data, 4, x->numel(), s, ctx.stream());
  check_launch(a);
}

constexpr KernelEntry kKernels[] = {
    {"IdentityGrad", copy_grad, same_as_cpu_16bit, /*writes_every_output=*/true},
    {"TriluGrad", trilu_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ReshapeGrad", copy_grad, same_as_cpu_16bit, /*writes_every_output=*/true},
    {"FlattenGrad", copy_grad, same_as_cpu_16bit, /*writes_every_output=*/true},
    {"SqueezeGrad", copy_grad, same_as_cpu_16bit, /*writes_every_output=*/true},
    {"UnsqueezeGrad", copy_grad, same_as_cpu_16bit, /*writes_every_output=*/true},
    {"TransposeGrad", transpose_grad, same_as_cpu_16bit, /*writes_every_output=*/true},
    {"ConcatGrad", concat_grad, same_as_cpu_16bit, /*writes_every_output=*/true},
    {"SplitGrad", split_grad, same_as_cpu_16bit, /*writes_every_output=*/true},
    {"SliceGrad", slice_grad, same_as_cpu, /*writes_every_output=*/true},
    {"GatherGrad", gather_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ExpandGrad", expand_grad, same_as_cpu, /*writes_every_output=*/true},
    {"ReduceMeanGrad", reduce_mean_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> grad_data_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
