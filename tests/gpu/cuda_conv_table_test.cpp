// The CUDA backend's conv and grad_conv families against the CPU backend's, without a GPU:
// every op of the CPU's conv, pool and grad_conv families has a CUDA kernel with the same
// contract flag, and the CUDA backend accepts and refuses the same signatures (MaxPool on int8
// and uint8 with its Indices, asymmetric and auto pads, ceil_mode, the gradients' arity).
#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <span>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/cpu/families.h"
#include "runtime/format/grad_ops.h"
#include "tests/gpu/table_util.h"

namespace stagecraft::rt {
namespace {

using gpu_test::check_accepted_alike;
using gpu_test::check_covers;
using gpu_test::check_refused_alike;
using gpu_test::set_int;
using gpu_test::set_ints;
using gpu_test::set_string;

TEST_CASE("the cuda backend covers the cpu's conv and pooling ops and their gradients") {
#ifdef STAGECRAFT_WITH_CUDA
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  const int ops =
      check_covers(*cuda, {cpu::conv_kernels(), cpu::pool_kernels(), cpu::grad_conv_kernels()});
  CHECK(ops == 8);  // Conv, MaxPool, AveragePool, GlobalAveragePool and their gradients

  // Attribute sets: a 2-D window with asymmetric pads and ceil_mode; SAME_LOWER; values the
  // CPU refuses.
  onnx::NodeProto window_node;
  set_ints(window_node, "kernel_shape", {3, 2});
  set_ints(window_node, "pads", {0, 1, 1, 0});
  set_ints(window_node, "strides", {2, 2});
  set_int(window_node, "ceil_mode", 1);
  set_int(window_node, "count_include_pad", 1);
  set_int(window_node, "storage_order", 1);
  const Attrs window(window_node);
  onnx::NodeProto same_node;
  set_string(same_node, "auto_pad", "SAME_LOWER");
  set_ints(same_node, "kernel_shape", {4});
  set_int(same_node, "group", 2);
  const Attrs same(same_node);
  onnx::NodeProto grad_node;
  set_ints(grad_node, "kernel_shape", {3, 3});
  set_int(grad_node, std::string(grad::kForwardInputsAttr), 3);
  const Attrs conv_grad(grad_node);
  onnx::NodeProto pool_grad_node;
  set_ints(pool_grad_node, "kernel_shape", {2, 2});
  set_int(pool_grad_node, std::string(grad::kForwardInputsAttr), 1);
  const Attrs pool_grad(pool_grad_node);
  onnx::NodeProto bad_pad_node;
  set_string(bad_pad_node, "auto_pad", "SAME");
  set_ints(bad_pad_node, "kernel_shape", {2, 2});
  const Attrs bad_pad(bad_pad_node);
  onnx::NodeProto four_d_node;
  set_ints(four_d_node, "kernel_shape", {2, 2, 2, 2});
  const Attrs four_d(four_d_node);
  onnx::NodeProto bad_ceil_node;
  set_ints(bad_ceil_node, "kernel_shape", {2});
  set_int(bad_ceil_node, "ceil_mode", 2);
  const Attrs bad_ceil(bad_ceil_node);

  using D = DType;
  const DType f32[] = {D::kFloat32};
  const DType f32_2[] = {D::kFloat32, D::kFloat32};
  const DType conv_in[] = {D::kFloat32, D::kFloat32, D::kFloat32};
  const DType conv_no_bias[] = {D::kFloat32, D::kFloat32, D::kUndefined};
  const DType i8[] = {D::kInt8};
  const DType i8_indices[] = {D::kInt8, D::kInt64};
  const DType u8[] = {D::kUInt8};
  const DType i16[] = {D::kInt16};
  const DType f64[] = {D::kFloat64};
  const DType f64_2[] = {D::kFloat64, D::kFloat64};
  // ConvGrad with a bias: X, W, B, Y, dY -> dX, dW, dB (the weight-gradient half names no dX).
  const DType conv_grad_in[] = {D::kFloat32, D::kFloat32, D::kFloat32, D::kFloat32, D::kFloat32};
  const DType conv_grad_out[] = {D::kFloat32, D::kFloat32, D::kFloat32};
  const DType weight_half_out[] = {D::kUndefined, D::kFloat32, D::kFloat32};
  // MaxPoolGrad with Indices: X, Y, Indices, dY, dIndices -> dX.
  const DType max_pool_grad_in[] = {D::kFloat32, D::kFloat32, D::kInt64, D::kFloat32,
                                    D::kUndefined};
  const DType pool_grad_in[] = {D::kFloat32, D::kFloat32, D::kFloat32};
  const OpSignature accepted[] = {{"Conv", conv_in, f32, window},
                                  {"Conv", conv_no_bias, f32, same},
                                  {"Conv", f32_2, f32, same},
                                  {"MaxPool", i8, i8_indices, window},
                                  {"MaxPool", u8, u8, same},
                                  {"MaxPool", f32, f32, window},
                                  {"AveragePool", f32, f32, window},
                                  {"GlobalAveragePool", f32, f32, window},
                                  {"ConvGrad", conv_grad_in, conv_grad_out, conv_grad},
                                  {"ConvGrad", conv_grad_in, weight_half_out, conv_grad},
                                  {"MaxPoolGrad", max_pool_grad_in, f32, pool_grad},
                                  {"AveragePoolGrad", pool_grad_in, f32, pool_grad},
                                  {"GlobalAveragePoolGrad", pool_grad_in, f32, pool_grad}};
  check_accepted_alike(*cuda, accepted);
  const OpSignature refused[] = {{"Conv", f64_2, f64, same},
                                 {"Conv", f32, f32, same},
                                 {"Conv", f32_2, f32, four_d},
                                 {"Conv", f32_2, f32, bad_pad},
                                 {"MaxPool", i16, i16, window},
                                 {"MaxPool", f32, f32, bad_pad},
                                 {"MaxPool", f32, f32, bad_ceil},
                                 {"AveragePool", u8, u8, window},
                                 {"GlobalAveragePool", f64, f64, window},
                                 {"ConvGrad", pool_grad_in, f32, conv_grad},
                                 {"MaxPoolGrad", pool_grad_in, f32, conv_grad},
                                 {"AveragePoolGrad", max_pool_grad_in, f32, pool_grad}};
  check_refused_alike(*cuda, refused);
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

TEST_CASE("the cuda backend convolves 16-bit tensors natively, forward and gradient") {
#ifdef STAGECRAFT_WITH_CUDA
  // cuDNN on bfloat16 or float16 throughout with float32 accumulation (conv_cudnn.cpp), where
  // the CPU widens; two float types in one node widen; what the float32 form refuses is refused.
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  onnx::NodeProto conv_node;
  set_ints(conv_node, "kernel_shape", {3, 3});
  set_ints(conv_node, "pads", {0, 1, 1, 0});
  const Attrs conv(conv_node);
  onnx::NodeProto grad_node;
  set_ints(grad_node, "kernel_shape", {3, 3});
  set_int(grad_node, std::string(grad::kForwardInputsAttr), 3);
  const Attrs conv_grad(grad_node);
  onnx::NodeProto bad_pad_node;
  set_string(bad_pad_node, "auto_pad", "SAME");
  set_ints(bad_pad_node, "kernel_shape", {2, 2});
  const Attrs bad_pad(bad_pad_node);
  using D = DType;
  for (const DType h : {D::kBFloat16, D::kFloat16}) {
    CAPTURE(dtype_name(h));
    const DType one[] = {h}, with_bias[] = {h, h, h}, no_bias[] = {h, h, D::kUndefined};
    const DType grad_in[] = {h, h, h, h, h}, grad_out[] = {h, h, h},
                weight_half[] = {D::kUndefined, h, h};
    for (const OpSignature& s : {OpSignature{"Conv", with_bias, one, conv},
                                 OpSignature{"Conv", no_bias, one, conv},
                                 OpSignature{"ConvGrad", grad_in, grad_out, conv_grad},
                                 OpSignature{"ConvGrad", grad_in, weight_half, conv_grad}}) {
      CAPTURE(s.op_type);
      CHECK(cuda->check(s).empty());
      CHECK_FALSE(cuda->runs_widened(s));
    }
    const DType beside_f32[] = {h, D::kFloat32, h};
    const OpSignature mixed{"Conv", beside_f32, one, conv};
    CHECK(cuda->check(mixed).empty());
    CHECK(cuda->runs_widened(mixed));
    CHECK_FALSE(cuda->check(OpSignature{"Conv", with_bias, one, bad_pad}).empty());
  }
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

}  // namespace
}  // namespace stagecraft::rt
