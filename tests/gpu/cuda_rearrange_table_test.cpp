// The CUDA backend's rearrange family against the CPU backend's, without a GPU: DepthToSpace,
// SpaceToDepth and TopK and their gradients have CUDA kernels with the same contract flags, and
// both backends accept and refuse the same signatures (the moves on every fixed-size dtype,
// TopK's four dtypes and int64 K and Indices, the gradients' float32 and arity).
#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <span>
#include <string>

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

TEST_CASE(
    "the cuda backend covers the cpu's DepthToSpace, SpaceToDepth, TopK, ArgMax, ArgMin, "
    "gradients") {
#ifdef STAGECRAFT_WITH_CUDA
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  CHECK(check_covers(*cuda, {cpu::rearrange_kernels()}) == 8);

  onnx::NodeProto plain_node;
  set_int(plain_node, "blocksize", 2);
  const Attrs plain(plain_node);
  onnx::NodeProto grad1_node, grad2_node;
  set_int(grad1_node, std::string(grad::kForwardInputsAttr), 1);
  set_int(grad2_node, std::string(grad::kForwardInputsAttr), 2);
  const Attrs grad1(grad1_node), grad2(grad2_node);

  using D = DType;
  const DType f32[] = {D::kFloat32}, f64[] = {D::kFloat64}, u8[] = {D::kUInt8};
  const DType i64[] = {D::kInt64}, str[] = {D::kString};
  const DType topk_f32[] = {D::kFloat32, D::kInt64}, topk_i32[] = {D::kInt32, D::kInt64};
  const DType topk_bool[] = {D::kBool, D::kInt64}, topk_k32[] = {D::kFloat32, D::kInt32};
  const DType out_f32[] = {D::kFloat32, D::kInt64}, out_i32[] = {D::kInt32, D::kInt64};
  const DType out_bool[] = {D::kBool, D::kInt64}, out_f32_i32[] = {D::kFloat32, D::kInt32};
  // Gradients: X [, K], Values, Indices, dValues, dIndices -> dX [, dK].
  const DType move_grad[] = {D::kFloat32, D::kFloat32, D::kFloat32};
  const DType move_grad_f64[] = {D::kFloat64, D::kFloat64, D::kFloat64};
  const DType topk_grad[] = {D::kFloat32, D::kInt64,   D::kFloat32,
                             D::kInt64,   D::kFloat32, D::kUndefined};
  const DType topk_grad_attr_k[] = {D::kFloat32, D::kFloat32, D::kInt64, D::kFloat32,
                                    D::kUndefined};
  const DType topk_grad_f64[] = {D::kFloat64, D::kInt64,   D::kFloat64,
                                 D::kInt64,   D::kFloat64, D::kUndefined};
  const DType grad_out2[] = {D::kFloat32, D::kUndefined};
  const OpSignature accepted[] = {
      {"DepthToSpace", f32, f32, plain},           {"DepthToSpace", u8, u8, plain},
      {"SpaceToDepth", i64, i64, plain},           {"TopK", topk_f32, out_f32, plain},
      {"TopK", topk_i32, out_i32, plain},          {"DepthToSpaceGrad", move_grad, f32, grad1},
      {"SpaceToDepthGrad", move_grad, f32, grad1}, {"TopKGrad", topk_grad, grad_out2, grad2},
      {"TopKGrad", topk_grad_attr_k, f32, grad1}};
  check_accepted_alike(*cuda, accepted);
  const OpSignature refused[] = {{"DepthToSpace", str, str, plain},
                                 {"SpaceToDepth", f32, f64, plain},
                                 {"TopK", topk_bool, out_bool, plain},
                                 {"TopK", topk_k32, out_f32, plain},
                                 {"TopK", topk_f32, out_f32_i32, plain},
                                 {"TopK", f64, std::span<const DType>(), plain},
                                 {"DepthToSpaceGrad", move_grad_f64, f64, grad1},
                                 {"TopKGrad", topk_grad_f64, grad_out2, grad2},
                                 {"TopKGrad", topk_grad, grad_out2, grad1}};
  check_refused_alike(*cuda, refused);
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

}  // namespace
}  // namespace stagecraft::rt
