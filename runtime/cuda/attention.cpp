// The CUDA backend's attention family (families.h): the fused Attention forward and its
// gradient, with the operand rules, defaults and refusals of the CPU backend's attention.cpp
// (runtime/ops/attention_shape.h). Float32 nodes run attention_kernels.cu's launchers (the tiled
// kernels where they apply, the plain ones elsewhere). A node whose activations are 16-bit (a
// mixed-precision plan's: Q, K, V, O, dO and the gradients bfloat16 or float16; the mask, lse
// and dlse float32) runs the tensor-core kernels on them (attention_mma.cu), or, where those do
// not take it or under STAGECRAFT_ATTENTION_KERNELS=tiled, the tiled kernels, widening each
// element as a tile is loaded (attention_tiled.h); where the tiles do not take it (another head
// size, an operand not 8-byte aligned, STAGECRAFT_ATTENTION_KERNELS=plain) it runs widened: the
// float32 kernels between Casts, as the program runs any kernel without a 16-bit path.
#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <set>
#include <span>
#include <string>

#include "runtime/core/backend.h"
#include "runtime/cuda/attention_choice.h"
#include "runtime/cuda/attention_kernels.h"
#include "runtime/cuda/attention_tiled.h"
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

const uint16_t* bits(const Tensor* t) {
  return t != nullptr ? reinterpret_cast<const uint16_t*>(t->data) : nullptr;
}
uint16_t* bits(Tensor* t) { return t != nullptr ? reinterpret_cast<uint16_t*>(t->data) : nullptr; }

HalfAttentionPointers half_pointers(const ops::AttentionOperands& op) {
  HalfAttentionPointers p;
  p.dtype = op.q->dtype;
  p.q = bits(op.q);
  p.k = bits(op.k);
  p.v = bits(op.v);
  p.mask = data_or_null(op.mask);
  return p;
}

// The node run widened: `float32_kernel` on float32 copies of its 16-bit operands (run_widened,
// runtime/core/kernel.h), its results rounded into the 16-bit outputs.
void run_float32(KernelFn float32_kernel, const KernelArgs& a) {
  static const KernelFn cast = cuda_backend()->kernel("Cast");
  run_widened(float32_kernel, cast, /*zero_outputs=*/false, a);
}

// A float32 node's forward, on operands already parsed (the KernelFn below parses them, for the
// widened path).
void attention_float32_of(const KernelArgs& a, const ops::AttentionOperands& op) {
  launch_attention_forward(op.dims, forward_pointers(op), op.o->as<float>(), data_or_null(op.lse),
                           context(a).stream());
  check_launch(a);
}

void attention_float32(const KernelArgs& a) {
  attention_float32_of(a, ops::attention_operands(a));
}

// A 16-bit node's forward on the chosen kernels: the tensor-core ones (the default), else (under
// STAGECRAFT_ATTENTION_KERNELS=tiled, or where they do not take it) the tiled ones; false
// where neither takes it (nothing launched).
bool forward_16bit(const ops::AttentionDims& d, const HalfAttentionPointers& p, uint16_t* o,
                   float* lse, cudaStream_t stream) {
  return (mma_attention_chosen() &&
          mma_attention_forward(d, p, o, lse, mma_tiles_chosen(), stream)) ||
         tiled_attention_forward(d, p, o, lse, stream);
}

void attention(const KernelArgs& a) {
  const ops::AttentionOperands op = ops::attention_operands(a);
  note_plain_kernels(a, op.dims);
  if (!is_16bit_float(op.q->dtype)) return attention_float32_of(a, op);
  if (plain_attention_chosen() || !forward_16bit(op.dims, half_pointers(op), bits(op.o),
                                                 data_or_null(op.lse), context(a).stream()))
    return run_float32(attention_float32, a);
  check_launch(a);
}

// The gradient of a 16-bit node on the chosen kernels (as forward_16bit); false where the tiles
// do not take it (the caller then runs the node widened, which writes every output again).
bool attention_grad_16bit(const KernelArgs& a, const ops::AttentionGradOperands& g) {
  const ops::AttentionDims& d = g.forward.dims;
  // The mask's gradient has a float32 kernel only: such a node runs widened.
  if (g.dmask != nullptr || plain_attention_chosen() || !tiles_take(d)) return false;
  CudaContext& ctx = context(a);
  cudaStream_t stream = ctx.stream();
  HalfAttentionPointers p = half_pointers(g.forward);
  const DType dtype = p.dtype;
  Tensor o_again, lse_again;
  const uint16_t* o = bits(g.o);
  p.lse = data_or_null(g.lse);
  if (g.recomputes_forward()) {
    o_again = ctx.new_tensor(dtype, {d.batch * d.tq * d.dv}, false);
    lse_again = ctx.new_tensor(DType::kFloat32, {d.batch * d.tq}, false);
    if (!forward_16bit(d, p, bits(&o_again), lse_again.as<float>(), stream)) return false;
    check_launch(a);
    if (!o) o = bits(&o_again);
    if (!p.lse) p.lse = lse_again.as<float>();
  }
  Tensor zeros;
  if (!g.d_o) zeros = ctx.new_tensor(dtype, {d.batch * d.tq * d.dv}, true);
  p.d_o = g.d_o ? bits(g.d_o) : bits(&zeros);
  Tensor delta = ctx.new_tensor(DType::kFloat32, {d.batch * d.tq}, false);
  if (!launch_attention_delta(dtype, p.d_o, o, data_or_null(g.dlse), delta.as<float>(),
                              d.batch * d.tq, d.dv, stream))
    return false;
  check_launch(a);
  p.delta = delta.as<float>();
  const bool mma = mma_attention_chosen();
  const MmaTiles tiles = mma_tiles_chosen();
  if (g.dq && !(mma && mma_attention_dq(d, p, bits(g.dq), tiles, stream)) &&
      !tiled_attention_dq(d, p, bits(g.dq), stream))
    return false;
  check_launch(a);
  if ((g.dk || g.dv) && !(mma && mma_attention_dkv(d, p, bits(g.dk), bits(g.dv), tiles, stream)) &&
      !tiled_attention_dkv(d, p, bits(g.dk), bits(g.dv), stream))
    return false;
  check_launch(a);
  return true;
}

// A float32 node's gradient, on operands already parsed (g.all_zero() handled by the caller).
void attention_grad_float32_of(const KernelArgs& a, const ops::AttentionGradOperands& g) {
  const ops::AttentionDims& d = g.forward.dims;
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
  if (g.dmask) {
    launch_attention_dmask(d, p, g.dmask->as<float>(), g.dmask->numel(), stream);
    check_launch(a);
  }
}

// The KernelFn of a float32 gradient: what the widened path runs for a 16-bit node.
void attention_grad_float32(const KernelArgs& a) {
  const ops::AttentionGradOperands g = ops::attention_grad_operands(a);
  if (g.all_zero()) return ops::zero_outputs(a);
  attention_grad_float32_of(a, g);
}

void attention_grad(const KernelArgs& a) {
  const ops::AttentionGradOperands g = ops::attention_grad_operands(a);
  if (g.all_zero()) return ops::zero_outputs(a);
  if (!is_16bit_float(g.forward.q->dtype)) return attention_grad_float32_of(a, g);
  if (!attention_grad_16bit(a, g)) run_float32(attention_grad_float32, a);
}

// Whether a signature's dtypes are one 16-bit type's where the kernels read and write
// activations (`half` positions), float32 (or absent) where they read the mask, lse and dlse
// (`float32` positions), and nothing at `absent` (the mask's gradient).
bool sixteen_bit_operands(std::span<const DType> types, std::initializer_list<size_t> half,
                          std::initializer_list<size_t> float32, DType sixteen) {
  for (size_t k : half)
    if (k < types.size() && types[k] != sixteen && types[k] != DType::kUndefined) return false;
  for (size_t k : float32)
    if (k < types.size() && types[k] != DType::kFloat32 && types[k] != DType::kUndefined)
      return false;
  return true;
}

// A 16-bit node natively (Q, K, V and O of one 16-bit type; the mask and lse float32); any other
// as the CPU backend's checks decide (float32, or widened by the program).
std::string check_attention(const OpSignature& s) {
  if (std::string why = ops::attention_signature_error(s); !why.empty()) return why;
  const DType sixteen = s.inputs[0];
  if (is_16bit_float(sixteen) && sixteen_bit_operands(s.inputs, {0, 1, 2}, {3}, sixteen) &&
      s.outputs[0] == sixteen && sixteen_bit_operands(s.outputs, {0}, {1}, sixteen))
    return "";
  return same_as_cpu(s);
}

// The gradient likewise: inputs Q, K, V, mask?, O, lse?, dO, dlse? (grad_io.h's layout, n
// forward inputs and m forward outputs); outputs dQ, dK, dV (16-bit) and no mask gradient (a
// node that asks for one runs widened: its kernel is float32).
std::string check_attention_grad(const OpSignature& s) {
  if (std::string why = ops::attention_grad_signature_error(s); !why.empty()) return why;
  const ops::GradCounts c = ops::grad_counts(s.op_type, s.attrs, s.inputs.size(), s.outputs.size(),
                                             ops::kAttentionGradArity);
  const DType sixteen = s.inputs[0];
  if (c.error.empty() && c.m >= 1 && is_16bit_float(sixteen) &&
      sixteen_bit_operands(s.inputs, {0, 1, 2}, {}, sixteen) &&
      sixteen_bit_operands(s.inputs, {c.n, c.n + c.m}, {}, sixteen) &&
      (c.m < 2 || sixteen_bit_operands(s.inputs, {}, {c.n + 1, c.n + c.m + 1}, sixteen)) &&
      (c.n < 4 || s.inputs[3] == DType::kFloat32 || s.inputs[3] == DType::kUndefined) &&
      sixteen_bit_operands(s.outputs, {0, 1, 2}, {}, sixteen) &&
      (s.outputs.size() < 4 || s.outputs[3] == DType::kUndefined))
    return "";
  return same_as_cpu(s);
}

const KernelEntry kKernels[] = {
    {"Attention", attention, check_attention, /*writes_every_output=*/true},
    {"AttentionGrad", attention_grad, check_attention_grad, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> attention_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cuda
