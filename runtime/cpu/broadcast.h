#pragma once
/// \file
/// numpy's multidirectional broadcasting for CPU kernels (header-only); the shape it gives is
/// ops::broadcast_shape's (runtime/ops/broadcast.h, shared with the CUDA backend).
///
/// `Broadcast<N>` plans reading N inputs along a dense row-major output: it drops dims of size 1,
/// merges neighbouring dims that every input reads the same way (all along, or all repeated), and
/// then walks the output as runs of consecutive elements in which each input either advances by
/// one element or repeats one element (split among OpenMP threads, which is why it stays here). A
/// kernel supplies the loop over one run:
///
///   Broadcast<2> plan({a.shape, b.shape}, out.shape);
///   plan.for_each_run([&](int64_t o, const std::array<int64_t, 2>& in, int64_t count) {
///     for (int64_t i = 0; i < count; ++i)
///       y[o + i] = x0[in[0] + i * plan.step(0)] + x1[in[1] + i * plan.step(1)];
///   });
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/format/error.h"
#include "runtime/ops/broadcast.h"

namespace stagecraft::rt::cpu {

/// How N inputs, each broadcastable to an output shape, are read along the dense output.
template <size_t N>
class Broadcast {
  static_assert(N >= 1 && N <= 32, "inputs are tracked as bits of a 32-bit mask");

 public:
  /// Outputs of at least this many elements are walked by all of the worker's threads.
  static constexpr int64_t kParallelElements = int64_t{1} << 15;

  /// Plans reading `inputs` along `out`. Throws `Error(kShape)` when an input does not broadcast
  /// to `out` (out itself must be the full broadcast shape, not merely compatible).
  Broadcast(const std::array<Shape, N>& inputs, const Shape& out) {
    const size_t rank = out.size();
    auto refuse = [&](size_t k) {
      fail(ErrorKind::kShape, "input {} of shape {} does not broadcast to {}", k,
           shape_string(inputs[k]), shape_string(out));
    };
    for (size_t k = 0; k < N; ++k)
      if (inputs[k].size() > rank) refuse(k);
    // Kept axes, each with the set of inputs that repeat along it (bit k for input k).
    std::vector<uint32_t> masks;
    for (size_t axis = 0; axis < rank; ++axis) {
      uint32_t mask = 0;
      for (size_t k = 0; k < N; ++k) {
        const size_t lead = rank - inputs[k].size();
        const int64_t dim = axis < lead ? 1 : inputs[k][axis - lead];
        if (dim != out[axis] && dim != 1) refuse(k);
        if (dim != out[axis]) mask |= 1u << k;
      }
      if (out[axis] == 1) continue;  // size-1 axes move nothing
      if (!dims_.empty() && masks.back() == mask) {
        dims_.back() *= out[axis];  // merge with the previous axis: every input reads both alike
        continue;
      }
      dims_.push_back(out[axis]);
      masks.push_back(mask);
    }
    if (dims_.empty()) {
      dims_.push_back(1);
      masks.push_back(0);
    }
    const size_t m = dims_.size();
    for (size_t k = 0; k < N; ++k) {
      strides_[k].assign(m, 0);
      int64_t running = 1;
      for (size_t a = m; a-- > 0;) {
        if (masks[a] & (1u << k)) continue;
        strides_[k][a] = running;
        running *= dims_[a];
      }
    }
  }

  /// 1 when input k advances along a run, 0 when it repeats one element.
  int64_t step(size_t k) const { return strides_[k].back(); }

  /// Calls `body(out_offset, in_offsets, count)` for runs that together cover the output once:
  /// output elements [out_offset, out_offset + count) read input k at in_offsets[k] + i * step(k).
  /// Large outputs are split among the worker's OpenMP threads, so `body` must be safe to call
  /// concurrently on disjoint runs (and must not throw).
  template <class Body>
  void for_each_run(Body&& body) const {
    const int64_t len = dims_.back();
    int64_t total = len;
    for (size_t a = 0; a + 1 < dims_.size(); ++a) total *= dims_[a];
    if (total == 0) return;
#pragma omp parallel if (total >= kParallelElements)
    {
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      walk(total * t / threads, total * (t + 1) / threads, body);
    }
  }

 private:
  // Covers output elements [begin, end) as runs: a first partial row, whole rows, a last
  // partial row. The row index is decomposed once, then advanced like an odometer.
  template <class Body>
  void walk(int64_t begin, int64_t end, Body& body) const {
    if (begin >= end) return;
    const int64_t len = dims_.back();
    const size_t outer = dims_.size() - 1;
    std::vector<int64_t> index(outer);
    std::array<int64_t, N> row{};
    int64_t r = begin / len;
    for (size_t a = outer; a-- > 0;) {
      index[a] = r % dims_[a];
      r /= dims_[a];
      for (size_t k = 0; k < N; ++k) row[k] += index[a] * strides_[k][a];
    }
    int64_t col = begin % len;
    for (int64_t o = begin; o < end;) {
      int64_t count = std::min(len - col, end - o);
      std::array<int64_t, N> at;
      for (size_t k = 0; k < N; ++k) at[k] = row[k] + col * strides_[k][outer];
      body(o, at, count);
      o += count;
      col = 0;
      for (size_t a = outer; a-- > 0;) {  // next row
        for (size_t k = 0; k < N; ++k) row[k] += strides_[k][a];
        if (++index[a] < dims_[a]) break;
        for (size_t k = 0; k < N; ++k) row[k] -= strides_[k][a] * dims_[a];
        index[a] = 0;
      }
    }
  }

  Shape dims_;  // the output's dims, size-1 dims dropped and alike neighbours merged
  std::array<std::vector<int64_t>, N> strides_;  // per input, per merged axis; 0 where it repeats
};

/// Undoes broadcasting for gradients: sums the dense float32 `full` (shape `full_shape`) over
/// the dims along which `shape` broadcasts to it (numpy rules: leading dims and dims of size
/// 1), into the dense `out` of `shape`, which it overwrites. Defined in grad_eltwise.cpp.
void sum_to_shape(const float* full, const Shape& full_shape, float* out, const Shape& shape);

}  // namespace stagecraft::rt::cpu
