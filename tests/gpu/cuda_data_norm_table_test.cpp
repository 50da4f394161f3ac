// The CUDA backend's data and norm families against the CPU backend's, without a GPU: every op
// of the CPU's data, shape_ops and norm families and of their gradients has a CUDA kernel
// with the same contract flag, and the CUDA backend accepts and refuses the same signatures.
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

TEST_CASE("the cuda backend covers the cpu's data, shape and norm ops and gradients") {
#ifdef STAGECRAFT_WITH_CUDA
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  const int ops = check_covers(
      *cuda, {cpu::data_kernels(), cpu::shape_ops_kernels(), cpu::norm_kernels(),
              cpu::grad_data_kernels(), cpu::grad_norm_kernels()});
  CHECK(ops ==
        37);  // 12 data (Trilu too), 4 shape, 4 norm (Softmax, LogSoftmax too), 13 + 4 gradients

  // The CPU's answers: a signature it takes, and ones it refuses.
  const Attrs none;
  const DType f32[] = {DType::kFloat32};
  const DType f64[] = {DType::kFloat64};
  const DType gather_in[] = {DType::kFloat32, DType::kInt64};
  const DType int64_pair[] = {DType::kInt64, DType::kInt64};
  const OpSignature accepted[] = {{"Gather", gather_in, f32, none}};
  check_accepted_alike(*cuda, accepted);
  const OpSignature refused[] = {{"Gather", int64_pair, f32, none}, {"Softmax", f64, f64, none}};
  check_refused_alike(*cuda, refused);
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

TEST_CASE("the cuda backend moves 16-bit gradients natively: shape-only ops, Transpose, Split") {
#ifdef STAGECRAFT_WITH_CUDA
  // Pure moves of dY: every element's bits whatever its type, so no widening casts.
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  onnx::NodeProto one_input, two_inputs;
  gpu_test::set_int(one_input, std::string(grad::kForwardInputsAttr), 1);
  gpu_test::set_int(two_inputs, std::string(grad::kForwardInputsAttr), 2);
  const Attrs one(one_input), two(two_inputs);
  for (const DType h : {DType::kBFloat16, DType::kFloat16}) {
    CAPTURE(dtype_name(h));
    const DType x_y_dy[] = {h, h, h}, dx[] = {h};
    const DType split_in[] = {h, h, h, h, h}, split_out[] = {h};  // X, Y0, Y1, dY0, dY1
    for (const OpSignature& s : {OpSignature{"TransposeGrad", x_y_dy, dx, one},
                                 OpSignature{"IdentityGrad", x_y_dy, dx, one},
                                 OpSignature{"SplitGrad", split_in, split_out, one}}) {
      CAPTURE(s.op_type);
      CHECK(cuda->check(s).empty());
      CHECK_FALSE(cuda->runs_widened(s));
      CHECK(cpu_backend().runs_widened(s));
    }
    // Gather's gradient adds rows: widened.
    const DType gather_in[] = {h, DType::kInt64, h, h}, gather_out[] = {h, DType::kUndefined};
    CHECK(cuda->runs_widened(OpSignature{"GatherGrad", gather_in, gather_out, two}));
  }
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

}  // namespace
}  // namespace stagecraft::rt
