// The CUDA backend's attention family (families.h): the fused Attention forward and its
// gradient, float32, with the operand rules, defaults and refusals of the CPU backend's
// attention.cpp (runtime/ops/attention_shape.h). The kernels are attention_kernels.cu.
#include <fmt/format.h>

#include <mutex>
#include <set>
#include <string>

#include "runtime/cuda/attention_choice.h"
#include "runtime/cuda/attention_kernels.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/attention_shape.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::cuda {
namespace {

const float* data_or_null(const Tensor* t) { return t != nullptr ? t->as<float>() : nullptr; }
float* data_or_null(Tensor* t) { return t != nullptr ? t->as<float>() : nullptr; }

AttentionPointers forward_pointers(const ops::AttentionOperands& op) {
  AttentionPointers p;
  p.q = op.q->as<float>();
  p.k = op.k->as<float>();
  p.v = op.v->as<float>();
  p.mask = data_or_null(op.mask);
  return p;
}

// A node as long as this (queries x keys) that runs the plain kernels is worth a note: at
// GPT-2's 1024 x 1024 they took 22x the tiled kernels' time (bench/RESULTS.md, 2026-11-29).
constexpr int64_t kNotedScores = 256 * 256;

// One line on stderr, once per node name in the process, when a long attention node runs the
// plain kernels (untiled_reason): what would make it fast is a model change the user
// makes, so they should hear of it rather than find it in a profile.
void note_plain_kernels(const KernelArgs& a, const ops::AttentionDims& d) {
  if (d.tq * d.tk < kNotedScores || tiles_take(d) || plain_attention_chosen()) return;
  static std::mutex mutex;
  static std::set<std::string, std::less<>> noted;
  {
    std::lock_guard lock(mutex);
    if (!noted.emplace(a.name).second) return;
  }
  fmt::print(stderr,
             "stagecraft: note: node '{}' (Attention, {} queries x {} keys) runs the plain CUDA "
             "attention kernels, many times slower than the tiled ones at this length: {} "
             "(docs/stagerun.md, \"Fused attention on CUDA\")\n",
             a.name, d.tq, d.tk, untiled_reason(d));
}

void attention(const KernelArgs& a) {
  const ops::AttentionOperands op = ops::attention_operands(a);
  note_plain_kernels(a, op.dims);
  launch_attention_forward(op.dims, forward_pointers(op), op.o->as<float>(), data_or_null(op.lse),
                           context(a).stream());
  check_launch(a);
}

void attention_grad(const KernelArgs& a) {
  const ops::AttentionGradOperands g = ops::attention_grad_operands(a);
  const ops::AttentionDims& d = g.forward.dims;
  if (g.all_zero()) return ops::zero_outputs(a);
  CudaContext& ctx = context(a);
  cudaStream_t stream = ctx.stream();
  AttentionPointers p = forward_pointers(g.forward);
  // The forward's outputs where the node does not pass them.
  Tensor o_again, lse_again;
  const float* o = data_or_null(g.o);
  p.lse = data_or_null(g.lse);
  if (g.recomputes_forward()) {
    o_again = ctx.new_tensor(DType::kFloat32, {d.batch * d.tq * d.dv}, false);
    lse_again = ctx.new_tensor(DType::kFloat32, {d.batch * d.tq}, false);
    launch_attention_forward(d, p, o_again.as<float>(), lse_again.as<float>(), stream);
    check_launch(a);
    if (!o) o = o_again.as<float>();
    if (!p.lse) p.lse = lse_again.as<float>();
  }
  // An absent dO is zeros (only dlse then reaches the inputs).
  Tensor zeros;
  if (!g.d_o) zeros = ctx.new_tensor(DType::kFloat32, {d.batch * d.tq * d.dv}, true);
  p.d_o = g.d_o ? g.d_o->as<float>() : zeros.as<float>();
  Tensor delta = ctx.new_tensor(DType::kFloat32, {d.batch * d.tq}, false);
  launch_attention_delta(p.d_o, o, data_or_null(g.dlse), delta.as<float>(), d.batch * d.tq, d.dv,
                         stream);
  check_launch(a);
  p.delta = delta.as<float>();
  if (g.dq) {
    launch_attention_dq(d, p, g.dq->as<float>(), stream);
    check_launch(a);
  }
  launch_attention_dkv(d, p, data_or_null(g.dk), data_or_null(g.dv), stream);
  check_launch(a);
}

// The CPU backend's checks decide (float32, the operands, causal 0 or 1, no mask gradient).
const KernelEntry kKernels[] = {
    {"Attention", attention, same_as_cpu},
    {"AttentionGrad", attention_grad, same_as_cpu, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> attention_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
