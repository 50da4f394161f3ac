// Gradients of the data and reduce ops (Reshape, Transpose, Gather, Slice, Concat, ...,
// ReduceMean). The contract every gradient kernel follows is runtime/format/grad_ops.h: inputs
// x0..x{n-1}, y0..y{m-1}, dy0..dy{m-1}, outputs dx0..dx{n-1}, n in attribute forward_inputs.
//
// Each kernel reads its forward attributes exactly as the forward kernel in data.cpp (or
// reduce.cpp for ReduceMean) does, and moves dy back: shape-only ops copy bytes, Transpose
// applies the inverse permutation, Slice and Gather scatter into zeros, Concat and Split split
// and join, Expand sums over the broadcast dims, ReduceMean spreads dy / count. Float32 only
// (index and shape inputs get no gradient).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "runtime/cpu/broadcast.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/grad_layout.h"
#include "runtime/ops/reduce_shape.h"
#include "runtime/ops/layout.h"

namespace stagecraft::rt::cpu {

namespace {

constexpr int64_t kParallelElements = int64_t{1} << 15;

// Walks the dense index space of `shape`; element c corresponds to `strided[base + sum(c[d] *
// strides[d])]`. With `scatter`, copies dense -> strided, else strided -> dense. The strided
// positions must be distinct (they are for Transpose and Slice).
void strided_move(float* dense, float* strided, const Shape& shape,
                  const std::vector<int64_t>& strides, int64_t base, bool scatter) {
  if (shape_numel(shape) == 0) return;
  // Named references, not a structured binding: clang 14 (the fuzzing build) cannot use a
  // binding inside the OpenMP region below.
  const ops::StridedWalk walk = ops::merge_strided_dims(shape, strides);
  const auto& dims = walk.dims;
  const auto& steps = walk.steps;
  const int64_t rank = static_cast<int64_t>(dims.size());
  const int64_t inner = dims.back(), step = steps.back();
  const int64_t rows = shape_numel(dims) / inner;
  float* s = strided + base;
#pragma omp parallel for if (rows * inner >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t offset = 0, rest = r;
    for (int64_t d = rank - 2; d >= 0; --d) {
      offset += (rest % dims[d]) * steps[d];
      rest /= dims[d];
    }
    float* row = dense + r * inner;
    float* at = s + offset;
    if (scatter) {
      for (int64_t i = 0; i < inner; ++i) at[i * step] = row[i];
    } else {
      for (int64_t i = 0; i < inner; ++i) row[i] = at[i * step];
    }
  }
}

// --- Shape-only ops: dx = dy with x's shape ----------------------------------------------------

void copy_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Tensor* dx;
  const Tensor *dy, *x;
  if (!io.input0(dx, dy, x)) return;
  if (dy->bytes() != dx->bytes())
    fail(ErrorKind::kShape, "{} maps the gradient {} onto {}: the element counts differ", a.op_type,
         dy->describe(), dx->describe());
  if (dx->data != dy->data) std::memmove(dx->data, dy->data, static_cast<size_t>(dx->bytes()));
}

// --- Trilu: dX is dY inside the triangle, zero outside (k gets none) ---------------------------

void trilu_grad(const KernelArgs& a) {
  ops::GradIo io(a, {.n_min = 1, .n_max = 2, .m_min = 1, .m_max = 1});
  if (io.n > 1 && io.dx(1) != nullptr) ops::zero(*io.dx(1));
  Tensor* dx;
  const Tensor *dy, *x;
  if (!io.input0(dx, dy, x)) return;
  const ops::TriluShape s = ops::trilu_shape(a, x->shape, io.x(1));
  ops::expect_dy_shape(a, *dy, x->shape);
  const float* g = dy->as<float>();
  float* d = dx->as<float>();
  const int64_t n = x->numel();
#pragma omp parallel for if (n >= kParallelElements)
  for (int64_t e = 0; e < n; ++e) d[e] = ops::trilu_keeps(s, e) ? g[e] : 0.0f;
}

// --- Transpose: the inverse permutation ---------------------------------------------------------

void transpose_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Tensor* dx;
  const Tensor *dy, *px;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  const std::vector<int64_t> strides = ops::transpose_grad_strides(a, x, *dy);
  strided_move(dx->as<float>(), const_cast<float*>(dy->as<float>()), x.shape, strides, 0,
               /*scatter=*/false);
}

// --- Concat and Split ---------------------------------------------------------------------------

// Copies between a joined tensor (`rows` rows of `row` elements) and its pieces: piece k holds
// `sizes[k]` elements of each row, starting at `starts[k]`. With `to_pieces`, joined -> pieces
// (a null piece is skipped); else pieces -> joined (a null piece gives zeros there).
void move_pieces(float* joined, int64_t rows, int64_t row, const std::vector<float*>& pieces,
                 const std::vector<int64_t>& starts, const std::vector<int64_t>& sizes,
                 bool to_pieces) {
  const int64_t parts = static_cast<int64_t>(pieces.size());
#pragma omp parallel for if (rows * row >= kParallelElements)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < parts; ++k) {
      if (sizes[k] == 0) continue;
      float* j = joined + r * row + starts[k];
      if (pieces[k] == nullptr) {
        if (!to_pieces) std::fill_n(j, sizes[k], 0.0f);
        continue;
      }
      float* p = pieces[k] + r * sizes[k];
      if (to_pieces)
        std::memcpy(p, j, static_cast<size_t>(sizes[k]) * sizeof(float));
      else
        std::memcpy(j, p, static_cast<size_t>(sizes[k]) * sizeof(float));
    }
}

void concat_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  const Tensor* dy = io.dy(0);
  if (dy == nullptr) return ops::zero_outputs(a);
  const ops::ConcatPieces p = ops::concat_grad_pieces(a, io, *dy);
  std::vector<float*> pieces;
  for (size_t k = 0; k < io.n; ++k) pieces.push_back(io.dx(k) ? io.dx(k)->as<float>() : nullptr);
  move_pieces(const_cast<float*>(dy->as<float>()), p.rows, p.row, pieces, p.starts, p.sizes,
              /*to_pieces=*/true);
}

// Split: dx is the dys joined along the axis; an omitted dy contributes zeros.
void split_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Tensor* dx = io.dx(0);
  if (dx == nullptr) return;
  const Tensor& x = io.need_x(0);
  expect_shape(a, 0, x.shape);
  const int64_t axis = ops::normalize_axis(a, a.attrs.i("axis", 0), x.rank());
  const int64_t n = static_cast<int64_t>(io.m), dim = x.shape[axis];
  std::vector<int64_t> given;
  if (a.attrs.has("split"))
    given = a.attrs.ints("split");
  else if (io.x(1) != nullptr)
    given = ops::read_ints(a, *io.x(1), 1);
  const std::vector<int64_t> sizes = ops::split_sizes(std::move(given), n, dim, axis);
  int64_t rows = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) rows *= x.shape[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.shape[d];
  std::vector<float*> pieces;
  std::vector<int64_t> starts, piece_sizes;
  int64_t start = 0;
  for (int64_t k = 0; k < n; ++k) {
    const Tensor* dy = io.dy(static_cast<size_t>(k));
    if (dy != nullptr) {
      Shape expected = x.shape;
      expected[axis] = sizes[k];
      ops::expect_dy_shape(a, *dy, expected);
    }
    pieces.push_back(dy != nullptr ? const_cast<float*>(dy->as<float>()) : nullptr);
    starts.push_back(start * inner);
    piece_sizes.push_back(sizes[k] * inner);
    start += sizes[k];
  }
  move_pieces(dx->as<float>(), rows, dim * inner, pieces, starts, piece_sizes, /*to_pieces=*/false);
}

// --- Slice: dy scattered into zeros --------------------------------------------------------------

void slice_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Tensor* dx = io.dx(0);
  if (dx == nullptr) return;
  const Tensor& x = io.need_x(0);
  expect_shape(a, 0, x.shape);
  ops::zero(*dx);
  const Tensor* dy = io.dy(0);
  if (dy == nullptr) return;
  const ops::SliceView view = ops::slice_view(a, x.shape, io.n, [&](size_t k) { return io.x(k); });
  ops::expect_dy_shape(a, *dy, view.shape);
  strided_move(const_cast<float*>(dy->as<float>()), dx->as<float>(), view.shape, view.strides,
               view.base,
               /*scatter=*/true);
}

// --- Gather: dy rows added into zeros at the indices
// ----------------------------------------------

void gather_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Tensor* dx = io.dx(0);
  if (dx == nullptr) return;
  const Tensor& data = io.need_x(0);
  expect_shape(a, 0, data.shape);
  ops::zero(*dx);
  const Tensor* dy = io.dy(0);
  if (dy == nullptr) return;
  const Tensor& index_tensor = io.need_x(1);
  const int64_t axis = ops::normalize_axis(a, a.attrs.i("axis", 0), data.rank());
  ops::expect_dy_shape(a, *dy, ops::gather_shape(data.shape, index_tensor.shape, axis));
  const int64_t dim = data.shape[axis];
  const std::vector<int64_t> indices =
      ops::gather_indices_in_range(ops::read_ints(a, index_tensor, 1), axis, dim);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= data.shape[d];
  for (int64_t d = axis + 1; d < data.rank(); ++d) inner *= data.shape[d];
  const int64_t count = static_cast<int64_t>(indices.size());
  if (outer * count * inner == 0) return;
  const std::vector<uint8_t> padding = ops::padding_row_mask(a, dim);
  // Jobs own disjoint parts of dx: one outer row and one block of columns each, so repeated
  // indices add up without races. Padding rows keep the zeros.
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  const float* src = dy->as<float>();
  float* dst = dx->as<float>();
#pragma omp parallel for if (outer * count * inner >= kParallelElements)
  for (int64_t job = 0; job < outer * blocks; ++job) {
    const int64_t o = job / blocks, begin = (job % blocks) * kBlock,
                  end = std::min(inner, begin + kBlock);
    for (int64_t i = 0; i < count; ++i) {
      if (!padding.empty() && padding[static_cast<size_t>(indices[i])]) continue;
      const float* from = src + (o * count + i) * inner;
      float* to = dst + (o * dim + indices[i]) * inner;
#pragma omp simd
      for (int64_t j = begin; j < end; ++j) to[j] += from[j];
    }
  }
}

// --- Expand: dy summed over the broadcast dims
// ------------------------------------------------------

void expand_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Tensor* dx;
  const Tensor *dy, *px;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  sum_to_shape(dy->as<float>(), dy->shape, dx->as<float>(), x.shape);
}

// --- ReduceMean: dy / count spread over the reduced dims ---------------------------------------

void reduce_mean_grad(const KernelArgs& a) {
  ops::GradIo io(a);
  Tensor* dx;
  const Tensor *dy, *px;
  if (!io.input0(dx, dy, px)) return;
  const Tensor& x = *px;
  std::vector<int64_t> axes = a.attrs.ints("axes");
  if (!a.attrs.has("axes") && io.x(1) != nullptr) axes = ops::read_ints(a, *io.x(1), 1);
  const ops::MeanRule rule = ops::mean_rule(a, x.shape, axes);
  const Shape& kept_shape = rule.kept_shape;
  const int64_t count = rule.count;
  ops::expect_dy_shape(a, *dy, rule.y_shape);
  if (x.numel() == 0) return;
  const float scale = 1.0f / static_cast<float>(count);
  Broadcast<1> plan({kept_shape}, x.shape);
  const float* src = dy->as<float>();
  float* dst = dx->as<float>();
  const int64_t step = plan.step(0);
  plan.for_each_run([&](int64_t o, const std::array<int64_t, 1>& in, int64_t n) {
    const float* s = src + in[0];
    if (step == 0) {
      std::fill_n(dst + o, n, s[0] * scale);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[o + i] = s[i] * scale;
    }
  });
}

// --- Checks -------------------------------------------------------------------------------------

// "" when the signature is n + 2m inputs and n outputs (n = forward_inputs, at least 1), every
// named output and output gradient is float32 and so is the forward input of every named output.
std::string check_data_grad(const OpSignature& s) {
  const ops::GradCounts c =
      ops::grad_counts(s.op_type, s.attrs, s.inputs.size(), s.outputs.size(), {.n_min = 1});
  if (!c.error.empty()) return c.error;
  const size_t n = c.n, m = c.m;
  for (size_t j = 0; j < m; ++j) {
    const DType d = s.inputs[n + m + j];
    if (d != DType::kUndefined && d != DType::kFloat32)
      return fmt::format("{} with a {} output gradient is not supported (float32 only)", s.op_type,
                         dtype_name(d));
  }
  for (size_t k = 0; k < n; ++k) {
    if (s.outputs[k] == DType::kUndefined) continue;
    if (s.outputs[k] != DType::kFloat32 || s.inputs[k] != DType::kFloat32)
      return fmt::format("{} of a {} input is not supported (float32 only)", s.op_type,
                         dtype_name(s.inputs[k]));
  }
  return "";
}

// Every kernel here writes every element of the outputs it is given: copies and gathers
// overwrite, Split joins (zeros for an omitted dy), Slice and Gather zero dX themselves before
// they scatter or add into it, and every kernel gives zeros where dy is omitted.
constexpr KernelEntry kKernels[] = {
    {"IdentityGrad", copy_grad, check_data_grad, /*writes_every_output=*/true},
    {"TriluGrad", trilu_grad, check_data_grad, /*writes_every_output=*/true},
    {"ReshapeGrad", copy_grad, check_data_grad, /*writes_every_output=*/true},
    {"FlattenGrad", copy_grad, check_data_grad, /*writes_every_output=*/true},
    {"SqueezeGrad", copy_grad, check_data_grad, /*writes_every_output=*/true},
    {"UnsqueezeGrad", copy_grad, check_data_grad, /*writes_every_output=*/true},
    {"TransposeGrad", transpose_grad, check_data_grad, /*writes_every_output=*/true},
    {"ConcatGrad", concat_grad, check_data_grad, /*writes_every_output=*/true},
    {"SplitGrad", split_grad, check_data_grad, /*writes_every_output=*/true},
    {"SliceGrad", slice_grad, check_data_grad, /*writes_every_output=*/true},
    {"GatherGrad", gather_grad, check_data_grad, /*writes_every_output=*/true},
    {"ExpandGrad", expand_grad, check_data_grad, /*writes_every_output=*/true},
    {"ReduceMeanGrad", reduce_mean_grad, check_data_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> grad_data_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
