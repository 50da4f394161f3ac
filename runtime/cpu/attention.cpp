// Fused Attention and its gradient on float32 (the op's contract and operand rules:
// runtime/ops/attention_shape.h), by FlashAttention's algorithm: no [Tq, Tk] score matrix is
// ever held for a whole batch entry. The forward walks each block of queries over blocks of
// keys with an online softmax (a running max m and sum l per query; O rescaled as m grows), so
// a thread holds one block of scores at a time. The gradient (FlashAttention-2) recomputes each
// block's probabilities P = exp(S - lse) from the forward's lse. Where there are batch entries
// enough for every thread, a thread takes a whole entry and one pass over its tiles gives dQ,
// dK and dV; else one pass over query blocks gives dQ and one over key blocks dK and dV. Either
// way every output row has one writer and no atomics are needed. A learned mask's gradient (a
// position bias) is one more pass, over the entries that share each plane of it. Blocks are OpenMP
// tasks with a fixed order of work inside each, so a run gives the same bits whatever thread takes
// a block. The block products are oneDNN's sgemm (row-major; single-threaded inside the parallel
// region); the exponentials are vectorise.h's, in loops the compiler vectorises for the processor's
// vector units (STAGECRAFT_CPU_CLONES).
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/cpu/vectorise.h"
#include "runtime/format/error.h"
#include "runtime/ops/attention_shape.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::cpu {
namespace {

constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;
constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// C = alpha * op(A) op(B) + beta * C, row-major; false when sgemm fails. An empty inner
// dimension scales C by beta (0: zeros), as the product of empty matrices is.
bool gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return true;
  if (k == 0) {
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) c[r * ldc + j] = beta == 0.0f ? 0.0f : beta * c[r * ldc + j];
    return true;
  }
  return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) ==
         dnnl_success;
}

// The operands of one node, as dense float32 arrays ([batch, T, ...] row-major).
struct Problem {
  const ops::AttentionDims& s;
  const float* q;
  const float* k;
  const float* v;
  const float* mask;  // null without one
};

// A rectangle of the scores of batch entry `b`: queries [q0, q0 + nq), keys [k0, k0 + nk).
struct Tile {
  int64_t b, q0, nq, k0, nk;
};

// S = scale * Q K^T + mask over tile `t` into `s` (nq rows of stride kKeyBlock), -inf where
// `causal` hides the key from the query. False when sgemm fails.
STAGECRAFT_CPU_CLONES bool scores(const Problem& p, const Tile& t, float* s) {
  const ops::AttentionDims& d = p.s;
  if (!gemm(false, true, t.nq, t.nk, d.d, d.scale, p.q + (t.b * d.tq + t.q0) * d.d, d.d,
            p.k + (t.b * d.tk + t.k0) * d.d, d.d, 0.0f, s, kKeyBlock))
    return false;
  const int64_t plane = ops::attention_mask_plane(d, t.b);
  for (int64_t r = 0; r < t.nq; ++r) {
    float* row = s + r * kKeyBlock;
    if (p.mask != nullptr) {
      const float* mask_row = p.mask + plane + (t.q0 + r) * d.mask_row_stride;
      const int64_t col = d.mask_col_stride;
      if (col == 1) {
        const float* m = mask_row + t.k0;
#pragma omp simd
        for (int64_t j = 0; j < t.nk; ++j) row[j] += m[j];
      } else {
        for (int64_t j = 0; j < t.nk; ++j) row[j] += mask_row[(t.k0 + j) * col];
      }
    }
    const int64_t seen = ops::attention_keys_seen(d, t.q0 + r) - t.k0;
    for (int64_t j = std::max<int64_t>(seen, 0); j < t.nk; ++j) row[j] = kMinusInf;
  }
  return true;
}

// The keys any query of [q0, q0 + nq) sees: [0, keys_end).
int64_t keys_end(const ops::AttentionDims& d, int64_t q0, int64_t nq) {
  return nq == 0 ? 0 : ops::attention_keys_seen(d, q0 + nq - 1);
}

// The forward over one block of queries: O's rows (the accumulator, rescaled as the running
// max grows) and lse's. `s` holds kQueryBlock * kKeyBlock floats, `m` and `l` kQueryBlock.
STAGECRAFT_CPU_CLONES bool forward_block(const Problem& p, int64_t b, int64_t q0, float* o,
                                         float* lse, float* s, float* m, float* l) {
  const ops::AttentionDims& d = p.s;
  const int64_t nq = std::min(kQueryBlock, d.tq - q0);
  float* out = o + (b * d.tq + q0) * d.dv;
  std::fill(out, out + nq * d.dv, 0.0f);
  std::fill(m, m + nq, kMinusInf);
  std::fill(l, l + nq, 0.0f);
  const int64_t end = keys_end(d, q0, nq);
  for (int64_t k0 = 0; k0 < end; k0 += kKeyBlock) {
    const Tile t{b, q0, nq, k0, std::min(kKeyBlock, end - k0)};
    if (!scores(p, t, s)) return false;
    for (int64_t r = 0; r < nq; ++r) {
      float* row = s + r * kKeyBlock;
      float top = m[r];
#pragma omp simd reduction(max : top)
      for (int64_t j = 0; j < t.nk; ++j) top = row[j] > top ? row[j] : top;
      if (top == kMinusInf) {  // no key seen yet: nothing to add
        std::fill(row, row + t.nk, 0.0f);
        continue;
      }
      const float rescale = exp_simd(m[r] - top);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < t.nk; ++j) {
        row[j] = exp_simd(row[j] - top);
        sum += row[j];
      }
      l[r] = l[r] * rescale + sum;
      m[r] = top;
      if (rescale != 1.0f) {
        float* o_row = out + r * d.dv;
#pragma omp simd
        for (int64_t c = 0; c < d.dv; ++c) o_row[c] *= rescale;
      }
    }
    if (!gemm(false, false, nq, d.dv, t.nk, 1.0f, s, kKeyBlock, p.v + (b * d.tk + k0) * d.dv, d.dv,
              1.0f, out, d.dv))
      return false;
  }
  for (int64_t r = 0; r < nq; ++r) {
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int64_t c = 0; c < d.dv; ++c) out[r * d.dv + c] *= inv;
    if (lse != nullptr) lse[b * d.tq + q0 + r] = l[r] > 0.0f ? m[r] + std::log(l[r]) : kMinusInf;
  }
  return true;
}

// Runs `block(task, scratch)` for tasks [0, count) over the OpenMP threads, each thread with
// `scratch_floats` floats of its own; throws naming the node when any block reports failure.
template <class Block>
void for_blocks(const KernelArgs& a, int64_t count, int64_t scratch_floats, Block block) {
  bool failed = false;
#pragma omp parallel reduction(|| : failed)
  {
    std::vector<float> scratch(static_cast<size_t>(scratch_floats));
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < count; ++task)
      if (!failed) failed = !block(task, scratch.data());
  }
  if (failed) fail(ErrorKind::kInternal, "{} '{}': oneDNN's sgemm failed", a.op_type, a.name);
}

int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }

// O and lse (lse may be null) of the problem, into dense arrays.
void forward(const KernelArgs& a, const Problem& p, float* o, float* lse) {
  const ops::AttentionDims& d = p.s;
  const int64_t per_entry = blocks_of(d.tq, kQueryBlock);
  for_blocks(a, d.batch * per_entry, kQueryBlock * kKeyBlock + 2 * kQueryBlock,
             [&](int64_t task, float* scratch) {
               float* s = scratch;
               float* m = s + kQueryBlock * kKeyBlock;
               return forward_block(p, task / per_entry, (task % per_entry) * kQueryBlock, o, lse,
                                    s, m, m + kQueryBlock);
             });
}

void attention(const KernelArgs& a) {
  const ops::AttentionOperands op = ops::attention_operands(a);
  const Problem p{op.dims, op.q->as<float>(), op.k->as<float>(), op.v->as<float>(),
                  op.mask ? op.mask->as<float>() : nullptr};
  forward(a, p, op.o->as<float>(), op.lse ? op.lse->as<float>() : nullptr);
}

// ---------------------------------------------------------------------------------------------
// AttentionGrad.

// The gradient's operands beyond the forward's, as dense arrays: the forward's lse, dO, the
// rows' D = rowsum(dO * O) - dlse, and the gradients asked for (null where not).
struct Backward {
  const float* lse;
  const float* d_o;
  const float* delta;
  float* dq;
  float* dk;
  float* dv;
  float* dmask = nullptr;  // entry_grad adds each tile's dS here (mask_plane_grad's layout)
};

// Turns tile `t`'s scores in `s` into probabilities P = exp(S - lse) (0 for a query that sees
// no key) and, when `ds` is not null, dS = P * (dO V^T - D) into `ds`. False when sgemm fails.
STAGECRAFT_CPU_CLONES bool probabilities(const Problem& p, const Backward& w, const Tile& t,
                                         float* s, float* ds) {
  const ops::AttentionDims& d = p.s;
  for (int64_t r = 0; r < t.nq; ++r) {
    const float lse = w.lse[t.b * d.tq + t.q0 + r];
    float* row = s + r * kKeyBlock;
    if (lse == kMinusInf) {
      std::fill(row, row + t.nk, 0.0f);
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < t.nk; ++j) row[j] = exp_simd(row[j] - lse);
  }
  if (ds == nullptr) return true;
  if (!gemm(false, true, t.nq, t.nk, d.dv, 1.0f, w.d_o + (t.b * d.tq + t.q0) * d.dv, d.dv,
            p.v + (t.b * d.tk + t.k0) * d.dv, d.dv, 0.0f, ds, kKeyBlock))
    return false;
  for (int64_t r = 0; r < t.nq; ++r) {
    const float delta = w.delta[t.b * d.tq + t.q0 + r];
    const float* p_row = s + r * kKeyBlock;
    float* ds_row = ds + r * kKeyBlock;
#pragma omp simd
    for (int64_t j = 0; j < t.nk; ++j) ds_row[j] = p_row[j] * (ds_row[j] - delta);
  }
  return true;
}

// dQ's rows for one block of queries: the sum over key blocks of scale * dS K.
bool dq_block(const Problem& p, const Backward& w, int64_t b, int64_t q0, float* scratch) {
  const ops::AttentionDims& d = p.s;
  const int64_t nq = std::min(kQueryBlock, d.tq - q0);
  float* s = scratch;
  float* ds = scratch + kQueryBlock * kKeyBlock;
  float* dq = w.dq + (b * d.tq + q0) * d.d;
  std::fill(dq, dq + nq * d.d, 0.0f);
  const int64_t end = keys_end(d, q0, nq);
  for (int64_t k0 = 0; k0 < end; k0 += kKeyBlock) {
    const Tile t{b, q0, nq, k0, std::min(kKeyBlock, end - k0)};
    if (!scores(p, t, s) || !probabilities(p, w, t, s, ds) ||
        !gemm(false, false, nq, d.d, t.nk, d.scale, ds, kKeyBlock, p.k + (b * d.tk + k0) * d.d, d.d,
              1.0f, dq, d.d))
      return false;
  }
  return true;
}

// dK's and dV's rows for one block of keys: the sums over the query blocks that see them of
// scale * dS^T Q and P^T dO.
bool dkv_block(const Problem& p, const Backward& w, int64_t b, int64_t k0, float* scratch) {
  const ops::AttentionDims& d = p.s;
  const int64_t nk = std::min(kKeyBlock, d.tk - k0);
  float* s = scratch;
  float* ds = w.dk ? scratch + kQueryBlock * kKeyBlock : nullptr;
  float* dk = w.dk ? w.dk + (b * d.tk + k0) * d.d : nullptr;
  float* dv = w.dv ? w.dv + (b * d.tk + k0) * d.dv : nullptr;
  if (dk) std::fill(dk, dk + nk * d.d, 0.0f);
  if (dv) std::fill(dv, dv + nk * d.dv, 0.0f);
  for (int64_t q0 = ops::attention_first_query(d, k0); q0 < d.tq; q0 += kQueryBlock) {
    const Tile t{b, q0, std::min(kQueryBlock, d.tq - q0), k0, nk};
    if (!scores(p, t, s) || !probabilities(p, w, t, s, ds)) return false;
    if (dv && !gemm(true, false, nk, d.dv, t.nq, 1.0f, s, kKeyBlock, w.d_o + (b * d.tq + q0) * d.dv,
                    d.dv, 1.0f, dv, d.dv))
      return false;
    if (dk && !gemm(true, false, nk, d.d, t.nq, d.scale, ds, kKeyBlock, p.q + (b * d.tq + q0) * d.d,
                    d.d, 1.0f, dk, d.d))
      return false;
  }
  return true;
}

// dQ, dK and dV of batch entry `b` in one pass over its tiles: key blocks outer, the queries
// that see them inner, dQ's rows summed over the key blocks in order. 5 block products a tile,
// where the two passes above take 7 (each recomputes the scores and dP); one thread owns the
// entry, so every output row still has one writer.
// Adds tile `t`'s dS (`ds`, rows of stride kKeyBlock) to dmask at its elements.
void add_to_mask(const ops::AttentionDims& d, const Tile& t, const float* ds, float* dmask) {
  const int64_t col = d.mask_col_stride;
  float* tile = dmask + ops::attention_mask_plane(d, t.b) + t.k0 * col;
  for (int64_t r = 0; r < t.nq; ++r) {
    const float* from = ds + r * kKeyBlock;
    float* to = tile + (t.q0 + r) * d.mask_row_stride;
    if (col == 1) {
      for (int64_t j = 0; j < t.nk; ++j) to[j] += from[j];
    } else if (col == 0) {
      float sum = 0.0f;
      for (int64_t j = 0; j < t.nk; ++j) sum += from[j];
      to[0] += sum;
    } else {
      for (int64_t j = 0; j < t.nk; ++j) to[j * col] += from[j];
    }
  }
}

bool entry_grad(const Problem& p, const Backward& w, int64_t b, float* scratch) {
  const ops::AttentionDims& d = p.s;
  float* s = scratch;
  float* ds = w.dq || w.dk || w.dmask ? scratch + kQueryBlock * kKeyBlock : nullptr;
  if (w.dq) std::fill(w.dq + b * d.tq * d.d, w.dq + (b + 1) * d.tq * d.d, 0.0f);
  if (w.dk) std::fill(w.dk + b * d.tk * d.d, w.dk + (b + 1) * d.tk * d.d, 0.0f);
  if (w.dv) std::fill(w.dv + b * d.tk * d.dv, w.dv + (b + 1) * d.tk * d.dv, 0.0f);
  for (int64_t k0 = 0; k0 < d.tk; k0 += kKeyBlock) {
    const int64_t nk = std::min(kKeyBlock, d.tk - k0);
    float* dk = w.dk ? w.dk + (b * d.tk + k0) * d.d : nullptr;
    float* dv = w.dv ? w.dv + (b * d.tk + k0) * d.dv : nullptr;
    for (int64_t q0 = ops::attention_first_query(d, k0); q0 < d.tq; q0 += kQueryBlock) {
      const Tile t{b, q0, std::min(kQueryBlock, d.tq - q0), k0, nk};
      if (!scores(p, t, s) || !probabilities(p, w, t, s, ds)) return false;
      if (w.dmask) add_to_mask(d, t, ds, w.dmask);
      if (dv && !gemm(true, false, nk, d.dv, t.nq, 1.0f, s, kKeyBlock,
                      w.d_o + (b * d.tq + q0) * d.dv, d.dv, 1.0f, dv, d.dv))
        return false;
      if (dk && !gemm(true, false, nk, d.d, t.nq, d.scale, ds, kKeyBlock,
                      p.q + (b * d.tq + q0) * d.d, d.d, 1.0f, dk, d.d))
        return false;
      if (w.dq && !gemm(false, false, t.nq, d.d, nk, d.scale, ds, kKeyBlock,
                        p.k + (b * d.tk + k0) * d.d, d.d, 1.0f, w.dq + (b * d.tq + q0) * d.d, d.d))
        return false;
    }
  }
  return true;
}

// The batch entries that share each plane of the mask (ops::attention_mask_plane), in order:
// each group's entries ascending.
std::vector<std::vector<int64_t>> mask_groups(const ops::AttentionDims& d) {
  std::map<int64_t, std::vector<int64_t>> by_plane;
  for (int64_t b = 0; b < d.batch; ++b) by_plane[ops::attention_mask_plane(d, b)].push_back(b);
  std::vector<std::vector<int64_t>> groups;
  for (auto& [plane, entries] : by_plane) groups.push_back(std::move(entries));
  return groups;
}

// dmask (zeroed by the caller, the mask's layout): dS summed over the dims the mask broadcasts
// along, in a pass of its own. A task takes one group of entries (mask_groups) and, where the
// mask has a row per query, one block of queries (else all of them), so each element of dmask
// has one writer, which sums in a fixed order (entries ascending, then query and key blocks).
// Each tile's scores and dS are computed again (two block products); where entry_grad runs by
// group it adds them as it goes instead.
void mask_gradient(const KernelArgs& a, const Problem& p, const Backward& w, float* dmask,
                   const std::vector<std::vector<int64_t>>& groups) {
  const ops::AttentionDims& d = p.s;
  const bool per_row = d.mask_row_stride != 0;
  const int64_t row_tasks = per_row ? blocks_of(d.tq, kQueryBlock) : 1;
  const auto tasks = static_cast<int64_t>(groups.size()) * row_tasks;
  for_blocks(a, tasks, 2 * kQueryBlock * kKeyBlock, [&](int64_t task, float* scratch) {
    const std::vector<int64_t>& entries = groups[static_cast<size_t>(task / row_tasks)];
    const int64_t q_begin = per_row ? (task % row_tasks) * kQueryBlock : 0;
    const int64_t q_end = per_row ? std::min(d.tq, q_begin + kQueryBlock) : d.tq;
    float* s = scratch;
    float* ds = scratch + kQueryBlock * kKeyBlock;
    for (int64_t b : entries)
      for (int64_t q0 = q_begin; q0 < q_end; q0 += kQueryBlock) {
        const int64_t nq = std::min(kQueryBlock, q_end - q0);
        const int64_t end = keys_end(d, q0, nq);
        for (int64_t k0 = 0; k0 < end; k0 += kKeyBlock) {
          const Tile t{b, q0, nq, k0, std::min(kKeyBlock, end - k0)};
          if (!scores(p, t, s) || !probabilities(p, w, t, s, ds)) return false;
          add_to_mask(d, t, ds, dmask);
        }
      }
    return true;
  });
}

void attention_grad(const KernelArgs& a) {
  const ops::AttentionGradOperands g = ops::attention_grad_operands(a);
  const ops::AttentionDims& d = g.forward.dims;
  if (g.all_zero()) return ops::zero_outputs(a);
  const Problem p{d, g.forward.q->as<float>(), g.forward.k->as<float>(), g.forward.v->as<float>(),
                  g.forward.mask ? g.forward.mask->as<float>() : nullptr};
  CpuContext& ctx = context(a);
  // The forward's outputs where the node does not pass them (the same bits as the forward's).
  Tensor o_again, lse_again;
  const float* o = g.o ? g.o->as<float>() : nullptr;
  const float* lse = g.lse ? g.lse->as<float>() : nullptr;
  if (g.recomputes_forward()) {
    o_again = ctx.new_tensor(DType::kFloat32, {d.batch * d.tq * d.dv}, false);
    lse_again = ctx.new_tensor(DType::kFloat32, {d.batch * d.tq}, false);
    forward(a, p, o_again.as<float>(), lse_again.as<float>());
    if (!o) o = o_again.as<float>();
    if (!lse) lse = lse_again.as<float>();
  }
  // An absent dO is zeros (only dlse then reaches the inputs).
  const Tensor zeros =
      g.d_o ? Tensor{} : ctx.new_tensor(DType::kFloat32, {d.batch * d.tq * d.dv}, true);
  const float* d_o = g.d_o ? g.d_o->as<float>() : zeros.as<float>();
  Tensor delta = ctx.new_tensor(DType::kFloat32, {d.batch * d.tq}, false);
  float* dl = delta.as<float>();
  const float* dlse = g.dlse ? g.dlse->as<float>() : nullptr;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < d.batch * d.tq; ++row) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < d.dv; ++c) sum += d_o[row * d.dv + c] * o[row * d.dv + c];
    dl[row] = dlse ? sum - dlse[row] : sum;
  }
  auto data = [](Tensor* t) { return t ? t->as<float>() : nullptr; };
  const Backward w{lse, d_o, dl, data(g.dq), data(g.dk), data(g.dv)};
  const int64_t scratch = 2 * kQueryBlock * kKeyBlock;
  const auto threads = static_cast<int64_t>(omp_get_max_threads());
  float* dmask = data(g.dmask);
  if (dmask) std::fill(dmask, dmask + g.dmask->numel(), 0.0f);
  // The entries that share each plane of the mask, for the mask's gradient either way below.
  const std::vector<std::vector<int64_t>> groups =
      dmask ? mask_groups(d) : std::vector<std::vector<int64_t>>{};
  // One pass per batch entry where the entries keep every thread busy (a transformer's batch x
  // heads); else the two passes, whose tasks are blocks of one entry.
  if (d.batch >= 4 * threads) {
    // A learned mask with a score of its own per query and key (T5's, Swin's bias: [1, H, T,
    // T]) whose planes keep every thread busy: each task takes the entries of one plane and
    // adds their dS to it as it goes, with no pass of its own. An element gets one term per
    // entry, in the order mask_gradient adds them: the same bits.
    if (dmask && d.mask_row_stride != 0 && d.mask_col_stride != 0 &&
        static_cast<int64_t>(groups.size()) >= threads) {
      Backward with_mask = w;
      with_mask.dmask = dmask;
      for_blocks(a, static_cast<int64_t>(groups.size()), scratch, [&](int64_t task, float* s) {
        for (int64_t b : groups[static_cast<size_t>(task)])
          if (!entry_grad(p, with_mask, b, s)) return false;
        return true;
      });
      return;
    }
    if (dmask) mask_gradient(a, p, w, dmask, groups);
    if (w.dq || w.dk || w.dv)
      for_blocks(a, d.batch, scratch, [&](int64_t b, float* s) { return entry_grad(p, w, b, s); });
    return;
  }
  if (dmask) mask_gradient(a, p, w, dmask, groups);
  if (w.dq) {
    const int64_t per_entry = blocks_of(d.tq, kQueryBlock);
    for_blocks(a, d.batch * per_entry, scratch, [&](int64_t task, float* s) {
      return dq_block(p, w, task / per_entry, (task % per_entry) * kQueryBlock, s);
    });
  }
  if (w.dk || w.dv) {
    const int64_t per_entry = blocks_of(d.tk, kKeyBlock);
    for_blocks(a, d.batch * per_entry, scratch, [&](int64_t task, float* s) {
      return dkv_block(p, w, task / per_entry, (task % per_entry) * kKeyBlock, s);
    });
  }
}

std::string check_attention(const OpSignature& s) {
  if (std::string why = ops::attention_signature_error(s); !why.empty()) return why;
  return all_float32(s);
}

std::string check_attention_grad(const OpSignature& s) {
  if (std::string why = ops::attention_grad_signature_error(s); !why.empty()) return why;
  return all_float32(s);
}

const KernelEntry kKernels[] = {
    {"Attention", attention, check_attention, /*writes_every_output=*/true},
    {"AttentionGrad", attention_grad, check_attention_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> attention_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
