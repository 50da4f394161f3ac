#pragma once
/// \file
/// ONNX's LSTM, GRU and RNN as both backends run them: the node read and checked (one line naming
/// the node and the numbers when it is outside what the kernels take), and the time loop of the
/// forward and of the backward through time, written once over an `Ops` that supplies memory,
/// row-major matrix products and the per-element step kernels (rnn_element.h). The CPU backend
/// (runtime/cpu/rnn.cpp) gives it oneDNN's sgemm and plain loops, the CUDA one
/// (runtime/cuda/rnn.cpp) cuBLAS and device kernels, so both run the same products in the same
/// order.
///
/// Taken: layout 0 ([T, B, I]), forward / reverse / bidirectional, the default activations
/// (LSTM sigmoid, tanh, tanh; GRU sigmoid, tanh; RNN tanh), optional B, initial_h, initial_c
/// and P, GRU's linear_before_reset 0 and 1, sequence_lens absent or all equal to T. Refused:
/// layout 1, other activations, clip, input_forget, shorter sequences.
///
/// The gradient recomputes the forward of each direction (keeping its gates, states and GRU's
/// extra terms), then walks back through time: per step one element kernel, then the recurrent
/// products dH_{t-1} += dAh R and dR += dAh^T H_{t-1}; after the loop dX += dA W, dW = dA^T X,
/// dB the column sums of dA (W side) and dAh (R side), dP those of the peephole terms.

#include <fmt/format.h>

#include <string>
#include <vector>

#include "runtime/core/kernel.h"
#include "runtime/format/error.h"
#include "runtime/ops/grad_io.h"
#include "runtime/ops/rnn_element.h"

namespace stagecraft::rt::ops {

/// One LSTM, GRU or RNN node resolved.
struct RnnGeometry {
  RnnKind kind = RnnKind::kLstm;
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, dirs = 1, gates = 4;
  bool reverse = false;  ///< direction "reverse" (one direction, run from T - 1 down)
  int32_t linear_before_reset = 0;
  bool has_b = false, has_h0 = false, has_c0 = false, has_p = false, has_seq_lens = false;
  int64_t gh() const { return gates * hidden; }
};

inline RnnKind rnn_kind(std::string_view op_type) {
  if (op_type == "LSTM" || op_type == "LSTMGrad") return RnnKind::kLstm;
  if (op_type == "GRU" || op_type == "GRUGrad") return RnnKind::kGru;
  return RnnKind::kRnn;
}

/// "" when the attributes are ones the kernels take, else why not (naming the op).
inline std::string rnn_attribute_error(std::string_view op_type, const Attrs& attrs) {
  const RnnKind kind = rnn_kind(op_type);
  const std::string op(kind == RnnKind::kLstm ? "LSTM" : kind == RnnKind::kGru ? "GRU" : "RNN");
  if (attrs.i("layout", 0) != 0)
    return fmt::format("{} layout {} is not supported (layout 0, [seq, batch, input], only)", op,
                       attrs.i("layout", 0));
  if (attrs.has("clip")) return fmt::format("{} with clip is not supported", op);
  if (attrs.i("input_forget", 0) != 0)
    return fmt::format("{} input_forget {} is not supported", op, attrs.i("input_forget", 0));
  const std::string dir = attrs.s("direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional")
    return fmt::format("{} direction '{}' is not forward, reverse or bidirectional", op, dir);
  if (attrs.i("hidden_size", 0) <= 0 && attrs.has("hidden_size"))
    return fmt::format("{} hidden_size {} must be positive", op, attrs.i("hidden_size", 0));
  const int lbr = static_cast<int>(attrs.i("linear_before_reset", 0));
  if (kind == RnnKind::kGru && lbr != 0 && lbr != 1)
    return fmt::format("GRU linear_before_reset {} is not 0 or 1", lbr);
  if (attrs.has("activations"))
    return fmt::format(
        "{} with an activations attribute: the import checks and drops the default ones, and "
        "the kernels run the defaults only",
        op);
  return "";
}

/// "" when `acts` (a node's activations attribute) are the defaults of `op_type` for its
/// `direction` (LSTM Sigmoid, Tanh, Tanh; GRU Sigmoid, Tanh; RNN Tanh; once per direction), else
/// one line saying why not. The import drops default activations (compiler/import.cpp).
inline std::string rnn_activations_error(std::string_view op_type, std::string_view direction,
                                         const std::vector<std::string>& acts) {
  const RnnKind kind = rnn_kind(op_type);
  const std::vector<std::string> one =
      kind == RnnKind::kLstm ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
      : kind == RnnKind::kGru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                              : std::vector<std::string>{"Tanh"};
  const size_t dirs = direction == "bidirectional" ? 2 : 1;
  bool ok = acts.size() == one.size() * dirs;
  for (size_t k = 0; ok && k < acts.size(); ++k) ok = acts[k] == one[k % one.size()];
  if (ok) return "";
  std::string list, want;
  for (const auto& a : acts) list += (list.empty() ? "" : ", ") + a;
  for (size_t k = 0; k < one.size() * dirs; ++k)
    want += (want.empty() ? "" : ", ") + one[k % one.size()];
  return fmt::format("{} activations [{}] are not supported (only the defaults [{}])", op_type,
                     list, want);
}

/// The node's geometry from the shapes of its operands (`shape(k)` null for an omitted one).
template <class ShapeOf>
RnnGeometry rnn_geometry(const KernelArgs& a, ShapeOf shape) {
  RnnGeometry g;
  g.kind = rnn_kind(a.op_type);
  if (std::string why = rnn_attribute_error(a.op_type, a.attrs); !why.empty())
    fail(ErrorKind::kUnsupported, "'{}': {}", a.name, why);
  g.gates = g.kind == RnnKind::kLstm ? 4 : g.kind == RnnKind::kGru ? 3 : 1;
  const std::string dir = a.attrs.s("direction", "forward");
  g.dirs = dir == "bidirectional" ? 2 : 1;
  g.reverse = dir == "reverse";
  g.linear_before_reset = static_cast<int32_t>(a.attrs.i("linear_before_reset", 0));
  const Shape* x = shape(0);
  const Shape* w = shape(1);
  const Shape* r = shape(2);
  if (x == nullptr || w == nullptr || r == nullptr)
    fail(ErrorKind::kModel, "{} '{}' needs its inputs X, W and R", a.op_type, a.name);
  if (x->size() != 3 || w->size() != 3 || r->size() != 3)
    fail(ErrorKind::kShape, "{} '{}': X {}, W {} and R {} must each be rank 3", a.op_type, a.name,
         shape_string(*x), shape_string(*w), shape_string(*r));
  g.seq = (*x)[0];
  g.batch = (*x)[1];
  g.input = (*x)[2];
  g.hidden = a.attrs.i("hidden_size", (*r)[2]);
  const int64_t gh = g.gh();
  if (*w != Shape{g.dirs, gh, g.input} || *r != Shape{g.dirs, gh, g.hidden})
    fail(ErrorKind::kShape,
         "{} '{}': W {} and R {} should be [{}, {}, {}] and [{}, {}, {}] (X {}, hidden_size {}, "
         "{} direction(s))",
         a.op_type, a.name, shape_string(*w), shape_string(*r), g.dirs, gh, g.input, g.dirs, gh,
         g.hidden, shape_string(*x), g.hidden, g.dirs);
  auto optional = [&](size_t k, const Shape& want, const char* what) {
    const Shape* s = shape(k);
    if (s == nullptr) return false;
    if (*s != want)
      fail(ErrorKind::kShape, "{} '{}': {} is {}, expected {}", a.op_type, a.name, what,
           shape_string(*s), shape_string(want));
    return true;
  };
  g.has_b = optional(3, {g.dirs, 2 * gh}, "B");
  g.has_seq_lens = optional(4, {g.batch}, "sequence_lens");
  g.has_h0 = optional(5, {g.dirs, g.batch, g.hidden}, "initial_h");
  if (g.kind == RnnKind::kLstm) {
    g.has_c0 = optional(6, {g.dirs, g.batch, g.hidden}, "initial_c");
    g.has_p = optional(7, {g.dirs, 3 * g.hidden}, "P");
  }
  return g;
}

/// The shapes of the outputs: Y [T, D, B, H], Y_h and Y_c [D, B, H].
inline Shape rnn_y_shape(const RnnGeometry& g) { return {g.seq, g.dirs, g.batch, g.hidden}; }
inline Shape rnn_state_shape(const RnnGeometry& g) { return {g.dirs, g.batch, g.hidden}; }

/// Throws `Error(kUnsupported)` unless every sequence length (host values) is T.
inline void check_sequence_lens(const KernelArgs& a, const RnnGeometry& g,
                                const std::vector<int64_t>& lens) {
  for (size_t b = 0; b < lens.size(); ++b)
    if (lens[b] != g.seq)
      fail(ErrorKind::kUnsupported,
           "{} '{}': sequence_lens[{}] = {} but the sequences are {} long (only full-length "
           "sequences are supported)",
           a.op_type, a.name, b, lens[b], g.seq);
}

/// Device pointers of one node's operands; null where omitted or not wanted.
struct RnnOperands {
  const float *x = nullptr, *w = nullptr, *r = nullptr, *b = nullptr, *h0 = nullptr,
              *c0 = nullptr, *p = nullptr;
  float *y = nullptr, *yh = nullptr, *yc = nullptr;  // forward outputs
  const float *dy = nullptr, *dyh = nullptr, *dyc = nullptr;
  float *dx = nullptr, *dw = nullptr, *dr = nullptr, *db = nullptr, *dh0 = nullptr,
        *dc0 = nullptr, *dp = nullptr;
};

inline const float* rnn_in(const Tensor* t) { return t ? t->as<float>() : nullptr; }
inline float* rnn_out(Tensor* t) { return t ? t->as<float>() : nullptr; }

/// The forward's operands of node `a` of geometry `g`, its outputs' shapes and sequence_lens
/// checked first. `read_lens(const Tensor&)` reads sequence_lens (input 4) to the host: each
/// backend's own copy.
template <class ReadLens>
RnnOperands rnn_forward_operands(const KernelArgs& a, const RnnGeometry& g, ReadLens read_lens) {
  if (a.has_input(4)) check_sequence_lens(a, g, read_lens(*a.in[4]));
  auto out = [&](size_t k) { return k < a.out.size() ? a.out[k] : nullptr; };
  if (out(0)) expect_shape(a, 0, rnn_y_shape(g));
  if (out(1)) expect_shape(a, 1, rnn_state_shape(g));
  if (out(2)) expect_shape(a, 2, rnn_state_shape(g));
  RnnOperands t;
  t.x = rnn_in(a.in[0]);
  t.w = rnn_in(a.in[1]);
  t.r = rnn_in(a.in[2]);
  t.b = a.has_input(3) ? rnn_in(a.in[3]) : nullptr;
  t.h0 = a.has_input(5) ? rnn_in(a.in[5]) : nullptr;
  t.c0 = g.has_c0 ? rnn_in(a.in[6]) : nullptr;
  t.p = g.has_p ? rnn_in(a.in[7]) : nullptr;
  t.y = rnn_out(out(0));
  t.yh = rnn_out(out(1));
  t.yc = g.kind == RnnKind::kLstm ? rnn_out(out(2)) : nullptr;
  return t;
}

/// The gradient's operands of node `a` of geometry `g` (through its contract `io`), the output
/// gradients' and wanted input gradients' shapes and sequence_lens checked first.
template <class ReadLens>
RnnOperands rnn_grad_operands(const KernelArgs& a, const GradIo& io, const RnnGeometry& g,
                              ReadLens read_lens) {
  if (io.x(4)) check_sequence_lens(a, g, read_lens(*io.x(4)));
  if (io.dy(0)) expect_dy_shape(a, *io.dy(0), rnn_y_shape(g));
  if (io.dy(1)) expect_dy_shape(a, *io.dy(1), rnn_state_shape(g));
  if (io.dy(2)) expect_dy_shape(a, *io.dy(2), rnn_state_shape(g));
  for (size_t k = 0; k < io.n; ++k) {
    if (!io.wants(k)) continue;
    if (k == 4 || io.x(k) == nullptr)
      fail(ErrorKind::kModel, "{} '{}': a gradient of input {}, which has none", a.op_type,
           a.name, k);
    expect_shape(a, k, io.x(k)->shape);
  }
  const bool lstm = g.kind == RnnKind::kLstm;
  RnnOperands t;
  t.x = rnn_in(io.x(0));
  t.w = rnn_in(io.x(1));
  t.r = rnn_in(io.x(2));
  t.b = rnn_in(io.x(3));
  t.h0 = rnn_in(io.x(5));
  t.c0 = g.has_c0 ? rnn_in(io.x(6)) : nullptr;
  t.p = g.has_p ? rnn_in(io.x(7)) : nullptr;
  t.dy = rnn_in(io.dy(0));
  t.dyh = rnn_in(io.dy(1));
  t.dyc = lstm ? rnn_in(io.dy(2)) : nullptr;
  t.dx = rnn_out(io.dx(0));
  t.dw = rnn_out(io.dx(1));
  t.dr = rnn_out(io.dx(2));
  t.db = rnn_out(io.dx(3));
  t.dh0 = rnn_out(io.dx(5));
  t.dc0 = lstm ? rnn_out(io.dx(6)) : nullptr;
  t.dp = lstm ? rnn_out(io.dx(7)) : nullptr;
  return t;
}

/// The forward (backward = false: writes y, yh, yc where not null) or the gradient (backward =
/// true: writes every non-null d* in full) of one node. `Ops` provides (counts in floats):
///   float* alloc(int64_t n); void zero(float*, int64_t n);
///   void copy2d(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
///               int64_t cols, int64_t rows);
///   void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
///             int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
///     (row-major: C = alpha op(A) op(B) + beta C)
///   void forward(const RnnForwardStep&, int phase, int64_t elements);
///   void backward(const RnnBackwardStep&, int phase, int64_t elements);
///   void colsum(const float* src, int64_t rows, int64_t cols, float* dst);  // dst[c] = sum_r
template <class Ops>
void rnn_run(Ops& ops, const RnnGeometry& g, const RnnOperands& t, bool backward) {
  const int64_t T = g.seq, B = g.batch, I = g.input, H = g.hidden, GH = g.gh(), D = g.dirs;
  const int64_t BH = B * H;
  const bool gru0 = g.kind == RnnKind::kGru && g.linear_before_reset == 0;
  // Columns of the recurrent product taken before the gates (GRU lbr 0: z and r only).
  const int64_t rcols = gru0 ? 2 * H : GH;
  float* zeros = ops.alloc(BH);
  ops.zero(zeros, BH);
  float* xw = ops.alloc(T * B * GH);
  float* hr = ops.alloc(B * GH);
  float* gates = ops.alloc(T * B * GH);
  float* hs = ops.alloc(T * BH);
  float* cs = g.kind == RnnKind::kLstm ? ops.alloc(T * BH) : nullptr;
  float* extra = g.kind == RnnKind::kGru ? ops.alloc(T * BH) : nullptr;
  float *da = nullptr, *dah = nullptr, *dh = nullptr, *dc = nullptr, *dq = nullptr,
        *dp_all = nullptr;
  if (backward) {
    da = ops.alloc(T * B * GH);
    dah = g.kind == RnnKind::kGru ? ops.alloc(T * B * GH) : da;
    dh = ops.alloc(BH);
    dc = ops.alloc(BH);
    if (gru0) dq = ops.alloc(BH);
    if (t.dp) dp_all = ops.alloc(T * B * 3 * H);
    if (t.dr) ops.zero(t.dr, D * GH * H);
  }
  for (int64_t d = 0; d < D; ++d) {
    const bool rev = g.reverse || d == 1;
    const float* wd = t.w + d * GH * I;
    const float* rd = t.r + d * GH * H;
    const float* wb = t.b ? t.b + d * 2 * GH : nullptr;
    const float* rb = t.b ? wb + GH : nullptr;
    const float* pd = t.p ? t.p + d * 3 * H : nullptr;
    const float* h0 = t.h0 ? t.h0 + d * BH : zeros;
    const float* c0 = t.c0 ? t.c0 + d * BH : zeros;
    auto step_time = [&](int64_t s) { return rev ? T - 1 - s : s; };
    auto prev_h = [&](int64_t s) -> const float* {
      return s == 0 ? h0 : hs + step_time(s - 1) * BH;
    };
    auto prev_c = [&](int64_t s) -> const float* {
      return s == 0 ? c0 : cs + step_time(s - 1) * BH;
    };
    // Forward: X W^T for every step at once, then the recurrence.
    if (T > 0 && B > 0) ops.gemm(false, true, T * B, GH, I, 1.0f, t.x, I, wd, I, 0.0f, xw, GH);
    for (int64_t s = 0; s < T; ++s) {
      const int64_t tt = step_time(s);
      const float* hp = prev_h(s);
      ops.gemm(false, true, B, rcols, H, 1.0f, hp, H, rd, H, 0.0f, hr, GH);
      RnnForwardStep st;
      st.kind = g.kind;
      st.hidden = H;
      st.linear_before_reset = g.linear_before_reset;
      st.xw = xw + tt * B * GH;
      st.hr = hr;
      st.wb = wb;
      st.rb = rb;
      st.p = pd;
      st.h_prev = hp;
      st.c_prev = cs ? prev_c(s) : nullptr;
      st.gates = gates + tt * B * GH;
      st.h = hs + tt * BH;
      st.c = cs ? cs + tt * BH : nullptr;
      st.extra = extra ? extra + tt * BH : nullptr;
      ops.forward(st, 0, BH);
      if (gru0) {  // (r . H_{t-1}) R_h^T into hr's h columns
        ops.gemm(false, true, B, H, H, 1.0f, st.extra, H, rd + 2 * H * H, H, 0.0f, hr + 2 * H,
                 GH);
        ops.forward(st, 1, BH);
      }
    }
    if (!backward) {
      if (t.y && T > 0) ops.copy2d(t.y + d * BH, D * BH, hs, BH, BH, T);
      const int64_t last = T > 0 ? step_time(T - 1) : 0;
      if (t.yh) ops.copy2d(t.yh + d * BH, BH, T > 0 ? hs + last * BH : h0, BH, BH, 1);
      if (t.yc) ops.copy2d(t.yc + d * BH, BH, T > 0 ? cs + last * BH : c0, BH, BH, 1);
      continue;
    }
    // Backward through time.
    if (t.dyh)
      ops.copy2d(dh, BH, t.dyh + d * BH, BH, BH, 1);
    else
      ops.zero(dh, BH);
    if (t.dyc)
      ops.copy2d(dc, BH, t.dyc + d * BH, BH, BH, 1);
    else
      ops.zero(dc, BH);
    for (int64_t s = T - 1; s >= 0; --s) {
      const int64_t tt = step_time(s);
      const float* hp = prev_h(s);
      RnnBackwardStep st;
      st.kind = g.kind;
      st.hidden = H;
      st.linear_before_reset = g.linear_before_reset;
      st.dy = t.dy ? t.dy + (tt * D + d) * BH : nullptr;
      st.gates = gates + tt * B * GH;
      st.h = hs + tt * BH;
      st.c = cs ? cs + tt * BH : nullptr;
      st.h_prev = hp;
      st.c_prev = cs ? prev_c(s) : nullptr;
      st.extra = extra ? extra + tt * BH : nullptr;
      st.p = pd;
      st.dq = dq;
      st.dh = dh;
      st.dc = dc;
      st.da = da + tt * B * GH;
      st.dah = dah + tt * B * GH;
      st.dp = dp_all ? dp_all + tt * B * 3 * H : nullptr;
      ops.backward(st, 0, BH);
      if (gru0) {  // dq = dAh_h R_h, then the reset gate and dH_{t-1} through r . H_{t-1}
        ops.gemm(false, false, B, H, H, 1.0f, st.dah + 2 * H, GH, rd + 2 * H * H, H, 0.0f, dq,
                 H);
        ops.backward(st, 1, BH);
        if (t.dr)
          ops.gemm(true, false, H, H, B, 1.0f, st.dah + 2 * H, GH, st.extra, H, 1.0f,
                   t.dr + d * GH * H + 2 * H * H, H);
      }
      ops.gemm(false, false, B, H, rcols, 1.0f, st.dah, GH, rd, H, 1.0f, dh, H);
      if (t.dr)
        ops.gemm(true, false, rcols, H, B, 1.0f, st.dah, GH, hp, H, 1.0f, t.dr + d * GH * H, H);
    }
    if (t.dh0) ops.copy2d(t.dh0 + d * BH, BH, dh, BH, BH, 1);
    if (t.dc0) ops.copy2d(t.dc0 + d * BH, BH, dc, BH, BH, 1);
    if (T > 0 && B > 0) {
      if (t.dx)
        ops.gemm(false, false, T * B, I, GH, 1.0f, da, GH, wd, I, d == 0 ? 0.0f : 1.0f, t.dx, I);
      if (t.dw) ops.gemm(true, false, GH, I, T * B, 1.0f, da, GH, t.x, I, 0.0f, t.dw + d * GH * I, I);
      if (t.db) {
        ops.colsum(da, T * B, GH, t.db + d * 2 * GH);
        ops.colsum(dah, T * B, GH, t.db + d * 2 * GH + GH);
      }
      if (t.dp) ops.colsum(dp_all, T * B, 3 * H, t.dp + d * 3 * H);
    } else {
      if (t.dx && d == 0) ops.zero(t.dx, T * B * I);
      if (t.dw) ops.zero(t.dw + d * GH * I, GH * I);
      if (t.db) ops.zero(t.db + d * 2 * GH, 2 * GH);
      if (t.dp) ops.zero(t.dp + d * 3 * H, 3 * H);
    }
  }
}

/// The recurrent gradients' operand counts: X, W, R and the optional B, sequence_lens, initial_h,
/// initial_c, P; Y and the optional Y_h, Y_c.
inline constexpr GradArity kRnnGradArity{.n_min = 3, .n_max = 8, .m_min = 1, .m_max = 3};

}  // namespace stagecraft::rt::ops
