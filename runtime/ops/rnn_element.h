#pragma once
/// \file
/// The per-element arithmetic of ONNX's LSTM, GRU and RNN (default activations) forward and
/// backward through time, one (batch, hidden) element of one time step at a time, as plain
/// inline functions that the host compiler builds for the CPU backend (runtime/cpu/rnn.cpp) and
/// nvcc for the CUDA one (runtime/cuda/rnn_kernels.cu). The time loop and its matrix products
/// are rnn_core.h's, shared by both backends too. Nothing here includes a CUDA header.
///
/// Gate order in a row of G * H pre-activations: ONNX's own (LSTM i, o, f, c; GRU z, r, h; RNN
/// one gate). `xw` holds X_t W^T, `hr` H_{t-1} R^T (GRU with linear_before_reset = 0: its h
/// columns hold (r . H_{t-1}) R_h^T, computed between phase 0 and phase 1); biases are added here.

#include <cmath>
#include <cstdint>

#include "runtime/ops/host_device.h"

namespace stagecraft::rt::ops {

enum class RnnKind : int32_t { kRnn = 0, kGru = 1, kLstm = 2 };

/// One time step of one direction, forward: pointers into the step's rows ([B, G * H] or
/// [B, H]); biases and peepholes of the direction ([G * H], [3 * H]) or null.
struct RnnForwardStep {
  RnnKind kind = RnnKind::kLstm;
  int64_t hidden = 0;
  int32_t linear_before_reset = 0;
  const float* xw = nullptr;
  const float* hr = nullptr;
  const float* wb = nullptr;
  const float* rb = nullptr;
  const float* p = nullptr;
  const float* h_prev = nullptr;
  const float* c_prev = nullptr;
  float* gates = nullptr;  ///< [B, G * H]: the gates after their activations
  float* h = nullptr;      ///< [B, H]
  float* c = nullptr;      ///< [B, H] (LSTM)
  float* extra = nullptr;  ///< [B, H] (GRU): r . H_{t-1} (lbr 0) or H_{t-1} R_h^T + Rb_h (lbr 1)
};

/// One time step of one direction, backward. `dh` and `dc` carry the gradients of H_t and C_t
/// from the later steps in and those of H_{t-1} and C_{t-1} out (in place; dh then gets the
/// matrix product dAh R added by the caller). `da` is the gradient of the X-side
/// pre-activations, `dah` that of the recurrent side ([B, G * H]); `dp` the peephole terms of
/// this step ([B, 3 * H]) or null; `dq` (GRU lbr 0, phase 1) the gradient of r . H_{t-1}.
struct RnnBackwardStep {
  RnnKind kind = RnnKind::kLstm;
  int64_t hidden = 0;
  int32_t linear_before_reset = 0;
  const float* dy = nullptr;  ///< [B, H] of dY at this step, or null
  const float* gates = nullptr;
  const float* h = nullptr;
  const float* c = nullptr;
  const float* h_prev = nullptr;
  const float* c_prev = nullptr;
  const float* extra = nullptr;
  const float* p = nullptr;
  const float* dq = nullptr;
  float* dh = nullptr;
  float* dc = nullptr;
  float* da = nullptr;
  float* dah = nullptr;
  float* dp = nullptr;
};

STAGECRAFT_HOST_DEVICE inline float rnn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

STAGECRAFT_HOST_DEVICE inline float rnn_bias(const RnnForwardStep& s, int64_t k) {
  return (s.wb ? s.wb[k] : 0.0f) + (s.rb ? s.rb[k] : 0.0f);
}

/// Forward of element e = b * H + j. GRU with linear_before_reset = 0 runs in two phases (0: z,
/// r and r . H_{t-1}; 1, after the caller's product: h and H_t); every other case in phase 0.
STAGECRAFT_HOST_DEVICE inline void rnn_forward_element(const RnnForwardStep& s, int phase,
                                                       int64_t e) {
  const int64_t hs = s.hidden, b = e / hs, j = e % hs;
  if (s.kind == RnnKind::kRnn) {
    const float h = tanhf(s.xw[b * hs + j] + s.hr[b * hs + j] + rnn_bias(s, j));
    s.gates[e] = h;
    s.h[e] = h;
    return;
  }
  if (s.kind == RnnKind::kLstm) {
    const int64_t row = b * 4 * hs;
    const float cp = s.c_prev[e];
    auto pre = [&](int g) { return s.xw[row + g * hs + j] + s.hr[row + g * hs + j] + rnn_bias(s, g * hs + j); };
    const float i = rnn_sigmoid(pre(0) + (s.p ? s.p[j] * cp : 0.0f));
    const float f = rnn_sigmoid(pre(2) + (s.p ? s.p[2 * hs + j] * cp : 0.0f));
    const float cc = tanhf(pre(3));
    const float c = f * cp + i * cc;
    const float o = rnn_sigmoid(pre(1) + (s.p ? s.p[hs + j] * c : 0.0f));
    s.gates[row + j] = i;
    s.gates[row + hs + j] = o;
    s.gates[row + 2 * hs + j] = f;
    s.gates[row + 3 * hs + j] = cc;
    s.c[e] = c;
    s.h[e] = o * tanhf(c);
    return;
  }
  // GRU
  const int64_t row = b * 3 * hs;
  const float hp = s.h_prev[e];
  const bool lbr = s.linear_before_reset != 0;
  if (phase == 0) {
    const float z = rnn_sigmoid(s.xw[row + j] + s.hr[row + j] + rnn_bias(s, j));
    const float r = rnn_sigmoid(s.xw[row + hs + j] + s.hr[row + hs + j] + rnn_bias(s, hs + j));
    s.gates[row + j] = z;
    s.gates[row + hs + j] = r;
    if (!lbr) {
      s.extra[e] = r * hp;
      return;
    }
  }
  const float z = s.gates[row + j], r = s.gates[row + hs + j];
  const float xh = s.xw[row + 2 * hs + j] + (s.wb ? s.wb[2 * hs + j] : 0.0f);
  const float rh = s.hr[row + 2 * hs + j] + (s.rb ? s.rb[2 * hs + j] : 0.0f);
  float hh;
  if (lbr) {
    s.extra[e] = rh;
    hh = tanhf(xh + r * rh);
  } else {
    hh = tanhf(xh + rh);
  }
  s.gates[row + 2 * hs + j] = hh;
  s.h[e] = (1.0f - z) * hh + z * hp;
}

/// Backward of element e. GRU with linear_before_reset = 0 has a phase 1 after the caller's
/// product dq = dAh_h R_h (the reset gate's gradient needs it); every other case phase 0 only.
STAGECRAFT_HOST_DEVICE inline void rnn_backward_element(const RnnBackwardStep& s, int phase,
                                                        int64_t e) {
  const int64_t hs = s.hidden, b = e / hs, j = e % hs;
  if (s.kind == RnnKind::kRnn) {
    const float dh = (s.dy ? s.dy[e] : 0.0f) + s.dh[e];
    const float h = s.gates[e];
    const float da = dh * (1.0f - h * h);
    s.da[e] = da;
    s.dh[e] = 0.0f;
    return;
  }
  if (s.kind == RnnKind::kLstm) {
    const int64_t row = b * 4 * hs;
    const float dh = (s.dy ? s.dy[e] : 0.0f) + s.dh[e];
    const float i = s.gates[row + j], o = s.gates[row + hs + j], f = s.gates[row + 2 * hs + j],
                cc = s.gates[row + 3 * hs + j];
    const float c = s.c[e], cp = s.c_prev[e];
    const float tc = tanhf(c);
    const float pi = s.p ? s.p[j] : 0.0f, po = s.p ? s.p[hs + j] : 0.0f,
                pf = s.p ? s.p[2 * hs + j] : 0.0f;
    const float dao = dh * tc * o * (1.0f - o);
    const float dcell = s.dc[e] + dh * o * (1.0f - tc * tc) + dao * po;
    const float dai = dcell * cc * i * (1.0f - i);
    const float daf = dcell * cp * f * (1.0f - f);
    const float dac = dcell * i * (1.0f - cc * cc);
    s.da[row + j] = dai;
    s.da[row + hs + j] = dao;
    s.da[row + 2 * hs + j] = daf;
    s.da[row + 3 * hs + j] = dac;
    s.dc[e] = dcell * f + dai * pi + daf * pf;
    if (s.dp) {
      s.dp[b * 3 * hs + j] = dai * cp;
      s.dp[b * 3 * hs + hs + j] = dao * c;
      s.dp[b * 3 * hs + 2 * hs + j] = daf * cp;
    }
    s.dh[e] = 0.0f;
    return;
  }
  // GRU
  const int64_t row = b * 3 * hs;
  const bool lbr = s.linear_before_reset != 0;
  const float z = s.gates[row + j], r = s.gates[row + hs + j], hh = s.gates[row + 2 * hs + j];
  const float hp = s.h_prev[e];
  if (phase == 1) {  // lbr 0: dq = dAh_h R_h is known
    const float dq = s.dq[e];
    const float dar = dq * hp * r * (1.0f - r);
    s.da[row + hs + j] = dar;
    s.dah[row + hs + j] = dar;
    s.dh[e] += dq * r;
    return;
  }
  const float dh = (s.dy ? s.dy[e] : 0.0f) + s.dh[e];
  const float daz = dh * (hp - hh) * z * (1.0f - z);
  const float dah = dh * (1.0f - z) * (1.0f - hh * hh);
  s.da[row + j] = daz;
  s.dah[row + j] = daz;
  s.da[row + 2 * hs + j] = dah;
  if (lbr) {
    const float rh = s.extra[e];
    const float dar = dah * rh * r * (1.0f - r);
    s.da[row + hs + j] = dar;
    s.dah[row + hs + j] = dar;
    s.dah[row + 2 * hs + j] = dah * r;
  } else {
    s.dah[row + 2 * hs + j] = dah;
  }
  s.dh[e] = dh * z;
}

}  // namespace stagecraft::rt::ops
