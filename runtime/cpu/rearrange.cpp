// DepthToSpace, SpaceToDepth and TopK and their gradients (see families.h), the nodes read
// through rearrange_shape.h and every index computed by rearrange_element.h's functions, which
// the CUDA backend runs too. DepthToSpace (modes DCR and CRD) and SpaceToDepth move elements of
// any fixed size; TopK selects on float32, float64, int32 and int64 (its Indices are int64;
// sorted = 0 still writes them in order, which ONNX allows); gradients (contract:
// runtime/format/grad_ops.h) are float32:
//   DepthToSpaceGrad, SpaceToDepthGrad: dY moved back by the inverse permutation.
//   TopKGrad: dX is zero but at the positions Indices names, which get dValues (K and the
//   Indices output carry no gradient).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/cpu/by_size.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/rearrange_shape.h"

namespace stagecraft::rt::cpu {

namespace {

// Loops over at least this many elements use all of the worker's threads.
constexpr int64_t kParallelElements = int64_t{1} << 14;

bool movable(DType d) {
  return d != DType::kUndefined && d != DType::kString && d != DType::kComplex128 &&
         dtype_size(d) > 0 && dtype_size(d) <= 8;
}

bool is_float32_or_omitted(DType d) { return d == DType::kFloat32 || d == DType::kUndefined; }

// ---- DepthToSpace, SpaceToDepth -------------------------------------------------------------

// Moves every element between the spatial tensor S and the deep one D: D to S when `gather`
// (DepthToSpace, SpaceToDepth's gradient), S to D otherwise.
template <class T>
void move_space_depth(const ops::SpaceDepthShape& s, const T* src, T* dst, bool gather) {
  const int64_t n = s.numel();
  if (gather) {
#pragma omp parallel for if (n >= kParallelElements)
    for (int64_t e = 0; e < n; ++e) dst[e] = src[ops::space_to_deep(s, e)];
  } else {
#pragma omp parallel for if (n >= kParallelElements)
    for (int64_t e = 0; e < n; ++e) dst[ops::space_to_deep(s, e)] = src[e];
  }
}

void space_depth(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const bool to_space = a.op_type == "DepthToSpace";
  const ops::SpaceDepthShape s = ops::space_depth_shape(a, x.shape, to_space);
  expect_shape(a, 0, to_space ? ops::space_shape(s) : ops::deep_shape(s));
  by_size(a, x.dtype, [&](auto tag) {
    using T = decltype(tag);
    move_space_depth(s, x.as<T>(), a.out[0]->as<T>(), to_space);
  });
}

// The gradient of a permutation is its inverse: dX gathers where the forward scattered.
void space_depth_grad(const KernelArgs& a) {
  const ops::GradIo io(a, {.n_min = 1, .n_max = 1, .m_min = 1, .m_max = 1});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (!io.input0(dx, dy, x)) return;
  const bool to_space = a.op_type == "DepthToSpaceGrad";
  const ops::SpaceDepthShape s = ops::space_depth_shape(a, x->shape, to_space);
  ops::expect_dy_shape(a, *dy, to_space ? ops::space_shape(s) : ops::deep_shape(s));
  move_space_depth(s, dy->as<float>(), dx->as<float>(), !to_space);
}

std::string check_space_depth(const OpSignature& s) {
  if (s.inputs.size() != 1 || s.outputs.size() != 1)
    return fmt::format("{} with {} inputs and {} outputs is not a valid signature", s.op_type,
                       s.inputs.size(), s.outputs.size());
  if (!movable(s.inputs[0]))
    return fmt::format("{} on {} is not supported (elements of 1 to 8 bytes)", s.op_type,
                       dtype_name(s.inputs[0]));
  if (s.outputs[0] != s.inputs[0])
    return fmt::format("{} from {} to {} is not a valid signature", s.op_type,
                       dtype_name(s.inputs[0]), dtype_name(s.outputs[0]));
  return "";
}

std::string check_space_depth_grad(const OpSignature& s) {
  if (auto why = ops::grad_arity_error(s, {.n_min = 1, .n_max = 1, .m_min = 1, .m_max = 1});
      !why.empty())
    return why;
  for (DType d : s.inputs)
    if (!is_float32_or_omitted(d))
      return fmt::format("{} on {} is not supported (float32 only)", s.op_type, dtype_name(d));
  if (!is_float32_or_omitted(s.outputs[0]))
    return fmt::format("{} producing {} is not supported (float32 only)", s.op_type,
                       dtype_name(s.outputs[0]));
  return "";
}

// ---- TopK ------------------------------------------------------------------------------------

const Tensor* k_operand(const KernelArgs& a) { return a.has_input(1) ? &a.input(1) : nullptr; }

// run(x's data as T*) for the numbers TopK, ArgMax and ArgMin select on: float32, float64,
// int32 and int64; another dtype is refused naming the node.
template <class Run>
void by_number_type(const KernelArgs& a, const Tensor& x, Run run) {
  switch (x.dtype) {
    case DType::kFloat32:
      return run(x.as<float>());
    case DType::kFloat64:
      return run(x.as<double>());
    case DType::kInt32:
      return run(x.as<int32_t>());
    case DType::kInt64:
      return run(x.as<int64_t>());
    default:
      fail(ErrorKind::kUnsupported, "{} '{}' on {} is not supported", a.op_type, a.name,
           dtype_name(x.dtype));
  }
}

template <class T>
void topk_of(const ops::TopKShape& s, const T* x, T* values, int64_t* indices) {
  const int64_t lines = s.lines();
#pragma omp parallel for if (lines * s.length >= kParallelElements)
  for (int64_t line = 0; line < lines; ++line) {
    std::vector<int64_t> order(static_cast<size_t>(s.length));
    std::iota(order.begin(), order.end(), int64_t{0});
    const auto k = static_cast<std::ptrdiff_t>(s.k);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t i, int64_t j) {
      return ops::topk_before(x[ops::topk_offset(s, line, i)], i, x[ops::topk_offset(s, line, j)],
                              j, s.largest);
    });
    for (int64_t r = 0; r < s.k; ++r) {
      const int64_t o = ops::topk_out_offset(s, line, r);
      values[o] = x[ops::topk_offset(s, line, order[r])];
      indices[o] = order[r];
    }
  }
}

void topk(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::TopKShape s = ops::topk_shape(a, x.shape, k_operand(a));
  const Shape y = ops::topk_output_shape(x.shape, s);
  expect_shape(a, 0, y);
  expect_shape(a, 1, y);
  Tensor& values = *a.out[0];
  int64_t* indices = a.out[1]->as<int64_t>();
  if (s.k == 0 || values.numel() == 0) return;
  by_number_type(a, x, [&]<class T>(const T* xs) { topk_of(s, xs, values.as<T>(), indices); });
}

// ---- ArgMax, ArgMin --------------------------------------------------------------------------

void arg_extreme(const KernelArgs& a) {
  const Tensor& x = a.input(0);
  const ops::TopKShape s = ops::arg_shape(a, x.shape);
  expect_shape(a, 0, ops::arg_output_shape(a, x.shape, s));
  const bool last = a.attrs.i("select_last_index", 0) != 0;
  int64_t* out = a.out[0]->as<int64_t>();
  const int64_t lines = s.lines();
  if (s.length == 0) return;
  by_number_type(a, x, [&]<class T>(const T* xs) {
#pragma omp parallel for if (lines * s.length >= kParallelElements)
    for (int64_t line = 0; line < lines; ++line) out[line] = ops::arg_of_line(xs, s, line, last);
  });
}

std::string check_arg_extreme(const OpSignature& s) {
  if (s.inputs.size() != 1 || s.outputs.size() != 1)
    return fmt::format("{} with {} inputs and {} outputs is not a valid signature (X; indices)",
                       s.op_type, s.inputs.size(), s.outputs.size());
  const DType d = s.inputs[0];
  if (d != DType::kFloat32 && d != DType::kFloat64 && d != DType::kInt32 && d != DType::kInt64)
    return fmt::format("{} on {} is not supported (float32, float64, int32, int64)", s.op_type,
                       dtype_name(d));
  if (s.outputs[0] != DType::kInt64)
    return fmt::format("{} to {} is not a valid signature (int64 indices)", s.op_type,
                       dtype_name(s.outputs[0]));
  return "";
}

// dX = 0 but dX[Indices[r]] = dValues[r] along each line (the indices of a line are distinct).
void topk_grad(const KernelArgs& a) {
  const ops::GradIo io(a, {.n_min = 1, .n_max = 2, .m_min = 2, .m_max = 2});
  Tensor* dx = nullptr;
  const Tensor *dy = nullptr, *x = nullptr;
  if (io.n > 1 && io.dx(1) != nullptr) ops::zero(*io.dx(1));
  if (!io.input0(dx, dy, x)) return;
  const ops::TopKShape s = ops::topk_shape(a, x->shape, io.x(1));
  const Shape y = ops::topk_output_shape(x->shape, s);
  ops::expect_dy_shape(a, *dy, y);
  const Tensor& indices = io.need_y(1);
  if (indices.shape != y || indices.dtype != DType::kInt64)
    fail(ErrorKind::kShape, "TopKGrad '{}': Indices are {}, expected int64 {}", a.name,
         indices.describe(), shape_string(y));
  ops::zero(*dx);
  const int64_t* idx = indices.as<int64_t>();
  const float* dys = dy->as<float>();
  float* dxs = dx->as<float>();
  const int64_t lines = s.lines();
  for (int64_t line = 0; line < lines; ++line) {
    for (int64_t r = 0; r < s.k; ++r) {
      const int64_t o = ops::topk_out_offset(s, line, r);
      if (idx[o] < 0 || idx[o] >= s.length)
        fail(ErrorKind::kModel, "TopKGrad '{}': index {} is outside axis length {}", a.name, idx[o],
             s.length);
      dxs[ops::topk_offset(s, line, idx[o])] = dys[o];
    }
  }
}

std::string check_topk(const OpSignature& s) {
  if (s.inputs.empty() || s.inputs.size() > 2 || s.outputs.size() != 2)
    return fmt::format(
        "TopK with {} inputs and {} outputs is not a valid signature (X, K; "
        "Values, Indices)",
        s.inputs.size(), s.outputs.size());
  const DType d = s.inputs[0];
  if (d != DType::kFloat32 && d != DType::kFloat64 && d != DType::kInt32 && d != DType::kInt64)
    return fmt::format("TopK on {} is not supported (float32, float64, int32, int64)",
                       dtype_name(d));
  if (s.inputs.size() == 2 && s.inputs[1] != DType::kInt64)
    return fmt::format("TopK's K is {}, expected int64", dtype_name(s.inputs[1]));
  if (s.outputs[0] != d || s.outputs[1] != DType::kInt64)
    return fmt::format(
        "TopK from {} to ({}, {}) is not a valid signature (Values of X's type, "
        "int64 Indices)",
        dtype_name(d), dtype_name(s.outputs[0]), dtype_name(s.outputs[1]));
  return "";
}

std::string check_topk_grad(const OpSignature& s) {
  if (auto why = ops::grad_arity_error(s, {.n_min = 1, .n_max = 2, .m_min = 2, .m_max = 2});
      !why.empty())
    return why;
  const size_t n = s.outputs.size();
  // x0, Values, dValues float32; K and Indices int64; dIndices omitted.
  const auto is = [&](size_t k, DType want) {
    return s.inputs[k] == want || s.inputs[k] == DType::kUndefined;
  };
  if (!is(0, DType::kFloat32) || !is(n, DType::kFloat32) || !is(n + 2, DType::kFloat32))
    return fmt::format("TopKGrad on {} is not supported (float32 only)", dtype_name(s.inputs[0]));
  if ((n == 2 && !is(1, DType::kInt64)) || !is(n + 1, DType::kInt64))
    return "TopKGrad's K and Indices must be int64";
  if (!is_float32_or_omitted(s.outputs[0]))
    return fmt::format("TopKGrad producing {} is not supported (float32 only)",
                       dtype_name(s.outputs[0]));
  return "";
}

// The gradients write every element of dx (zeroing it when dy is omitted).
constexpr KernelEntry kKernels[] = {
    {"DepthToSpace", space_depth, check_space_depth},
    {"SpaceToDepth", space_depth, check_space_depth},
    {"TopK", topk, check_topk},
    {"ArgMax", arg_extreme, check_arg_extreme},
    {"ArgMin", arg_extreme, check_arg_extreme},
    {"DepthToSpaceGrad", space_depth_grad, check_space_depth_grad, /*writes_every_output=*/true},
    {"SpaceToDepthGrad", space_depth_grad, check_space_depth_grad, /*writes_every_output=*/true},
    {"TopKGrad", topk_grad, check_topk_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> rearrange_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
