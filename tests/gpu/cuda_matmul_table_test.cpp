// The CUDA backend's matmul family and its gradients against the CPU backend's, without a GPU:
// every op of the CPU's matmul and grad_matmul families has a CUDA kernel with the same contract
// flag, and the CUDA backend accepts and refuses the same signatures. Also the shape rules both
// backends' kernels read their operands by (runtime/ops/matmul_shape.h): the promotion of 1-D
// operands, broadcast batch dims and the merging of batch dims that cuBLAS's strided batches
// (and oneDNN's dims) rely on.
#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/cpu/families.h"
#include "runtime/format/error.h"
#include "runtime/format/grad_ops.h"
#include "runtime/ops/matmul_shape.h"
#include "tests/gpu/table_util.h"

namespace stagecraft::rt {
namespace {

using gpu_test::check_accepted_alike;
using gpu_test::check_covers;
using gpu_test::check_refused_alike;

// A node carrying the gradient contract's forward_inputs = n.
[[maybe_unused]] onnx::NodeProto grad_node(int64_t n) {
  onnx::NodeProto node;
  onnx::AttributeProto* attr = node.add_attribute();
  attr->set_name(std::string(grad::kForwardInputsAttr));
  attr->set_type(onnx::AttributeProto::INT);
  attr->set_i(n);
  return node;
}

TEST_CASE("the cuda backend covers the cpu's matmul ops and their gradients") {
#ifdef STAGECRAFT_WITH_CUDA
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  const int ops = check_covers(*cuda, {cpu::matmul_kernels(), cpu::grad_matmul_kernels()});
  CHECK(ops == 4);  // MatMul, Gemm, MatMulGrad, GemmGrad

  const DType f = DType::kFloat32, u = DType::kUndefined, d = DType::kFloat64;
  const Attrs none;
  const onnx::NodeProto two_node = grad_node(2), three_node = grad_node(3);
  const Attrs two(two_node), three(three_node);
  const DType pair[] = {f, f}, gemm_in[] = {f, f, f}, gemm_no_c[] = {f, f, u}, one[] = {f};
  const DType doubles[] = {d, d}, mixed[] = {f, DType::kInt64}, one_d[] = {d};
  const DType grad_in[] = {f, f, f, f}, weight_only[] = {u, f};
  const DType gemm_grad_in[] = {f, f, f, f, f}, gemm_grad_out[] = {f, f, f};
  const DType five[] = {f, f, f, f, f};
  // Taken: both forward ops, a weight-gradient node naming dB alone, GemmGrad with C.
  const OpSignature accepted[] = {{"MatMul", pair, one, none},
                                  {"Gemm", gemm_in, one, none},
                                  {"Gemm", gemm_no_c, one, none},
                                  {"MatMulGrad", grad_in, weight_only, two},
                                  {"GemmGrad", gemm_grad_in, gemm_grad_out, three}};
  check_accepted_alike(*cuda, accepted);
  // Refused alike: other dtypes, and gradient nodes that break the contract's arity.
  const OpSignature refused[] = {{"MatMul", doubles, one_d, none},
                                 {"Gemm", mixed, one, none},
                                 {"MatMulGrad", grad_in, pair, none},
                                 {"MatMulGrad", five, gemm_grad_out, three},
                                 {"GemmGrad", five, gemm_grad_out, two}};
  check_refused_alike(*cuda, refused);
  // Mixed precision: MatMul and its gradient multiply bfloat16 natively on both (cuBLAS
  // CUDA_R_16BF with float32 accumulation, oneDNN bf16); Gemm and its gradient natively on the
  // CPU (oneDNN bf16 matmul) and widened to float32 on CUDA (its Gemm kernels are float32 only).
  const DType b = DType::kBFloat16;
  const DType bf_pair[] = {b, b}, bf_one[] = {b}, bf_gemm[] = {b, b, b}, bf_grad[] = {b, b, b, b};
  const DType bf_weight_only[] = {u, b}, bf_both[] = {b, b};
  const DType bf_gemm_grad[] = {b, b, b, b, b}, bf_gemm_grad_out[] = {b, b, b};
  const OpSignature bf16_native[] = {{"MatMul", bf_pair, bf_one, none},
                                     {"MatMulGrad", bf_grad, bf_weight_only, two},
                                     {"MatMulGrad", bf_grad, bf_both, two}};
  const OpSignature bf16_widened[] = {{"Gemm", bf_gemm, bf_one, none},
                                      {"GemmGrad", bf_gemm_grad, bf_gemm_grad_out, three}};
  for (const Backend* backend : {cuda, &cpu_backend()}) {
    CAPTURE(backend->name());
    for (const OpSignature& s : bf16_native) {
      CHECK(backend->check(s).empty());
      CHECK_FALSE(backend->runs_widened(s));
    }
    for (const OpSignature& s : bf16_widened) {
      CAPTURE(s.op_type);
      CHECK(backend->check(s).empty());
      CHECK(backend->runs_widened(s) == (backend == cuda));
    }
  }
  // float16 (--precision fp16): MatMul and MatMulGrad natively on CUDA (cuBLAS CUDA_R_16F),
  // widened to float32 on the CPU. Natively only with one 16-bit type throughout: a gradient
  // mixing bfloat16 and float16 (no plan writes one) runs widened.
  const DType h = DType::kFloat16;
  const DType h_pair[] = {h, h}, h_one[] = {h}, h_grad[] = {h, h, h, h}, h_both[] = {h, h};
  const DType mixed_grad[] = {b, h, b, b};
  for (const OpSignature& s : {OpSignature{"MatMul", h_pair, h_one, none},
                               OpSignature{"MatMulGrad", h_grad, h_both, two}}) {
    CAPTURE(s.op_type);
    CHECK(cuda->check(s).empty());
    CHECK_FALSE(cuda->runs_widened(s));
    CHECK(cpu_backend().check(s).empty());
    CHECK(cpu_backend().runs_widened(s));
  }
  CHECK(cuda->runs_widened(OpSignature{"MatMulGrad", mixed_grad, bf_both, two}));
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

Tensor shaped(Shape shape) {
  Tensor t;
  t.dtype = DType::kFloat32;
  t.shape = std::move(shape);
  return t;
}

TEST_CASE("matmul shapes: 1-D operands promoted, batch dims broadcast and merged") {
  // [2, 1, 3, 4, 5] x [6, 3, 5, 7]: B is padded to [1, 6, 3, 5, 7]; dim 0 repeats B, dim 1
  // repeats A and dim 2 is both's, so no two neighbours merge.
  ops::MatMulShape s = ops::matmul_shape("MatMul", shaped({2, 1, 3, 4, 5}), shaped({6, 3, 5, 7}));
  CHECK(s.m == 4);
  CHECK(s.k == 5);
  CHECK(s.n == 7);
  CHECK(s.batch == Shape{2, 6, 3});
  CHECK(s.batch_a == Shape{2, 1, 3});
  CHECK(s.batch_b == Shape{1, 6, 3});
  CHECK(s.out == Shape{2, 6, 3, 4, 7});
  CHECK(s.batch_count() == 36);

  // Neighbours broadcast alike merge, unit dims are dropped: [2, 3, 1, 4, 5] x [5, 6] is one
  // batch dim of 6 that only A has (B's weights are shared: one strided batch, stride 0).
  s = ops::matmul_shape("MatMul", shaped({2, 3, 1, 4, 5}), shaped({5, 6}));
  CHECK(s.batch == Shape{6});
  CHECK(s.batch_a == Shape{6});
  CHECK(s.batch_b == Shape{1});
  CHECK(s.out == Shape{2, 3, 1, 4, 6});

  // 1-D operands: a row on the left, a column on the right, their unit dims dropped.
  s = ops::matmul_shape("MatMul", shaped({5}), shaped({3, 5, 2}));
  CHECK(s.m == 1);
  CHECK(s.batch == Shape{3});
  CHECK(s.batch_a == Shape{1});
  CHECK(s.out == Shape{3, 2});
  s = ops::matmul_shape("MatMul", shaped({5}), shaped({5}));
  CHECK(s.out.empty());
  CHECK(s.batch.empty());
  CHECK(s.batch_count() == 1);

  CHECK_THROWS_AS(ops::matmul_shape("MatMul", shaped({2, 3}), shaped({4, 2})), Error);
  CHECK_THROWS_AS(ops::matmul_shape("MatMul", shaped({2, 4, 3}), shaped({5, 3, 2})), Error);
  CHECK_THROWS_AS(ops::matmul_shape("MatMul", shaped({}), shaped({3})), Error);
}

TEST_CASE("gemm shapes: transposes and the broadcast of C") {
  onnx::NodeProto node;
  onnx::AttributeProto* attr = node.add_attribute();
  attr->set_name("transA");
  attr->set_type(onnx::AttributeProto::INT);
  attr->set_i(1);
  const Attrs trans_a(node);
  const ops::GemmShape g = ops::gemm_shape("Gemm", shaped({5, 3}), shaped({5, 4}), trans_a);
  CHECK(g.trans_a);
  CHECK_FALSE(g.trans_b);
  CHECK(g.m == 3);
  CHECK(g.k == 5);
  CHECK(g.n == 4);
  CHECK_THROWS_AS(ops::gemm_shape("Gemm", shaped({5, 3}), shaped({5, 4}), Attrs()), Error);

  using Dims = std::pair<int64_t, int64_t>;
  CHECK(ops::gemm_c_dims("Gemm", shaped({}), 3, 4) == Dims{1, 1});
  CHECK(ops::gemm_c_dims("Gemm", shaped({4}), 3, 4) == Dims{1, 4});
  CHECK(ops::gemm_c_dims("Gemm", shaped({3, 1}), 3, 4) == Dims{3, 1});
  CHECK(ops::gemm_c_dims("Gemm", shaped({3, 4}), 3, 4) == Dims{3, 4});
  CHECK_THROWS_AS(ops::gemm_c_dims("Gemm", shaped({3}), 3, 4), Error);
  CHECK_THROWS_AS(ops::gemm_c_dims("Gemm", shaped({1, 3, 4}), 3, 4), Error);
}

}  // namespace
}  // namespace stagecraft::rt
