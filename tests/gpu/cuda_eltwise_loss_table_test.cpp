// The CUDA backend's elementwise, loss and elementwise-gradient families against the CPU
// backend's, without a GPU: every op of the CPU's elementwise, leaky_relu, unary_math,
// activations, compare_logic, loss and grad_eltwise families has a CUDA kernel with the same
// contract flag, and the CUDA backend accepts and refuses the same signatures (every dtype the
// CPU's kernels take has a CUDA kernel).
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

TEST_CASE("the cuda backend covers the cpu's elementwise, loss and random ops and gradients") {
#ifdef STAGECRAFT_WITH_CUDA
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  const int ops = check_covers(
      *cuda, {cpu::elementwise_kernels(), cpu::leaky_relu_kernels(), cpu::unary_math_kernels(),
              cpu::activations_kernels(), cpu::compare_logic_kernels(), cpu::loss_kernels(),
              cpu::grad_eltwise_kernels(), cpu::random_kernels()});
  CHECK(ops >= 87);  // 17 elementwise, 2 leaky_relu, 20 unary maths, 10 activations,
                     // 13 comparisons/logic/IsNaN/IsInf/Min/Max/Mod, 4 loss, 17 gradients,
                     // 4 random

  // Signatures the CPU takes (integer arithmetic, mixed Pow, Cast through 16-bit floats), and
  // ones it refuses, answered alike.
  const Attrs none;
  const DType u8[] = {DType::kUInt8};
  const DType i16_pair[] = {DType::kInt16, DType::kInt16};
  const DType i16[] = {DType::kInt16};
  const DType pow_in[] = {DType::kInt32, DType::kFloat64};
  const DType i32[] = {DType::kInt32};
  const DType bools[] = {DType::kBool, DType::kBool};
  const DType b[] = {DType::kBool};
  const DType where_in[] = {DType::kBool, DType::kInt64, DType::kInt64};
  const DType i64[] = {DType::kInt64};
  const DType sce_in[] = {DType::kFloat32, DType::kInt32};
  const DType f32[] = {DType::kFloat32};
  const DType i8[] = {DType::kInt8};
  const DType i16_triple[] = {DType::kInt16, DType::kInt16, DType::kInt16};
  const DType f64_pair[] = {DType::kFloat64, DType::kFloat64};
  const DType f64[] = {DType::kFloat64};
  const DType u16[] = {DType::kUInt16};
  const OpSignature accepted[] = {{"Add", i16_pair, i16, none},
                                  {"Neg", i8, i8, none},
                                  {"Abs", u16, u16, none},
                                  {"PRelu", f64_pair, f64, none},
                                  {"Max", i16_triple, i16, none},
                                  {"Greater", i16_pair, b, none},
                                  {"And", bools, b, none},
                                  {"Mod", i16_pair, i16, none},
                                  {"Div", i16_pair, i16, none},
                                  {"Pow", pow_in, i32, none},
                                  {"Equal", bools, b, none},
                                  {"Where", where_in, i64, none},
                                  {"Clip", u8, u8, none},
                                  {"SoftmaxCrossEntropyLoss", sce_in, f32, none},
                                  {"NegativeLogLikelihoodLoss", sce_in, f32, none},
                                  {"GreaterOrEqual", i16_pair, b, none},
                                  {"LessOrEqual", f64_pair, b, none}};
  check_accepted_alike(*cuda, accepted);
  const OpSignature refused[] = {{"Relu", u8, u8, none},
                                 {"Neg", u8, u8, none},
                                 {"Exp", i32, i32, none},
                                 {"PRelu", pow_in, i32, none},
                                 {"Selu", i16, i16, none},
                                 {"Not", i16, i16, none},
                                 {"Greater", bools, b, none},
                                 {"LessOrEqual", bools, b, none},
                                 {"Mod", f64_pair, f64, none},
                                 {"Sigmoid", i16, i16, none},
                                 {"Add", bools, b, none},
                                 {"SoftmaxCrossEntropyLoss", i16_pair, f32, none},
                                 {"NegativeLogLikelihoodLoss", f64_pair, f32, none}};
  check_refused_alike(*cuda, refused);
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

TEST_CASE("the cuda backend runs 16-bit arithmetic, unary maths and AddGrad natively") {
#ifdef STAGECRAFT_WITH_CUDA
  // Natively on one 16-bit type (kernels that widen in registers, as run_widened would through
  // memory); widened where the CPU refuses even the float32 form's types or where the types
  // mix; refused alike where the float32 form is refused.
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  const Attrs none;
  onnx::NodeProto grad_node;
  gpu_test::set_int(grad_node, std::string(grad::kForwardInputsAttr), 2);
  const Attrs two(grad_node);
  for (const DType h : {DType::kBFloat16, DType::kFloat16}) {
    CAPTURE(dtype_name(h));
    // A gradient node's inputs: the forward's A and B, its output Y, and dY.
    const DType pair[] = {h, h}, one[] = {h}, grad_in[] = {h, h, h, h}, grad_out[] = {h, h};
    for (const OpSignature& s : {OpSignature{"Add", pair, one, none},
                                 OpSignature{"Sub", pair, one, none},
                                 OpSignature{"Mul", pair, one, none},
                                 OpSignature{"Div", pair, one, none},
                                 OpSignature{"Erf", one, one, none},
                                 OpSignature{"Relu", one, one, none},
                                 OpSignature{"Tanh", one, one, none},
                                 OpSignature{"AddGrad", grad_in, grad_out, two}}) {
      CAPTURE(s.op_type);
      CHECK(cuda->check(s).empty());
      CHECK_FALSE(cuda->runs_widened(s));
    }
    // Still widened: Clip (bounds of the input's type), Pow, the other arithmetic gradients.
    for (const OpSignature& s : {OpSignature{"Clip", one, one, none},
                                 OpSignature{"Pow", pair, one, none},
                                 OpSignature{"MulGrad", grad_in, grad_out, two}}) {
      CAPTURE(s.op_type);
      CHECK(cuda->check(s).empty());
      CHECK(cuda->runs_widened(s));
    }
  }
  // Two 16-bit types in one node, or a 16-bit float beside a float32 one: widened.
  const DType mixed[] = {DType::kBFloat16, DType::kFloat16}, with_f32[] = {DType::kBFloat16,
                                                                            DType::kFloat32};
  const DType bf[] = {DType::kBFloat16};
  CHECK(cuda->runs_widened(OpSignature{"Add", mixed, bf, none}));
  CHECK(cuda->runs_widened(OpSignature{"Add", with_f32, bf, none}));
  // A 16-bit Not or And has no float32 form the CPU takes: refused, not run natively.
  CHECK_FALSE(cuda->check(OpSignature{"Not", bf, bf, none}).empty());
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

}  // namespace
}  // namespace stagecraft::rt
