// The CUDA backend's pad and reduction families against the CPU backend's, without a GPU: every
// op of the CPU's pad and reduce families has a CUDA kernel with the same contract flag, and
// the CUDA backend accepts and refuses the same signatures (Pad on every fixed-size dtype the
// CPU moves, its pads and constant operands, the attribute form; the reductions' dtypes, their
// axes operand; the gradients' float32 and arity).
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

TEST_CASE("the cuda backend covers the cpu's Pad and reductions and their gradients") {
#ifdef STAGECRAFT_WITH_CUDA
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  const int ops = check_covers(*cuda, {cpu::pad_kernels(), cpu::reduce_kernels()});
  CHECK(ops == 21);  // Pad and 9 reductions, each with its gradient, and ReduceMean

  onnx::NodeProto plain_node;
  const Attrs plain(plain_node);
  onnx::NodeProto old_pad_node;  // opsets 2-10
  set_ints(old_pad_node, "pads", {0, 1, 1, 0});
  onnx::AttributeProto* mode = old_pad_node.add_attribute();
  mode->set_name("mode");
  mode->set_type(onnx::AttributeProto::STRING);
  mode->set_s("reflect");
  const Attrs old_pad(old_pad_node);
  onnx::NodeProto axes_node;
  set_ints(axes_node, "axes", {0, -1});
  set_int(axes_node, "keepdims", 0);
  const Attrs axes(axes_node);
  onnx::NodeProto grad1_node, grad2_node, grad3_node;
  set_int(grad1_node, std::string(grad::kForwardInputsAttr), 1);
  set_int(grad2_node, std::string(grad::kForwardInputsAttr), 2);
  set_int(grad3_node, std::string(grad::kForwardInputsAttr), 3);
  const Attrs grad1(grad1_node), grad2(grad2_node), grad3(grad3_node);

  using D = DType;
  const DType f32[] = {D::kFloat32};
  const DType f64[] = {D::kFloat64};
  const DType i32[] = {D::kInt32};
  const DType i64[] = {D::kInt64};
  const DType i8[] = {D::kInt8};
  const DType u8[] = {D::kUInt8};
  const DType b[] = {D::kBool};
  const DType f16[] = {D::kFloat16}, str[] = {D::kString};
  const DType i16[] = {D::kInt16};
  const DType u32[] = {D::kUInt32};
  const DType pad_f32[] = {D::kFloat32, D::kInt64, D::kFloat32};
  const DType pad_i8[] = {D::kInt8, D::kInt64};
  const DType pad_no_constant[] = {D::kInt64, D::kInt64, D::kUndefined};
  const DType pad_bad_pads[] = {D::kFloat32, D::kInt32};
  const DType pad_bad_constant[] = {D::kFloat32, D::kInt64, D::kFloat64};
  const DType pad_axes[] = {D::kFloat32, D::kInt64, D::kFloat32, D::kInt64};  // opset 18
  const DType f32_axes[] = {D::kFloat32, D::kInt64};
  const DType i32_axes[] = {D::kInt32, D::kInt64};
  const DType f32_no_axes[] = {D::kFloat32, D::kUndefined};
  const DType f32_bad_axes[] = {D::kFloat32, D::kFloat32};
  // Gradients: X, [pads or axes,] Y, dY -> dX[, none].
  const DType grad_in1[] = {D::kFloat32, D::kFloat32, D::kFloat32};
  const DType grad_in2[] = {D::kFloat32, D::kInt64, D::kFloat32, D::kFloat32};
  const DType grad_in3[] = {D::kFloat32, D::kInt64, D::kFloat32, D::kFloat32, D::kFloat32};
  const DType grad_out2[] = {D::kFloat32, D::kUndefined};
  const DType grad_out3[] = {D::kFloat32, D::kUndefined, D::kUndefined};
  const DType grad_in_f64[] = {D::kFloat64, D::kFloat64, D::kFloat64};
  const DType grad_out2_axes[] = {D::kFloat32, D::kInt64};
  const OpSignature accepted[] = {{"Pad", pad_f32, f32, plain},
                                  {"Pad", pad_i8, i8, plain},
                                  {"Pad", pad_no_constant, i64, plain},
                                  {"Pad", f64, f64, old_pad},
                                  {"Pad", u8, u8, old_pad},
                                  {"Pad", b, b, old_pad},
                                  {"Pad", i32, i32, old_pad},
                                  {"PadGrad", grad_in1, f32, grad1},
                                  {"PadGrad", grad_in2, grad_out2, grad2},
                                  {"PadGrad", grad_in3, grad_out3, grad3},
                                  {"ReduceSum", f32_axes, f32, plain},
                                  {"ReduceSum", i32_axes, i32, plain},
                                  {"ReduceSum", f32_no_axes, f32, plain},
                                  {"ReduceMax", i64, i64, axes},
                                  {"ReduceMin", f64, f64, axes},
                                  {"ReduceProd", i32, i32, axes},
                                  {"ReduceL1", i64, i64, axes},
                                  {"ReduceL2", f64, f64, axes},
                                  {"ReduceSumSquare", i32, i32, axes},
                                  {"ReduceLogSum", f32, f32, axes},
                                  {"ReduceLogSumExp", f64, f64, plain},
                                  {"ReduceSumGrad", grad_in2, grad_out2, grad2},
                                  {"ReduceMaxGrad", grad_in1, f32, grad1},
                                  {"ReduceMinGrad", grad_in1, f32, grad1},
                                  {"ReduceProdGrad", grad_in1, f32, grad1},
                                  {"ReduceL2Grad", grad_in1, f32, grad1},
                                  {"ReduceL1Grad", grad_in1, f32, grad1},
                                  {"ReduceSumSquareGrad", grad_in1, f32, grad1},
                                  {"ReduceLogSumGrad", grad_in1, f32, grad1},
                                  {"ReduceLogSumExpGrad", grad_in1, f32, grad1}};
  check_accepted_alike(*cuda, accepted);
  // float16 has no kernel of its own: both backends run it widened to float32 (stagec
  // --precision fp16), so it is accepted; strings are refused.
  for (const OpSignature& s :
       {OpSignature{"Pad", f16, f16, old_pad}, OpSignature{"ReduceMax", f16, f16, axes}}) {
    CAPTURE(s.op_type);
    CHECK(cuda->runs_widened(s));
    CHECK(cpu_backend().runs_widened(s));
  }
  const OpSignature refused[] = {{"Pad", str, str, old_pad},
                                 {"Pad", i16, i16, old_pad},
                                 {"Pad", u32, u32, old_pad},
                                 {"Pad", f32, f64, old_pad},
                                 {"Pad", pad_bad_pads, f32, plain},
                                 {"Pad", pad_bad_constant, f32, plain},
                                 {"Pad", pad_axes, f32, plain},
                                 {"PadGrad", grad_in_f64, f64, grad1},
                                 {"PadGrad", grad_in1, f32, grad2},
                                 {"ReduceSum", i8, i8, plain},
                                 {"ReduceSum", f32_bad_axes, f32, plain},
                                 {"ReduceMax", str, str, axes},
                                 {"ReduceProd", f32, f64, axes},
                                 {"ReduceL2", i32, i32, axes},
                                 {"ReduceLogSum", i64, i64, axes},
                                 {"ReduceLogSumExp", i32, i32, plain},
                                 {"ReduceSumGrad", grad_in2, grad_out2_axes, grad2},
                                 {"ReduceMaxGrad", grad_in_f64, f64, grad1},
                                 {"ReduceL2Grad", grad_in3, grad_out3, grad3}};
  check_refused_alike(*cuda, refused);
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

}  // namespace
}  // namespace stagecraft::rt
