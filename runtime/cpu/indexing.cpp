// Tile, CumSum, GatherElements and ScatterND and their gradients (see families.h), the nodes
// read through indexing_shape.h and every element computed by indexing_element.h's functions,
// which the CUDA backend runs too. Forward kernels move elements of any fixed size (Tile,
// GatherElements, ScatterND with reduction none) or add them (CumSum; ScatterND add and mul)
// in float32, float64, int32 and int64 (integers wrap); gradients (contract:
// runtime/format/grad_ops.h) are float32.
//   TileGrad: dX[i] sums dY over the copies of i (a separable sum, resize_element.h).
//   CumSumGrad: the running sum of dY the other way (exclusive stays exclusive).
//   GatherElementsGrad: dData[p] sums dY over the outputs that read p, in output order.
//   ScatterNDGrad: dData is dY where no update replaced the element (all of dY for reduction
//   add); dUpdates[u] is dY where update u landed, for the update that won its slot (for every
//   update with add). Reduction mul has no gradient kernel.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cpu/by_size.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/indexing_shape.h"

namespace stagecraft::rt::cpu {

namespace {

// Loops over at least this many elements use all of the worker's threads.
constexpr int64_t kParallelElements = int64_t{1} << 14;

// Calls `body(T{})` for the arithmetic dtypes the adding kernels take.
template <class Body>
void by_number(const KernelArgs& a, DType dtype, Body&& body) {
  switch (dtype) {
    case DType::kFloat32:
      return body(float{});
    case DType::kFloat64:
      return body(double{});
    case DType::kInt32:
      return body(int32_t{});
    case DType::kInt64:
      return body(int64_t{});
    default:
      fail(ErrorKind::kUnsupported, "{} '{}' adds {} elements, which it does not support",
           a.op_type, a.name, dtype_name(dtype));
  }
}

bool movable(DType d) {
  return d != DType::kUndefined && d != DType::kString && d != DType::kComplex128 &&
         dtype_size(d) > 0 && dtype_size(d) <= 8;
}

bool number(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kInt32 || d == DType::kInt64;
}

// "" when the op has one output of its first input's dtype.
std::string same_type(const OpSignature& s) {
  if (s.outputs.size() != 1 || s.outputs[0] != s.inputs[0])
    return fmt::format("{} from {} to {} is not a valid signature", s.op_type,
                       dtype_name(s.inputs[0]),
                       s.outputs.empty() ? "nothing" : dtype_name(s.outputs[0]));
  return "";
}

// ---- Tile ------------------------------------------------------------------------------------

void tile(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::TileShape s = ops::tile_shape(a, x.shape, a.input(1));
  expect_shape(a, 0, ops::tile_output_shape(s));
  Tensor& y = *a.out[0];
  const int64_t n = y.numel();
  if (n == 0) return;
  by_size(a, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* src = x.as<T>();
    T* dst = y.as<T>();
#pragma omp parallel for if (n >= kParallelElements)
    for (int64_t e = 0; e < n; ++e) dst[e] = src[ops::tile_source(s, e)];
  });
}

void tile_grad(const KernelArgs& a) {
  const ops::GradIo io(a, {.n_min = 2, .n_max = 2, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (!io.input0(dx, dy, x)) return;
  const ops::TileShape s = ops::tile_shape(a, x->shape, io.need_x(1));
  ops::expect_dy_shape(a, *dy, ops::tile_output_shape(s));
  const int64_t n = dx->numel();
  if (n == 0) return;
  const ops::SeparableTableData data = ops::tile_gradient_tables(s);
  const ops::SeparableTable t = data.at(data.ints.data(), data.floats.data());
  const float* src = dy->as<float>();
  float* dst = dx->as<float>();
#pragma omp parallel for if (dy->numel() >= kParallelElements)
  for (int64_t i = 0; i < n; ++i) dst[i] = ops::separable_sum(t, src, i);
}

std::string check_tile(const OpSignature& s) {
  if (s.inputs.size() != 2)
    return fmt::format("Tile with {} inputs is not supported (input, repeats)", s.inputs.size());
  if (!movable(s.inputs[0]))
    return fmt::format("Tile on {} is not supported (elements of 1 to 8 bytes)",
                       dtype_name(s.inputs[0]));
  if (s.inputs[1] != DType::kInt64)
    return fmt::format("Tile's repeats are {}, expected int64", dtype_name(s.inputs[1]));
  return same_type(s);
}

// ---- CumSum ----------------------------------------------------------------------------------

void cumsum(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  expect_shape(a, 0, x.shape);
  const ops::ScanShape s = ops::scan_shape(a, x.shape, a.input(1));
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  by_number(a, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t lines = s.lines();
#pragma omp parallel for if (x.numel() >= kParallelElements)
    for (int64_t l = 0; l < lines; ++l) ops::scan_line(s, x.as<T>(), y.as<T>(), l);
  });
}

void cumsum_grad(const KernelArgs& a) {
  const ops::GradIo io(a, {.n_min = 2, .n_max = 2, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (!io.input0(dx, dy, x)) return;
  ops::ScanShape s = ops::scan_shape(a, x->shape, io.need_x(1));
  if (dy->shape != x->shape)
    fail(ErrorKind::kShape, "CumSumGrad '{}': the output gradient is {} but X is {}", a.name,
         dy->describe(), x->describe());
  if (dx->numel() == 0) return;
  s.reverse = !s.reverse;
  const int64_t lines = s.lines();
#pragma omp parallel for if (dx->numel() >= kParallelElements)
  for (int64_t l = 0; l < lines; ++l) ops::scan_line(s, dy->as<float>(), dx->as<float>(), l);
}

std::string check_cumsum(const OpSignature& s) {
  if (s.inputs.size() != 2)
    return fmt::format("CumSum with {} inputs is not supported (x, axis)", s.inputs.size());
  if (!number(s.inputs[0]))
    return fmt::format("CumSum on {} is not supported (float32, float64, int32, int64)",
                       dtype_name(s.inputs[0]));
  if (s.inputs[1] != DType::kInt32 && s.inputs[1] != DType::kInt64)
    return fmt::format("CumSum's axis is {}, expected int32 or int64", dtype_name(s.inputs[1]));
  return same_type(s);
}

// ---- GatherElements --------------------------------------------------------------------------

void gather_elements(const KernelArgs& a) {
  const Tensor& data = a.input(0);
  const Tensor& indices = a.input(1);
  const ops::GatherElementsPlan p = ops::gather_elements_plan(a, data.shape, indices);
  expect_shape(a, 0, indices.shape);
  Tensor& y = *a.out[0];
  const int64_t n = y.numel();
  if (n == 0) return;
  by_size(a, data.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* src = data.as<T>();
    T* dst = y.as<T>();
#pragma omp parallel for if (n >= kParallelElements)
    for (int64_t e = 0; e < n; ++e)
      dst[e] = src[ops::gather_elements_source(p.shape, p.indices.data(), e)];
  });
}

// The scatter of dY into dData in output order: for every data element the same terms in the
// same order as gather_elements_grad_element (which the CUDA backend runs), in O(outputs).
void gather_elements_grad(const KernelArgs& a) {
  const ops::GradIo io(a, {.n_min = 2, .n_max = 2, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (!io.input0(dx, dy, x)) return;
  const Tensor& indices = io.need_x(1);
  const ops::GatherElementsPlan p = ops::gather_elements_plan(a, x->shape, indices);
  if (dy->shape != indices.shape)
    fail(ErrorKind::kShape, "GatherElementsGrad '{}': the output gradient is {} but indices are {}",
         a.name, dy->describe(), indices.describe());
  ops::zero(*dx);
  float* dst = dx->as<float>();
  const float* src = dy->as<float>();
  for (int64_t e = 0; e < dy->numel(); ++e)
    dst[ops::gather_elements_source(p.shape, p.indices.data(), e)] += src[e];
}

std::string check_gather_elements(const OpSignature& s) {
  if (s.inputs.size() != 2)
    return fmt::format("GatherElements with {} inputs is not supported (data, indices)",
                       s.inputs.size());
  if (!movable(s.inputs[0]))
    return fmt::format("GatherElements on {} is not supported (elements of 1 to 8 bytes)",
                       dtype_name(s.inputs[0]));
  if (s.inputs[1] != DType::kInt32 && s.inputs[1] != DType::kInt64)
    return fmt::format("GatherElements' indices are {}, expected int32 or int64",
                       dtype_name(s.inputs[1]));
  return same_type(s);
}

// ---- ScatterND -------------------------------------------------------------------------------

void scatter_nd(const KernelArgs& a) {
  const Tensor& data = a.input(0);
  const Tensor& updates = a.input(2);
  expect_shape(a, 0, data.shape);
  const ops::ScatterPlanData plan = ops::scatter_plan(a, data.shape, a.input(1), updates.shape);
  const ops::ScatterPlan p = plan.at(plan.values.data());
  Tensor& y = *a.out[0];
  const int64_t n = y.numel();
  if (n == 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* d = data.as<T>();
    const T* u = updates.as<T>();
    T* dst = y.as<T>();
#pragma omp parallel for if (n >= kParallelElements)
    for (int64_t e = 0; e < n; ++e) dst[e] = ops::scatter_nd_element(p, d, u, e);
  };
  if (p.reduction == ops::ScatterReduction::kNone)
    by_size(a, data.dtype, run);
  else
    by_number(a, data.dtype, run);
}

void scatter_nd_grad(const KernelArgs& a) {
  const ops::GradIo io(a, ops::kScatterNdGradArity);
  const auto o =
      ops::scatter_nd_grad_operands(a, io, [](const Tensor& t) -> const Tensor& { return t; });
  if (!o) return;
  const ops::ScatterPlan p = o->plan.at(o->plan.values.data());
  const float* src = o->dy->as<float>();
  if (Tensor* dd = io.dx(0)) {
    float* dst = dd->as<float>();
    const int64_t n = dd->numel();
#pragma omp parallel for if (n >= kParallelElements)
    for (int64_t e = 0; e < n; ++e) dst[e] = ops::scatter_nd_data_grad(p, src, e);
  }
  if (Tensor* du = io.dx(2)) {
    float* dst = du->as<float>();
    const int64_t n = du->numel();
#pragma omp parallel for if (n >= kParallelElements)
    for (int64_t e = 0; e < n; ++e) dst[e] = ops::scatter_nd_updates_grad(p, src, e);
  }
}

std::string check_scatter_nd(const OpSignature& s) {
  if (s.inputs.size() != 3)
    return fmt::format("ScatterND with {} inputs is not supported (data, indices, updates)",
                       s.inputs.size());
  ops::ScatterReduction reduction = ops::ScatterReduction::kNone;
  if (auto why = ops::scatter_reduction_error(s.attrs, &reduction); !why.empty()) return why;
  const DType d = s.inputs[0];
  if (reduction == ops::ScatterReduction::kNone ? !movable(d) : !number(d))
    return fmt::format(
        "ScatterND{} on {} is not supported ({})",
        reduction == ops::ScatterReduction::kNone ? "" : " with a reduction", dtype_name(d),
        reduction == ops::ScatterReduction::kNone ? "elements of 1 to 8 bytes"
                                                  : "float32, float64, int32, int64");
  if (s.inputs[1] != DType::kInt64)
    return fmt::format("ScatterND's indices are {}, expected int64", dtype_name(s.inputs[1]));
  if (s.inputs[2] != d)
    return fmt::format("ScatterND's updates are {} but its data are {}", dtype_name(s.inputs[2]),
                       dtype_name(d));
  return same_type(s);
}

// ---- Gradients' checks -----------------------------------------------------------------------

// A gradient of input 0 (and, for ScatterND, input 2) of a forward op with `n` inputs, whose
// other operands are those of the forward op's check.
std::string check_index_grad(const OpSignature& s, size_t n, std::initializer_list<size_t> dx,
                             std::string (*forward)(const OpSignature&)) {
  const ops::GradArity arity{.n_min = n, .n_max = n, .m_min = 1, .m_max = 1};
  if (auto why = ops::grad_arity_error(s, arity); !why.empty()) return why;
  const DType dy = s.inputs[n + 1];
  if (dy != DType::kFloat32 && dy != DType::kUndefined)
    return fmt::format("{} with a {} output gradient is not supported (float32 only)", s.op_type,
                       dtype_name(dy));
  for (size_t k = 0; k < n; ++k) {
    const bool differentiable = std::find(dx.begin(), dx.end(), k) != dx.end();
    if (s.outputs[k] == DType::kUndefined) continue;
    if (!differentiable) return fmt::format("{} gives no gradient of input {}", s.op_type, k);
    if (s.outputs[k] != DType::kFloat32 || s.inputs[k] != DType::kFloat32)
      return fmt::format("{} of a {} input is not supported (float32 only)", s.op_type,
                         dtype_name(s.inputs[k]));
  }
  const std::string_view op = s.op_type.substr(0, s.op_type.size() - 4);  // less "Grad"
  const DType y[] = {s.inputs[n]};
  return forward({op, s.inputs.subspan(0, n), y, s.attrs});
}

std::string check_tile_grad(const OpSignature& s) {
  return check_index_grad(s, 2, {0}, check_tile);
}
std::string check_cumsum_grad(const OpSignature& s) {
  return check_index_grad(s, 2, {0}, check_cumsum);
}
std::string check_gather_elements_grad(const OpSignature& s) {
  return check_index_grad(s, 2, {0}, check_gather_elements);
}
std::string check_scatter_nd_grad(const OpSignature& s) {
  if (auto why = check_index_grad(s, 3, {0, 2}, check_scatter_nd); !why.empty()) return why;
  ops::ScatterReduction reduction = ops::ScatterReduction::kNone;
  ops::scatter_reduction_error(s.attrs, &reduction);
  if (reduction == ops::ScatterReduction::kMul)
    return "ScatterNDGrad with reduction mul is not supported (none and add have gradients)";
  return "";
}

// Every gradient writes each element of its outputs (GatherElementsGrad zeroes dData first).
constexpr KernelEntry kKernels[] = {
    {"Tile", tile, check_tile},
    {"TileGrad", tile_grad, check_tile_grad, /*writes_every_output=*/true},
    {"CumSum", cumsum, check_cumsum},
    {"CumSumGrad", cumsum_grad, check_cumsum_grad, /*writes_every_output=*/true},
    {"GatherElements", gather_elements, check_gather_elements},
    {"GatherElementsGrad", gather_elements_grad, check_gather_elements_grad,
     /*writes_every_output=*/true},
    {"ScatterND", scatter_nd, check_scatter_nd},
    {"ScatterNDGrad", scatter_nd_grad, check_scatter_nd_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> indexing_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
