// Kernels of the conv family (see families.h): Conv on float32 with oneDNN, 1-D to 3-D.
//
// Tensors stay dense row-major between kernels. A convolution either runs on them as they are
// (oneDNN then uses a GEMM) or lets oneDNN choose the layouts it runs fastest on ("any") and
// reorders the source, the weights and the result to and from them (see prefers_blocked). The
// primitives of one geometry are built once per device context and kept; the blocked copies
// live in the context's scratch buffers, which grow to the largest convolution seen.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "runtime/cpu/conv_backward.h"
#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/window.h"

namespace stagecraft::rt::cpu {

namespace {

using dnnl::memory;

// The shared geometry's dims are handed to oneDNN as they are.
static_assert(std::is_same_v<ops::ConvGeometry::Dims, memory::dims>);

// A geometry's operands as the kernels hold them (plain) and as its primitives are asked to take
// them: the plain layouts, or oneDNN's choice ("any") where the plan runs blocked.
struct Layouts {
  dnnl::engine engine;  // held so that the engine, whose address keys the plan, outlives it
  memory::desc src_plain, weights_plain, dst_plain;
  memory::desc src, weights, dst;
};

Layouts layouts(const ops::ConvGeometry& g, const dnnl::engine& engine, bool blocked) {
  const auto f32 = memory::data_type::f32;
  const auto any = memory::format_tag::any;
  Layouts l{engine, plain_desc(g.src), plain_desc(g.weights), plain_desc(g.dst), {}, {}, {}};
  l.src = blocked ? memory::desc(g.src, f32, any) : l.src_plain;
  l.weights = blocked ? memory::desc(g.weights, f32, any) : l.weights_plain;
  l.dst = blocked ? memory::desc(g.dst, f32, any) : l.dst_plain;
  return l;
}

// What one geometry runs: the convolution and, for each operand whose chosen layout is not
// plain, the reorder to or from it.
struct ConvPlan : Layouts {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward conv;
  std::optional<dnnl::reorder> src_in, weights_in, dst_out;
};

// The reorder from `from` to `to`, or none when the layouts agree.
std::optional<dnnl::reorder> reorder_between(const memory::desc& from, const memory::desc& to,
                                             const dnnl::engine& engine) {
  if (from == to) return std::nullopt;
  return dnnl::reorder(dnnl::reorder::primitive_desc(engine, from, engine, to));
}

// Whether the convolution runs faster on oneDNN's blocked layouts, reorders included, than on
// the plain ones (where oneDNN runs it as a GEMM). A pointwise kernel is a plain GEMM already.
// Otherwise the blocked direct convolution wins once each weight is used at enough output
// positions to repay reordering the weights on every call (measured on ResNet-50's layers).
bool prefers_blocked(const ops::ConvGeometry& g) {
  const size_t spatial = g.src.size() - 2;
  bool pointwise = true;
  for (size_t i = 0; i < spatial; ++i) pointwise &= g.weights[g.weights.size() - spatial + i] == 1;
  int64_t positions = g.dst[0];
  for (size_t i = 0; i < spatial; ++i) positions *= g.dst[2 + i];
  return !pointwise && positions >= 256;
}

// What one geometry's gradient runs (conv_backward.h): the backward-data and backward-weights
// primitives and, for each operand whose chosen layout is not plain, the reorder to or from it.
struct ConvBackwardPlan : Layouts {
  dnnl::convolution_backward_data::primitive_desc data_pd;
  dnnl::convolution_backward_data data_grad;
  dnnl::convolution_backward_weights::primitive_desc weights_pd;
  dnnl::convolution_backward_weights weights_grad;
  std::optional<dnnl::reorder> data_diff_dst_in, data_weights_in, diff_src_out;
  std::optional<dnnl::reorder> weights_diff_dst_in, weights_src_in, diff_weights_out;
};

// conv_backward.h says when: an ungrouped spatial kernel with at least 8 channels in and out.
bool prefers_blocked_backward(const ops::ConvGeometry& g) {
  if (g.weights.size() != g.src.size()) return false;  // grouped: [group, M/g, C/g, k...]
  const size_t spatial = g.src.size() - 2;
  bool pointwise = true;
  for (size_t i = 0; i < spatial; ++i) pointwise &= g.weights[2 + i] == 1;
  return !pointwise && g.src[1] >= 8 && g.dst[1] >= 8;
}

ConvBackwardPlan make_backward_plan(const ops::ConvGeometry& g, const dnnl::engine& engine) {
  ConvBackwardPlan p;
  static_cast<Layouts&>(p) = layouts(g, engine, prefers_blocked_backward(g));
  const dnnl::convolution_forward::primitive_desc hint(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                      dnnl::algorithm::convolution_direct, p.src, p.weights, p.dst,
                                      g.strides, g.dilates, g.pad_l, g.pad_r),
      engine);
  p.data_pd = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, p.src, p.weights,
                                            p.dst, g.strides, g.dilates, g.pad_l, g.pad_r),
      engine, hint);
  p.data_grad = dnnl::convolution_backward_data(p.data_pd);
  p.weights_pd = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, p.src,
                                               p.weights, p.dst, g.strides, g.dilates, g.pad_l,
                                               g.pad_r),
      engine, hint);
  p.weights_grad = dnnl::convolution_backward_weights(p.weights_pd);
  p.data_diff_dst_in = reorder_between(p.dst_plain, p.data_pd.diff_dst_desc(), engine);
  p.data_weights_in = reorder_between(p.weights_plain, p.data_pd.weights_desc(), engine);
  p.diff_src_out = reorder_between(p.data_pd.diff_src_desc(), p.src_plain, engine);
  p.weights_diff_dst_in = reorder_between(p.dst_plain, p.weights_pd.diff_dst_desc(), engine);
  p.weights_src_in = reorder_between(p.src_plain, p.weights_pd.src_desc(), engine);
  p.diff_weights_out = reorder_between(p.weights_pd.diff_weights_desc(), p.weights_plain, engine);
  return p;
}

ConvPlan make_plan(const ops::ConvGeometry& g, const dnnl::engine& engine) {
  ConvPlan p;
  static_cast<Layouts&>(p) = layouts(g, engine, prefers_blocked(g));
  const memory::desc bias = g.bias > 0 ? plain_desc({g.bias}) : memory::desc();
  dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference,
                                       dnnl::algorithm::convolution_direct, p.src, p.weights, bias,
                                       p.dst, g.strides, g.dilates, g.pad_l, g.pad_r);
  p.pd = dnnl::convolution_forward::primitive_desc(desc, engine);
  p.conv = dnnl::convolution_forward(p.pd);
  p.src_in = reorder_between(p.src_plain, p.pd.src_desc(), engine);
  p.weights_in = reorder_between(p.weights_plain, p.pd.weights_desc(), engine);
  p.dst_out = reorder_between(p.pd.dst_desc(), p.dst_plain, engine);
  return p;
}

// A growable 64-byte aligned buffer for one blocked operand of a context's convolutions.
class Scratch {
 public:
  void* get(size_t bytes) {
    if (bytes > size_) {
      size_ = (bytes + 63) / 64 * 64;
      data_.reset(static_cast<std::byte*>(std::aligned_alloc(64, size_)));
      if (!data_) throw std::bad_alloc();
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

}  // namespace

// One device context's convolution plans by geometry and its scratch buffers (the gradient's
// blocked operands use the forward's three and two more: kernels of a context run one at a
// time).
struct ConvCache {
  std::map<std::vector<int64_t>, ConvPlan> plans;
  std::map<std::vector<int64_t>, ConvBackwardPlan> backward_plans;
  Scratch src_scratch, weights_scratch, dst_scratch, diff_dst_scratch, diff_weights_scratch;
};

void delete_conv_cache(ConvCache* cache) { delete cache; }

ConvCache& CpuContext::conv_cache() {
  if (!conv_cache_) conv_cache_.reset(new ConvCache);
  return *conv_cache_;
}

void CpuContext::unbind_thread() {
  if (conv_cache_) {
    conv_cache_->plans.clear();
    conv_cache_->backward_plans.clear();
  }
}

namespace {

// A geometry on an engine, as the plan caches key it.
std::vector<int64_t> plan_key(const ops::ConvGeometry& g, const dnnl::engine& engine) {
  std::vector<int64_t> key{reinterpret_cast<int64_t>(engine.get()), g.bias};
  for (const memory::dims* dims :
       {&g.src, &g.weights, &g.dst, &g.strides, &g.dilates, &g.pad_l, &g.pad_r}) {
    key.push_back(static_cast<int64_t>(dims->size()));
    key.insert(key.end(), dims->begin(), dims->end());
  }
  return key;
}

// The plan for `g` in `plans`, built by `make` on first use in this context.
template <class Plan, class Make>
const Plan& cached_plan(std::map<std::vector<int64_t>, Plan>& plans, const ops::ConvGeometry& g,
                        const dnnl::engine& engine, Make make) {
  std::vector<int64_t> key = plan_key(g, engine);
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  if (plans.size() >= 512) plans.clear();  // bounds the cache when many models pass through
  return plans.emplace(std::move(key), make(g, engine)).first->second;
}

const ConvPlan& plan_for(const ops::ConvGeometry& g, const dnnl::engine& engine, ConvCache& cache) {
  return cached_plan(cache.plans, g, engine, make_plan);
}

// The operand in the layout the convolution wants: the user's memory itself, or its reordered
// copy in `scratch`.
memory operand(const std::optional<dnnl::reorder>& reorder, memory user, const memory::desc& wanted,
               Scratch& scratch, CpuContext& ctx) {
  if (!reorder) return user;
  memory blocked(wanted, ctx.engine, scratch.get(wanted.get_size()));
  reorder->execute(ctx.stream, user, blocked);
  return blocked;
}

// Where a primitive writes a result the convolution's layout holds: the user's memory itself,
// or a copy in `scratch` that `finish` reorders into the user's memory.
memory result(const std::optional<dnnl::reorder>& reorder, const memory& user,
              const memory::desc& chosen, Scratch& scratch, CpuContext& ctx) {
  return reorder ? memory(chosen, ctx.engine, scratch.get(chosen.get_size())) : user;
}

void finish(const std::optional<dnnl::reorder>& reorder, memory& written, memory& user,
            CpuContext& ctx) {
  if (reorder) reorder->execute(ctx.stream, written, user);
}

void conv(const KernelArgs& a) {
  const ops::ConvGeometry g = ops::conv_forward_geometry(a);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  CpuContext& ctx = context(a);
  ConvCache& cache = ctx.conv_cache();
  Scratch &src_scratch = cache.src_scratch, &weights_scratch = cache.weights_scratch,
          &dst_scratch = cache.dst_scratch;
  try {
    const ConvPlan& p = plan_for(g, ctx.engine, cache);
    memory src = operand(p.src_in, memory(p.src_plain, ctx.engine, a.input(0).data),
                         p.pd.src_desc(), src_scratch, ctx);
    memory weights = operand(p.weights_in, memory(p.weights_plain, ctx.engine, a.input(1).data),
                             p.pd.weights_desc(), weights_scratch, ctx);
    memory dst_user(p.dst_plain, ctx.engine, y.data);
    memory dst = result(p.dst_out, dst_user, p.pd.dst_desc(), dst_scratch, ctx);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}};
    if (g.bias > 0)
      args.emplace(DNNL_ARG_BIAS, memory(plain_desc({g.bias}), ctx.engine, a.input(2).data));
    p.conv.execute(ctx.stream, args);
    finish(p.dst_out, dst, dst_user, ctx);
    ctx.stream.wait();
  } catch (const dnnl::error& e) {
    fail(ErrorKind::kUnsupported, "oneDNN cannot run this Conv ({}): {}",
         shape_string(a.input(0).shape), e.what());
  }
}

}  // namespace

void conv_backward(CpuContext& ctx, const ops::ConvGeometry& g, const Tensor& x, const Tensor& w,
                   const Tensor& dy, Tensor* dx, Tensor* dw) {
  if (dx == nullptr && dw == nullptr) return;
  ConvCache& cache = ctx.conv_cache();
  const ConvBackwardPlan& p = cached_plan(cache.backward_plans, g, ctx.engine, make_backward_plan);
  memory dy_user(p.dst_plain, ctx.engine, dy.data);
  if (dx != nullptr) {
    memory diff_dst =
        operand(p.data_diff_dst_in, dy_user, p.data_pd.diff_dst_desc(), cache.dst_scratch, ctx);
    memory weights = operand(p.data_weights_in, memory(p.weights_plain, ctx.engine, w.data),
                             p.data_pd.weights_desc(), cache.weights_scratch, ctx);
    memory dx_user(p.src_plain, ctx.engine, dx->data);
    memory diff_src =
        result(p.diff_src_out, dx_user, p.data_pd.diff_src_desc(), cache.src_scratch, ctx);
    p.data_grad.execute(ctx.stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                                     {DNNL_ARG_WEIGHTS, weights},
                                     {DNNL_ARG_DIFF_SRC, diff_src}});
    finish(p.diff_src_out, diff_src, dx_user, ctx);
  }
  if (dw != nullptr) {
    memory diff_dst = operand(p.weights_diff_dst_in, dy_user, p.weights_pd.diff_dst_desc(),
                              cache.diff_dst_scratch, ctx);
    memory src = operand(p.weights_src_in, memory(p.src_plain, ctx.engine, x.data),
                         p.weights_pd.src_desc(), cache.src_scratch, ctx);
    memory dw_user(p.weights_plain, ctx.engine, dw->data);
    memory diff_weights = result(p.diff_weights_out, dw_user, p.weights_pd.diff_weights_desc(),
                                 cache.diff_weights_scratch, ctx);
    p.weights_grad.execute(ctx.stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                                        {DNNL_ARG_SRC, src},
                                        {DNNL_ARG_DIFF_WEIGHTS, diff_weights}});
    finish(p.diff_weights_out, diff_weights, dw_user, ctx);
  }
  ctx.stream.wait();
}

namespace {

std::string check_conv(const OpSignature& sig) {
  if (std::string why = all_float32(sig); !why.empty()) return why;
  if (sig.inputs.size() < 2 || sig.inputs.size() > 3 || sig.inputs[0] == DType::kUndefined ||
      sig.inputs[1] == DType::kUndefined)
    return "Conv needs inputs X and W and at most a bias B";
  const std::string auto_pad = sig.attrs.s("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      auto_pad != "VALID")
    return "Conv auto_pad '" + auto_pad + "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID";
  if (sig.attrs.i("group", 1) < 1) return "Conv group must be at least 1";
  const size_t spatial = sig.attrs.ints("kernel_shape").size();
  if (spatial > 3) return "Conv with more than 3 spatial dims is not supported";
  return "";
}

constexpr KernelEntry kConvKernels[] = {
    {"Conv", conv, check_conv, /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> conv_kernels() { return kConvKernels; }

}  // namespace stagecraft::rt::cpu
