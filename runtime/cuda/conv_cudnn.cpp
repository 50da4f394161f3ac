// Conv and ConvGrad on cuDNN (conv_common.h): descriptors, algorithm choice and the calls.
//
// Descriptors: X, Y (and dX, dY) are tensor descriptors with dense NCHW strides; W (and dW) a
// filter descriptor in CUDNN_TENSOR_NCHW of [M, C / group, kernel...]; the convolution
// descriptor holds the symmetric pads, strides and dilations, CUDNN_CROSS_CORRELATION (ONNX's
// Conv does not flip the kernel), float32 compute, the group count, and CUDNN_FMA_MATH: float32
// stays float32 (no TF32), as cuBLAS does here (cuda_context.cpp), so results are held to the
// CPU backend's at rtol 1e-4. A 16-bit plan's convolutions (bfloat16 or float16 tensors) keep
// float32 compute with CUDNN_TENSOR_OP_MATH: the tensor cores multiply the 16-bit values exactly
// and accumulate in float32, as cuBLAS's 16-bit products do here.
//
// Algorithms come from cuDNN's heuristics (the *_v7 queries, fastest first, no benchmarking
// runs): the first supported one without FFT or Winograd (its rounding is then that of a direct
// sum; float32 ones also without tensor-op math), and with `DeviceContext::deterministic`
// (stagerun --deterministic) the first such deterministic one, so a rerun gives the same bytes.
// Without it some backward algorithms add partial sums with atomics, as PyTorch's default
// allows. Only when none is offered does the first one cuDNN supports run. The workspace is the
// context's (grown as needed). During --profile-nodes' step each call says its choice in the
// context's notes.
//
// Descriptors, algorithms and workspace sizes are made once per convolution signature (the
// dims, pads, strides, dilations and groups) and direction, and kept in the context's
// CudnnConvCache: a step's calls then go straight to cuDNN's compute call, where before each
// call built four descriptors and ran the heuristics (about 158 such calls a ResNet-50 step).
//
// The convolution API is cuDNN's legacy one, marked deprecated in cuDNN 9 (its graph API is
// the successor). Its declarations warn only where CUDNN_WARN_DEPRECATED is defined; should a
// build define it, the warnings are silenced for this file alone, below.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/conv_common.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/format/error.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace stagecraft::rt::cuda {
namespace conv_cudnn_impl {

// One cuDNN descriptor, destroyed with its owner.
template <class Handle, cudnnStatus_t (*Create)(Handle*), cudnnStatus_t (*Destroy)(Handle)>
class Descriptor {
 public:
  explicit Descriptor(const char* what) { check(Create(&handle_), what); }
  ~Descriptor() {
    if (handle_ != nullptr) Destroy(handle_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};

using TensorDesc =
    Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc =
    Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc = Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                            cudnnDestroyConvolutionDescriptor>;

// Every descriptor of one convolution. `x` is the (padded) input; `y` the output, or dY.
struct Descriptors {
  TensorDesc x{"cudnnCreateTensorDescriptor"};
  FilterDesc w{"cudnnCreateFilterDescriptor"};
  TensorDesc y{"cudnnCreateTensorDescriptor"};
  ConvDesc conv{"cudnnCreateConvolutionDescriptor"};

  explicit Descriptors(const CudnnConv& c) {
    const cudnnDataType_t type = data_type(c.dtype);
    set_tensor(x.get(), c.x, type);
    check(cudnnSetFilterNdDescriptor(w.get(), type, CUDNN_TENSOR_NCHW,
                                     static_cast<int>(c.w.size()), c.w.data()),
          "cudnnSetFilterNdDescriptor");
    set_tensor(y.get(), c.y, type);
    check(cudnnSetConvolutionNdDescriptor(conv.get(), static_cast<int>(c.pad.size()), c.pad.data(),
                                          c.stride.data(), c.dilation.data(),
                                          CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
          "cudnnSetConvolutionNdDescriptor");
    check(cudnnSetConvolutionGroupCount(conv.get(), c.group), "cudnnSetConvolutionGroupCount");
    check(cudnnSetConvolutionMathType(
              conv.get(), c.dtype == DType::kFloat32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH),
          "cudnnSetConvolutionMathType");
  }

  static cudnnDataType_t data_type(DType dtype) {
    switch (dtype) {
      case DType::kBFloat16:
        return CUDNN_DATA_BFLOAT16;
      case DType::kFloat16:
        return CUDNN_DATA_HALF;
      default:
        return CUDNN_DATA_FLOAT;
    }
  }

  // Dense NCHW: each dim's stride is the product of the dims after it (cudnn_conv checked
  // that every tensor's element count fits an int).
  static void set_tensor(cudnnTensorDescriptor_t desc, const std::vector<int>& dims,
                         cudnnDataType_t type) {
    std::vector<int> strides(dims.size(), 1);
    for (size_t d = dims.size() - 1; d-- > 0;) strides[d] = strides[d + 1] * dims[d + 1];
    check(cudnnSetTensorNdDescriptor(desc, type, static_cast<int>(dims.size()),
                                     dims.data(), strides.data()),
          "cudnnSetTensorNdDescriptor");
  }
};

// One convolution signature's descriptors and, per direction once asked, its algorithm and
// workspace bytes.
template <class Algo>
struct Choice {
  bool made = false;
  Algo algo{};
  size_t bytes = 0;
};

struct ConvPlan {
  explicit ConvPlan(const CudnnConv& c) : d(c) {}
  Descriptors d;
  Choice<cudnnConvolutionFwdAlgo_t> forward;
  Choice<cudnnConvolutionBwdDataAlgo_t> data;
  Choice<cudnnConvolutionBwdFilterAlgo_t> filter;
};

}  // namespace conv_cudnn_impl

struct CudnnConvCache {
  std::map<std::vector<int>, std::unique_ptr<conv_cudnn_impl::ConvPlan>> plans;
};

CudnnConvCache& CudaContext::conv_cache() {
  if (conv_cache_ == nullptr) conv_cache_ = std::make_shared<CudnnConvCache>();
  return *conv_cache_;
}

namespace {

using conv_cudnn_impl::ConvPlan;

// The cached plan of convolution `c` on the node's context, made on the signature's first call.
ConvPlan& plan_of(CudaContext& ctx, const CudnnConv& c) {
  std::vector<int> key{static_cast<int>(c.x.size()), c.group, static_cast<int>(c.dtype),
                       ctx.deterministic ? 1 : 0};
  for (const std::vector<int>* part : {&c.x, &c.w, &c.y, &c.pad, &c.stride, &c.dilation})
    key.insert(key.end(), part->begin(), part->end());
  std::unique_ptr<ConvPlan>& plan = ctx.conv_cache().plans[key];
  if (plan == nullptr) plan = std::make_unique<ConvPlan>(c);
  return *plan;
}

bool tensor_op(cudnnMathType_t math) {
  return math == CUDNN_TENSOR_OP_MATH || math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// The algorithm to run from cuDNN's ranked `perf` (`count` entries): the first supported,
// deterministic one that `direct` accepts (no FFT or Winograd) and, for float32, keeps float32
// (no tensor-op math), else the first supported such one. Throws `Error(kUnsupported)` when
// cuDNN supports none.
template <class Perf, class Algo>
Algo choose(const KernelArgs& a, const CudnnConv& c, const Perf* perf, int count,
            bool (*direct)(Algo), const char* pass) {
  const bool float32 = c.dtype == DType::kFloat32;
  const bool deterministic = a.device.deterministic;
  auto allowed = [&](const Perf& p) {
    return p.status == CUDNN_STATUS_SUCCESS && !(float32 && tensor_op(p.mathType));
  };
  for (int k = 0; k < count; ++k)
    if (allowed(perf[k]) && direct(perf[k].algo) &&
        (!deterministic || perf[k].determinism == CUDNN_DETERMINISTIC))
      return perf[k].algo;
  for (int k = 0; k < count; ++k)
    if (allowed(perf[k])) return perf[k].algo;
  fail(ErrorKind::kUnsupported, "{} '{}': cuDNN offers no {} algorithm for its {}", a.op_type,
       a.name, dtype_name(c.dtype), pass);
}

bool direct_forward(cudnnConvolutionFwdAlgo_t algo) {
  return algo != CUDNN_CONVOLUTION_FWD_ALGO_FFT && algo != CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
         algo != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD &&
         algo != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}

bool direct_data(cudnnConvolutionBwdDataAlgo_t algo) {
  return algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT &&
         algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING &&
         algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD &&
         algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}

bool direct_filter(cudnnConvolutionBwdFilterAlgo_t algo) {
  return algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT &&
         algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING &&
         algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD &&
         algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// cuDNN's algorithm names without their common prefix, for --profile-nodes' notes.
const char* algo_name(cudnnConvolutionFwdAlgo_t algo) {
  switch (algo) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM:
      return "IMPLICIT_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
      return "IMPLICIT_PRECOMP_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM:
      return "GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT:
      return "DIRECT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT:
      return "FFT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING:
      return "FFT_TILING";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD:
      return "WINOGRAD";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED";
    default:
      return "other";
  }
}

const char* algo_name(cudnnConvolutionBwdDataAlgo_t algo) {
  switch (algo) {
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0:
      return "ALGO_0 (atomics)";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1:
      return "ALGO_1";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT:
      return "FFT";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING:
      return "FFT_TILING";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD:
      return "WINOGRAD";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED";
    default:
      return "other";
  }
}

const char* algo_name(cudnnConvolutionBwdFilterAlgo_t algo) {
  switch (algo) {
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0:
      return "ALGO_0 (atomics)";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1:
      return "ALGO_1";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT:
      return "FFT";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3:
      return "ALGO_3 (atomics)";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING:
      return "FFT_TILING";
    default:
      return "other";
  }
}

// During --profile-nodes' step: "<pass> <algorithm> (<workspace> MiB workspace)" added to the
// context's notes.
template <class Algo>
void note_choice(CudaContext& ctx, const char* pass, Algo algo, size_t bytes) {
  if (!ctx.collect_notes) return;
  if (!ctx.notes.empty()) ctx.notes += "; ";
  ctx.notes += fmt::format("{} {} ({:.1f} MiB workspace)", pass, algo_name(algo),
                           static_cast<double>(bytes) / (1 << 20));
}

// `value` as cuDNN's int, or Error(kUnsupported) naming the node and `what`.
int to_int(const KernelArgs& a, int64_t value, const char* what) {
  if (value < 0 || value > INT_MAX)
    fail(ErrorKind::kUnsupported, "{} '{}': {} {} exceeds cuDNN's int range", a.op_type, a.name,
         what, value);
  return static_cast<int>(value);
}

// The dims of a tensor, checked to fit cuDNN's ints, element count included.
std::vector<int> int_dims(const KernelArgs& a, const std::vector<int64_t>& dims, const char* what) {
  int64_t count = 1;
  std::vector<int> out;
  for (int64_t d : dims) {
    out.push_back(to_int(a, d, what));
    count *= d;
    to_int(a, count, what);
  }
  return out;
}

// Throws for a failed call, naming the node and the function (formatted only then: these run
// on every call).
void check_call(cudnnStatus_t status, const KernelArgs& a, const char* function) {
  if (status != CUDNN_STATUS_SUCCESS)
    check(status, fmt::format("{} '{}': {}", a.op_type, a.name, function));
}

void check_call(cudaError_t status, const KernelArgs& a, const char* function) {
  if (status != cudaSuccess) check(status, fmt::format("{} '{}': {}", a.op_type, a.name, function));
}

}  // namespace

CudnnConv cudnn_conv(const KernelArgs& a, const ops::ConvGeometry& g, const Shape& w_shape,
                     DType dtype) {
  const size_t spatial = g.src.size() - 2;
  const size_t lead = spatial == 1 ? 1 : 0;  // a 1-D convolution gets a unit height
  const size_t front = 3 - spatial;          // PadShape's front-filled dims
  CudnnConv c;
  c.dtype = dtype;
  c.group = to_int(a, a.attrs.i("group", 1), "group");
  std::vector<int64_t> x{g.src[0], g.src[1]}, w{w_shape[0], w_shape[1]}, y{g.dst[0], g.dst[1]};
  if (lead == 1) {
    x.push_back(1);
    w.push_back(1);
    y.push_back(1);
    c.pad.push_back(0);
    c.stride.push_back(1);
    c.dilation.push_back(1);
  }
  c.pad_shape.planes = g.src[0] * g.src[1];
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t in = g.src[2 + i], before = g.pad_l[i], after = g.pad_r[i];
    const int64_t common = std::min(before, after);
    const int64_t padded = in + (before - common) + (after - common);
    c.explicit_pad |= before != after;
    c.pad_shape.in[front + i] = in;
    c.pad_shape.padded[front + i] = padded;
    c.pad_shape.before[front + i] = before - common;
    x.push_back(padded);
    w.push_back(w_shape[2 + i]);
    y.push_back(g.dst[2 + i]);
    c.pad.push_back(to_int(a, common, "pad"));
    c.stride.push_back(to_int(a, g.strides[i], "stride"));
    c.dilation.push_back(to_int(a, g.dilates[i] + 1, "dilation"));  // oneDNN counts from 0
  }
  c.x = int_dims(a, x, "input size");
  c.w = int_dims(a, w, "weight size");
  c.y = int_dims(a, y, "output size");
  return c;
}

Tensor convolution_input(const KernelArgs& a, const CudnnConv& c, const Tensor& x) {
  if (!c.explicit_pad) return x;
  Tensor padded = new_padded_input(a, c);
  launch_pad(c.dtype, x.data, padded.data, c.pad_shape, context(a).stream());
  check_call(cudaGetLastError(), a, "padding kernel launch");
  return padded;
}

Tensor new_padded_input(const KernelArgs& a, const CudnnConv& c) {
  Shape shape;
  for (int d : c.x) shape.push_back(d);
  return context(a).new_tensor(c.dtype, std::move(shape), false);
}

void cudnn_conv_forward(const KernelArgs& a, const CudnnConv& c, const void* x, const void* w,
                        void* y) {
  CudaContext& ctx = context(a);
  cudnnHandle_t handle = ctx.cudnn();
  ConvPlan& p = plan_of(ctx, c);
  const conv_cudnn_impl::Descriptors& d = p.d;
  if (!p.forward.made) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    check_call(cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x.get(), d.w.get(), d.conv.get(),
                                                      d.y.get(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                      &count, perf),
               a, "cudnnGetConvolutionForwardAlgorithm_v7");
    p.forward.algo = choose(a, c, perf, count, direct_forward, "forward pass");
    check_call(cudnnGetConvolutionForwardWorkspaceSize(handle, d.x.get(), d.w.get(), d.conv.get(),
                                                       d.y.get(), p.forward.algo, &p.forward.bytes),
               a, "cudnnGetConvolutionForwardWorkspaceSize");
    p.forward.made = true;
  }
  note_choice(ctx, "forward", p.forward.algo, p.forward.bytes);
  void* workspace = ctx.workspace(static_cast<int64_t>(p.forward.bytes));
  const float one = 1.0f, zero = 0.0f;
  check_call(
      cudnnConvolutionForward(handle, &one, d.x.get(), x, d.w.get(), w, d.conv.get(),
                              p.forward.algo, workspace, p.forward.bytes, &zero, d.y.get(), y),
      a, "cudnnConvolutionForward");
}

void cudnn_conv_backward_data(const KernelArgs& a, const CudnnConv& c, const void* w,
                              const void* dy, void* dx) {
  CudaContext& ctx = context(a);
  cudnnHandle_t handle = ctx.cudnn();
  ConvPlan& p = plan_of(ctx, c);
  const conv_cudnn_impl::Descriptors& d = p.d;
  if (!p.data.made) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    check_call(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                   handle, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                   CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf),
               a, "cudnnGetConvolutionBackwardDataAlgorithm_v7");
    p.data.algo = choose(a, c, perf, count, direct_data, "input gradient");
    check_call(
        cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d.w.get(), d.y.get(), d.conv.get(),
                                                     d.x.get(), p.data.algo, &p.data.bytes),
        a, "cudnnGetConvolutionBackwardDataWorkspaceSize");
    p.data.made = true;
  }
  note_choice(ctx, "input gradient", p.data.algo, p.data.bytes);
  void* workspace = ctx.workspace(static_cast<int64_t>(p.data.bytes));
  const float one = 1.0f, zero = 0.0f;
  check_call(
      cudnnConvolutionBackwardData(handle, &one, d.w.get(), w, d.y.get(), dy, d.conv.get(),
                                   p.data.algo, workspace, p.data.bytes, &zero, d.x.get(), dx),
      a, "cudnnConvolutionBackwardData");
}

void cudnn_conv_backward_filter(const KernelArgs& a, const CudnnConv& c, const void* x,
                                const void* dy, void* dw) {
  CudaContext& ctx = context(a);
  cudnnHandle_t handle = ctx.cudnn();
  ConvPlan& p = plan_of(ctx, c);
  const conv_cudnn_impl::Descriptors& d = p.d;
  if (!p.filter.made) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    check_call(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                   handle, d.x.get(), d.y.get(), d.conv.get(), d.w.get(),
                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf),
               a, "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    p.filter.algo = choose(a, c, perf, count, direct_filter, "weight gradient");
    check_call(
        cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, d.x.get(), d.y.get(), d.conv.get(),
                                                       d.w.get(), p.filter.algo, &p.filter.bytes),
        a, "cudnnGetConvolutionBackwardFilterWorkspaceSize");
    p.filter.made = true;
  }
  note_choice(ctx, "weight gradient", p.filter.algo, p.filter.bytes);
  void* workspace = ctx.workspace(static_cast<int64_t>(p.filter.bytes));
  const float one = 1.0f, zero = 0.0f;
  check_call(cudnnConvolutionBackwardFilter(handle, &one, d.x.get(), x, d.y.get(), dy, d.conv.get(),
                                            p.filter.algo, workspace, p.filter.bytes, &zero,
                                            d.w.get(), dw),
             a, "cudnnConvolutionBackwardFilter");
}

}  // namespace stagecraft::rt::cuda

#pragma GCC diagnostic pop
