#pragma once
/// \file
/// Device kernels of the CUDA recurrent family (rnn_kernels.cu): one step of LSTM, GRU or RNN
/// forward or backward, one thread per (batch, hidden) element through runtime/ops/
/// rnn_element.h's functions (which the CPU backend runs too), and the column sums of the bias and
/// peephole gradients (one thread per column, rows in order, as the CPU sums them). The time
/// loop and the cuBLAS products are the host's (rnn.cpp, over runtime/ops/rnn_core.h).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/ops/rnn_element.h"

namespace stagecraft::rt::cuda {

/// rnn_forward_element(step, phase, e) for e in [0, n).
void launch_rnn_forward(const ops::RnnForwardStep& step, int phase, int64_t n, cudaStream_t stream);

/// rnn_backward_element(step, phase, e) for e in [0, n).
void launch_rnn_backward(const ops::RnnBackwardStep& step, int phase, int64_t n,
                         cudaStream_t stream);

/// dst[c] = sum over r of src[r * cols + c], summed in double in row order.
void launch_column_sums(const float* src, int64_t rows, int64_t cols, float* dst,
                        cudaStream_t stream);

}  // namespace stagecraft::rt::cuda
