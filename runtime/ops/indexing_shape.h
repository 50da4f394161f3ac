#pragma once
/// \file
/// The host-side rules of Tile, CumSum, GatherElements and ScatterND, shared by the CPU kernels
/// (runtime/cpu/indexing.cpp) and the CUDA ones (runtime/cuda/indexing.cpp): operands and
/// attributes read and checked, one line naming the node and the numbers for a model error, and the
/// plain shapes and tables of indexing_element.h built from them. Both backends read these nodes
/// through these functions, so they accept, refuse and index alike.

#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/indexing_element.h"
#include "runtime/ops/layout.h"
#include "runtime/ops/resize_element.h"

namespace stagecraft::rt::ops {

/// Throws `Error(kUnsupported)` naming the op when `rank` is past kMaxIndexingRank.
inline void check_indexing_rank(const KernelArgs& a, size_t rank) {
  if (rank > static_cast<size_t>(kMaxIndexingRank))
    fail(ErrorKind::kUnsupported, "{} '{}' of a rank-{} input: at most rank {}", a.op_type, a.name,
         rank, kMaxIndexingRank);
}

// ---- Tile ------------------------------------------------------------------------------------

/// Tile of X (shape `x_shape`) by `repeats` (host memory): one non-negative repeat per dim.
inline TileShape tile_shape(const KernelArgs& a, const Shape& x_shape, const Tensor& repeats) {
  check_indexing_rank(a, x_shape.size());
  const std::vector<int64_t> r = read_ints(a, repeats, 1);
  if (r.size() != x_shape.size())
    fail(ErrorKind::kModel, "Tile '{}': {} repeats for a rank-{} input {}", a.name, r.size(),
         x_shape.size(), shape_string(x_shape));
  TileShape s;
  s.rank = static_cast<int32_t>(x_shape.size());
  const std::vector<int64_t> strides = dense_strides(x_shape);
  for (size_t d = 0; d < x_shape.size(); ++d) {
    if (r[d] < 0)
      fail(ErrorKind::kModel, "Tile '{}': repeat {} of dim {} is negative", a.name, r[d], d);
    s.x_dims[d] = x_shape[d];
    s.y_dims[d] = x_shape[d] * r[d];
    s.x_strides[d] = strides[d];
  }
  return s;
}

inline Shape tile_output_shape(const TileShape& s) { return Shape(s.y_dims, s.y_dims + s.rank); }

/// Tile's gradient as a separable sum: along dim d, input index i gathers output indices
/// i + k * x_dims[d] (k ascending), weight 1, as offsets into dY.
inline SeparableTableData tile_gradient_tables(const TileShape& s) {
  const Shape y_shape = tile_output_shape(s);
  const std::vector<int64_t> y_strides = dense_strides(y_shape);
  std::vector<SeparableDim> dims(static_cast<size_t>(s.rank));
  for (int d = 0; d < s.rank; ++d) {
    for (int64_t i = 0; i < s.x_dims[d]; ++i) {
      for (int64_t o = i; o < s.y_dims[d]; o += s.x_dims[d]) dims[d].add(o * y_strides[d], 1.0f);
      dims[d].close();
    }
  }
  return separable_tables(dims);
}

// ---- CumSum ----------------------------------------------------------------------------------

/// CumSum of X (shape `x_shape`) along `axis` (host memory: one int32 or int64 element).
inline ScanShape scan_shape(const KernelArgs& a, const Shape& x_shape, const Tensor& axis_operand) {
  const std::vector<int64_t> values = read_ints(a, axis_operand, 1);
  if (values.size() != 1)
    fail(ErrorKind::kModel, "CumSum '{}': axis has {} elements, expected one", a.name,
         values.size());
  const auto rank = static_cast<int64_t>(x_shape.size());
  if (rank == 0) fail(ErrorKind::kModel, "CumSum '{}' of a scalar: X needs a dim", a.name);
  if (values[0] < -rank || values[0] >= rank)
    fail(ErrorKind::kModel, "CumSum '{}': axis {} is out of range for rank {}", a.name, values[0],
         rank);
  const int64_t axis = values[0] < 0 ? values[0] + rank : values[0];
  ScanShape s;
  for (int64_t d = 0; d < rank; ++d)
    (d < axis ? s.outer : d > axis ? s.inner : s.length) *= x_shape[d];
  s.exclusive = a.attrs.i("exclusive", 0) != 0;
  s.reverse = a.attrs.i("reverse", 0) != 0;
  return s;
}

// ---- GatherElements --------------------------------------------------------------------------

/// GatherElements of data (shape `data_shape`) at `indices` (host memory, int32 or int64):
/// the shape, and the indices made non-negative. Throws naming the node and the numbers for an
/// axis out of range, indices of another rank or larger than the data off the axis, or an index
/// out of range.
struct GatherElementsPlan {
  GatherElementsShape shape;
  std::vector<int64_t> indices;
};

inline GatherElementsPlan gather_elements_plan(const KernelArgs& a, const Shape& data_shape,
                                               const Tensor& indices) {
  check_indexing_rank(a, data_shape.size());
  const auto rank = static_cast<int64_t>(data_shape.size());
  if (indices.rank() != rank)
    fail(ErrorKind::kModel, "GatherElements '{}': indices {} and data {} differ in rank", a.name,
         shape_string(indices.shape), shape_string(data_shape));
  const int64_t axis_attr = a.attrs.i("axis", 0);
  if (rank == 0 || axis_attr < -rank || axis_attr >= rank)
    fail(ErrorKind::kModel, "GatherElements '{}': axis {} is out of range for rank {}", a.name,
         axis_attr, rank);
  const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  GatherElementsPlan p;
  GatherElementsShape& s = p.shape;
  s.rank = static_cast<int32_t>(rank);
  s.axis = static_cast<int32_t>(axis);
  const std::vector<int64_t> data_strides = dense_strides(data_shape);
  const std::vector<int64_t> index_strides = dense_strides(indices.shape);
  for (int64_t d = 0; d < rank; ++d) {
    if (d != axis && indices.shape[d] > data_shape[d])
      fail(ErrorKind::kModel,
           "GatherElements '{}': indices {} are larger than data {} in dim {} (off the axis {})",
           a.name, shape_string(indices.shape), shape_string(data_shape), d, axis);
    s.data_dims[d] = data_shape[d];
    s.data_strides[d] = data_strides[d];
    s.index_dims[d] = indices.shape[d];
    s.index_strides[d] = index_strides[d];
  }
  p.indices = read_ints(a, indices, 1);
  const int64_t dim = data_shape[axis];
  for (int64_t& index : p.indices) {
    if (index < -dim || index >= dim)
      fail(ErrorKind::kModel,
           "GatherElements '{}': index {} is out of range for axis {} of size {}", a.name, index,
           axis, dim);
    if (index < 0) index += dim;
  }
  return p;
}

// ---- ScatterND -------------------------------------------------------------------------------

/// The reduction attribute (opset 16+), or why it is not run ("" when it is).
inline std::string scatter_reduction_error(const Attrs& attrs, ScatterReduction* reduction) {
  const std::string r = attrs.s("reduction", "none");
  if (r == "none") {
    *reduction = ScatterReduction::kNone;
  } else if (r == "add") {
    *reduction = ScatterReduction::kAdd;
  } else if (r == "mul") {
    *reduction = ScatterReduction::kMul;
  } else {
    return fmt::format("ScatterND reduction '{}' is not supported (none, add, mul)", r);
  }
  return "";
}

/// A ScatterND node resolved from its indices (host memory): the plan's tables in one int64
/// array (uploaded to the device as it is) and where each section starts.
struct ScatterPlanData {
  ScatterReduction reduction = ScatterReduction::kNone;
  int64_t slice = 1, slots = 1, updates = 0;
  std::vector<int64_t> values;
  size_t slot_entry = 0, entry_bounds = 0, entry_updates = 0, update_slot = 0, update_wins = 0;

  ScatterPlan at(const int64_t* base) const {
    return {reduction,
            slice,
            base + slot_entry,
            base + entry_bounds,
            base + entry_updates,
            base + update_slot,
            base + update_wins};
  }
};

/// The plan of a ScatterND of data (shape `data_shape`) with `indices` (host memory, int64,
/// shape [..., k]) and updates of shape `updates_shape` (indices' dims but the last, then the
/// data's dims from k on). Throws naming the node and the numbers for shapes that break that
/// rule or an index out of range; negative indices count from the end.
inline ScatterPlanData scatter_plan(const KernelArgs& a, const Shape& data_shape,
                                    const Tensor& indices, const Shape& updates_shape) {
  ScatterPlanData p;
  if (auto why = scatter_reduction_error(a.attrs, &p.reduction); !why.empty())
    fail(ErrorKind::kUnsupported, "ScatterND '{}': {}", a.name, why);
  if (indices.rank() == 0)
    fail(ErrorKind::kModel, "ScatterND '{}': indices are a scalar; they need a last dim", a.name);
  const int64_t k = indices.shape.back();
  const auto rank = static_cast<int64_t>(data_shape.size());
  if (k < 1 || k > rank)
    fail(ErrorKind::kModel,
         "ScatterND '{}': index tuples of {} elements (indices {}) for a rank-{} data {}", a.name,
         k, shape_string(indices.shape), rank, shape_string(data_shape));
  Shape expected(indices.shape.begin(), indices.shape.end() - 1);
  expected.insert(expected.end(), data_shape.begin() + k, data_shape.end());
  if (updates_shape != expected)
    fail(ErrorKind::kModel, "ScatterND '{}': updates are {}, expected {} (indices {}, data {})",
         a.name, shape_string(updates_shape), shape_string(expected), shape_string(indices.shape),
         shape_string(data_shape));
  for (int64_t d = k; d < rank; ++d) p.slice *= data_shape[d];
  for (int64_t d = 0; d < k; ++d) p.slots *= data_shape[d];
  const std::vector<int64_t> tuples = read_ints(a, indices, 1);
  p.updates = k == 0 ? 0 : static_cast<int64_t>(tuples.size()) / k;
  // Each update's slot, checked; the updates of each slot in order.
  std::vector<int64_t> slot_of(static_cast<size_t>(p.updates));
  std::vector<int64_t> entry(static_cast<size_t>(p.slots), -1);
  std::vector<std::vector<int64_t>> lists;
  for (int64_t u = 0; u < p.updates; ++u) {
    int64_t slot = 0;
    for (int64_t t = 0; t < k; ++t) {
      int64_t index = tuples[u * k + t];
      const int64_t dim = data_shape[t];
      if (index < -dim || index >= dim)
        fail(ErrorKind::kModel,
             "ScatterND '{}': index {} (update {}, element {}) is out of range for dim {} of size "
             "{}",
             a.name, index, u, t, t, dim);
      if (index < 0) index += dim;
      slot = slot * dim + index;
    }
    slot_of[u] = slot;
    if (entry[slot] < 0) {
      entry[slot] = static_cast<int64_t>(lists.size());
      lists.emplace_back();
    }
    lists[entry[slot]].push_back(u);
  }
  std::vector<int64_t>& v = p.values;
  p.slot_entry = 0;
  v = entry;
  p.entry_bounds = v.size();
  int64_t total = 0;
  v.push_back(0);
  for (const auto& list : lists) v.push_back(total += static_cast<int64_t>(list.size()));
  p.entry_updates = v.size();
  for (const auto& list : lists) v.insert(v.end(), list.begin(), list.end());
  p.update_slot = v.size();
  v.insert(v.end(), slot_of.begin(), slot_of.end());
  p.update_wins = v.size();
  v.resize(v.size() + static_cast<size_t>(p.updates), 0);
  for (const auto& list : lists) v[p.update_wins + static_cast<size_t>(list.back())] = 1;
  return p;
}

/// ScatterNDGrad's operands and plan (contract: data, indices, updates; dY, dData, dUpdates):
/// dY checked against the data, the wanted outputs against their operands, the indices read on
/// the host (`host_indices(t)` gives a host tensor of device tensor t, or t itself). nullopt,
/// the outputs zeroed, when there is nothing to compute (no dY, or neither gradient wanted).
/// Reduction mul has no gradient kernel and is refused.
struct ScatterNdGradOperands {
  const Tensor* dy = nullptr;
  const Tensor* data = nullptr;
  const Tensor* updates = nullptr;
  ScatterPlanData plan;
};

inline constexpr GradArity kScatterNdGradArity{.n_min = 3, .n_max = 3, .m_min = 1, .m_max = 1};

template <class HostIndices>
std::optional<ScatterNdGradOperands> scatter_nd_grad_operands(const KernelArgs& a,
                                                              const GradIo& io,
                                                              HostIndices&& host_indices) {
  const Tensor* dy = io.dy(0);
  if (dy == nullptr) zero_outputs(a);
  if (dy == nullptr || (!io.wants(0) && !io.wants(2))) return std::nullopt;
  const Tensor& data = io.need_x(0);
  const Tensor& updates = io.need_x(2);
  if (dy->shape != data.shape)
    fail(ErrorKind::kShape, "ScatterNDGrad '{}': the output gradient is {} but the data are {}",
         a.name, dy->describe(), data.describe());
  ScatterNdGradOperands o{dy, &data, &updates,
                          scatter_plan(a, data.shape, host_indices(io.need_x(1)), updates.shape)};
  if (o.plan.reduction == ScatterReduction::kMul)
    fail(ErrorKind::kUnsupported, "ScatterNDGrad '{}': reduction mul has no gradient kernel",
         a.name);
  if (io.wants(0)) expect_shape(a, 0, data.shape);
  if (io.wants(2)) expect_shape(a, 2, updates.shape);
  return o;
}

}  // namespace stagecraft::rt::ops
