#pragma once
/// \file
/// Trilu one element at a time, as a plain inline function that the host compiler builds for
/// the CPU backend (runtime/cpu/data.cpp, grad_data.cpp) and nvcc for the CUDA one
/// (runtime/cuda/data_kernels.cu), and the node's reading (attribute upper, the optional k
/// input) shared by both. Nothing here includes a CUDA header.

#include <cstdint>

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::ops {

/// A Trilu resolved: matrices of `rows` x `cols` (X's last two dims), element (r, c) kept when
/// upper ? c - r >= k : c - r <= k, zero otherwise.
struct TriluShape {
  int64_t rows = 1, cols = 1, k = 0;
  bool upper = true;
};

/// Whether element `e` of X (row-major) is kept.
STAGECRAFT_HOST_DEVICE inline bool trilu_keeps(const TriluShape& s, int64_t e) {
  const int64_t c = e % s.cols, r = (e / s.cols) % s.rows;
  return s.upper ? c - r >= s.k : c - r <= s.k;
}

}  // namespace stagecraft::rt::ops
