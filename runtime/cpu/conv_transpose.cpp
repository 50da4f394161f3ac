// ConvTranspose and its gradient on float32 with oneDNN's deconvolution, 1-D to 3-D, groups,
// strides, dilations, pads, output_padding, output_shape and auto_pad (the geometry:
// conv_transpose_shape.h).
//
// ConvTranspose: deconvolution_forward on the dense row-major tensors, W read in ONNX's layout
// ([C, M / group, kernel...]) through a strided descriptor of oneDNN's logical weights ([M, C,
// kernel...], or [group, M / group, C / group, kernel...]); the bias is the primitive's.
// ConvTransposeGrad: dX by deconvolution_backward_data, dW by deconvolution_backward_weights
// (a forward-training descriptor as their hint), dB as the sum of dY over the batch and spatial
// dims in double, as ConvGrad's.
#include <fmt/format.h>

#include <string>
#include <unordered_map>

#include "runtime/cpu/cpu_context.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/ops/conv_transpose_shape.h"
#include "runtime/ops/grad_io.h"

namespace stagecraft::rt::cpu {

namespace {

using dnnl::memory;

// The gradient op's operand counts: n = 2 or 3 forward inputs (X, W, [B]), m = 1 output.
constexpr ops::GradArity kArity{.n_min = 2, .n_max = 3, .m_min = 1, .m_max = 1};

// oneDNN's terms of one node: plain X and Y, W in ONNX's layout, and the window.
struct Deconv {
  memory::desc src, weights, dst;
  memory::dims strides, dilates, pad_l, pad_r;
};

Deconv deconv_of(const ops::ConvTransposeGeometry& g) {
  Deconv d;
  d.src = plain_desc(g.x);
  d.dst = plain_desc(g.y);
  const int64_t c = g.x[1], m = g.y[1], cg = c / g.group, mg = m / g.group;
  int64_t window = 1;
  for (size_t i = 2; i < g.w.size(); ++i) window *= g.w[i];
  memory::dims kernel(g.w.begin() + 2, g.w.end()), kernel_strides(kernel.size(), 1);
  for (size_t i = kernel.size(); i-- > 1;) kernel_strides[i - 1] = kernel_strides[i] * kernel[i];
  // ONNX's W is [group, C / group, M / group, kernel...] in memory.
  memory::dims dims, strides;
  if (g.group == 1) {
    dims = {m, c};
    strides = {window, m * window};
  } else {
    dims = {g.group, mg, cg};
    strides = {cg * mg * window, window, mg * window};
  }
  dims.insert(dims.end(), kernel.begin(), kernel.end());
  strides.insert(strides.end(), kernel_strides.begin(), kernel_strides.end());
  d.weights = memory::desc(dims, memory::data_type::f32, strides);
  d.strides = g.strides;
  for (int64_t dil : g.dilations) d.dilates.push_back(dil - 1);  // oneDNN counts from 0
  d.pad_l = g.pad_l;
  d.pad_r = g.pad_r;
  return d;
}

dnnl::deconvolution_forward::primitive_desc forward_pd(const Deconv& d, const memory::desc& bias,
                                                       dnnl::prop_kind kind,
                                                       const dnnl::engine& engine) {
  dnnl::deconvolution_forward::desc desc(kind, dnnl::algorithm::deconvolution_direct, d.src,
                                         d.weights, bias, d.dst, d.strides, d.dilates, d.pad_l,
                                         d.pad_r);
  return dnnl::deconvolution_forward::primitive_desc(desc, engine);
}

void conv_transpose(const KernelArgs& a) {
  const ops::ConvTransposeGeometry g = ops::conv_transpose_forward_geometry(a);
  Tensor& y = *a.out[0];
  if (y.numel() == 0) return;
  CpuContext& ctx = context(a);
  if (a.input(0).numel() == 0) {  // no input: Y is the bias alone
    float* out = y.as<float>();
    const int64_t m = g.y[1], size = y.numel() / (g.y[0] * m);
    for (int64_t i = 0; i < y.numel(); ++i)
      out[i] = g.bias ? a.input(2).as<float>()[(i / size) % m] : 0.0f;
    return;
  }
  const Deconv d = deconv_of(g);
  try {
    const memory::desc bias = g.bias ? plain_desc({g.y[1]}) : memory::desc();
    const auto pd = forward_pd(d, bias, dnnl::prop_kind::forward_inference, ctx.engine);
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC, memory(d.src, ctx.engine, a.input(0).data)},
        {DNNL_ARG_WEIGHTS, memory(d.weights, ctx.engine, a.input(1).data)},
        {DNNL_ARG_DST, memory(d.dst, ctx.engine, y.data)}};
    if (g.bias) args.emplace(DNNL_ARG_BIAS, memory(bias, ctx.engine, a.input(2).data));
    dnnl::deconvolution_forward(pd).execute(ctx.stream, args);
    ctx.stream.wait();
  } catch (const dnnl::error& e) {
    fail(ErrorKind::kUnsupported, "oneDNN cannot run ConvTranspose '{}' ({} with weights {}): {}",
         a.name, shape_string(g.x), shape_string(g.w), e.what());
  }
}

// Writes every element of every requested output: oneDNN's backward primitives overwrite dX
// and dW, and dB is one sum per channel.
void conv_transpose_grad(const KernelArgs& a) {
  const ops::GradIo io(a, kArity);
  const Tensor& x = io.need_x(0);
  const Tensor& w = io.need_x(1);
  if (io.dy(0) == nullptr) return ops::zero_outputs(a);
  const Tensor& dy = *io.dy(0);
  const ops::ConvTransposeGeometry g = ops::conv_transpose_geometry(a, x.shape, w.shape);
  ops::expect_dy_shape(a, dy, g.y);
  if (io.wants(0)) expect_shape(a, 0, x.shape);
  if (io.wants(1)) expect_shape(a, 1, w.shape);
  if (io.wants(2)) {
    const Tensor* b = io.x(2);
    if (b == nullptr)
      fail(ErrorKind::kModel, "ConvTransposeGrad '{}': a bias gradient without a bias input",
           a.name);
    if (b->shape != Shape{g.y[1]})
      fail(ErrorKind::kModel, "ConvTransposeGrad '{}': bias {} should be [{}]", a.name,
           b->describe(), g.y[1]);
    expect_shape(a, 2, b->shape);
  }
  if (dy.numel() == 0 || x.numel() == 0) return ops::zero_outputs(a);
  CpuContext& ctx = context(a);
  const Deconv d = deconv_of(g);
  try {
    if (io.wants(0) || io.wants(1)) {
      const auto hint =
          forward_pd(d, memory::desc(), dnnl::prop_kind::forward_training, ctx.engine);
      memory diff_dst(d.dst, ctx.engine, dy.data);
      if (io.wants(0)) {
        dnnl::deconvolution_backward_data::desc desc(dnnl::algorithm::deconvolution_direct, d.src,
                                                     d.weights, d.dst, d.strides, d.dilates,
                                                     d.pad_l, d.pad_r);
        dnnl::deconvolution_backward_data::primitive_desc pd(desc, ctx.engine, hint);
        dnnl::deconvolution_backward_data(pd).execute(
            ctx.stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                         {DNNL_ARG_WEIGHTS, memory(d.weights, ctx.engine, w.data)},
                         {DNNL_ARG_DIFF_SRC, memory(d.src, ctx.engine, io.dx(0)->data)}});
      }
      if (io.wants(1)) {
        dnnl::deconvolution_backward_weights::desc desc(dnnl::algorithm::deconvolution_direct,
                                                        d.src, d.weights, d.dst, d.strides,
                                                        d.dilates, d.pad_l, d.pad_r);
        dnnl::deconvolution_backward_weights::primitive_desc pd(desc, ctx.engine, hint);
        dnnl::deconvolution_backward_weights(pd).execute(
            ctx.stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                         {DNNL_ARG_SRC, memory(d.src, ctx.engine, x.data)},
                         {DNNL_ARG_DIFF_WEIGHTS, memory(d.weights, ctx.engine, io.dx(1)->data)}});
      }
      ctx.stream.wait();
    }
  } catch (const dnnl::error& e) {
    fail(ErrorKind::kUnsupported,
         "oneDNN cannot run ConvTransposeGrad '{}' ({} with weights {}): {}", a.name,
         shape_string(g.x), shape_string(g.w), e.what());
  }
  if (io.wants(2)) {
    const int64_t batch = g.y[0], m = g.y[1], size = dy.numel() / (batch * m);
    const float* p = dy.as<float>();
    float* db = io.dx(2)->as<float>();
#pragma omp parallel for if (dy.numel() > 32768)
    for (int64_t c = 0; c < m; ++c) {
      double s = 0;
      for (int64_t b = 0; b < batch; ++b) {
        const float* q = p + (b * m + c) * size;
        for (int64_t i = 0; i < size; ++i) s += q[i];
      }
      db[c] = static_cast<float>(s);
    }
  }
}

// What both kernels take before the shapes are known: float32 operands, 2 or 3 inputs, an
// auto_pad ONNX names and at most 3 spatial dims (the rest is checked by the geometry).
std::string check_attributes(const OpSignature& s) {
  if (std::string why = all_float32(s); !why.empty()) return why;
  const std::string auto_pad = s.attrs.s("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "SAME_UPPER" && auto_pad != "SAME_LOWER" &&
      auto_pad != "VALID")
    return fmt::format("{} auto_pad '{}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID",
                       s.op_type, auto_pad);
  if (s.attrs.i("group", 1) < 1)
    return fmt::format("{} group {} must be at least 1", s.op_type, s.attrs.i("group", 1));
  if (s.attrs.ints("kernel_shape").size() > 3)
    return fmt::format("{} with {} spatial dims is not supported (1-D to 3-D only)", s.op_type,
                       s.attrs.ints("kernel_shape").size());
  return "";
}

std::string check_conv_transpose(const OpSignature& s) {
  if (s.inputs.size() < 2 || s.inputs.size() > 3 || s.inputs[0] == DType::kUndefined ||
      s.inputs[1] == DType::kUndefined)
    return "ConvTranspose needs inputs X and W and at most a bias B";
  return check_attributes(s);
}

std::string check_conv_transpose_grad(const OpSignature& s) {
  if (std::string why = ops::grad_arity_error(s, kArity); !why.empty()) return why;
  return check_attributes(s);
}

constexpr KernelEntry kKernels[] = {
    {"ConvTranspose", conv_transpose, check_conv_transpose},
    {"ConvTransposeGrad", conv_transpose_grad, check_conv_transpose_grad,
     /*writes_every_output=*/true},
};

}  // namespace

std::span<const KernelEntry> conv_transpose_kernels() { return kKernels; }

}  // namespace stagecraft::rt::cpu
