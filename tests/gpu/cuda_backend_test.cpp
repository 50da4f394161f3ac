// The CUDA backend where there is no GPU (every machine of CI): `--backend cuda` is refused in
// one line before anything is allocated, `auto` picks the CPU and says why, and the backend
// still answers what it could run. Where a GPU is visible these check the other side.
#include <doctest/doctest.h>
#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/format/error.h"
#ifdef STAGECRAFT_WITH_CUDA
#include "runtime/cuda/attention_choice.h"
#endif

namespace stagecraft::rt {
namespace {

// Host code: which fused Attention nodes the tiled kernels take, and what stagecraft says of the
// others (attention.cpp notes it once per node on a long one).
TEST_CASE("the plain CUDA attention kernels run only where the tiles do not take the heads") {
#ifdef STAGECRAFT_WITH_CUDA
  ops::AttentionDims d;
  d.batch = 96;
  d.tq = d.tk = 1024;
  for (int64_t head : {32, 64, 128}) {
    d.d = d.dv = head;
    CHECK(cuda::tiles_take(d));
    CHECK(cuda::untiled_reason(d).empty());
  }
  d.d = d.dv = 80;
  CHECK(cuda::untiled_reason(d) ==
        "heads of 80, and the tiled kernels take heads of 32, 64 or 128");
  d.d = d.dv = 16;  // gpt_tiny's
  CHECK(cuda::untiled_reason(d).find("heads of 16") == 0);
  d.d = 64;
  d.dv = 32;
  CHECK(cuda::untiled_reason(d) ==
        "queries and keys of 64 but values of 32, and the tiled kernels take equal sizes (32, 64 "
        "or 128)");
#endif
}

// A mixed-precision plan's fused Attention reads and writes bfloat16 activations (its mask, lse
// and dlse float32): the CUDA backend takes such a node natively (attention_tiled.h), so the
// program does not widen it between Casts; any other mix of types still runs, widened.
TEST_CASE("the cuda backend runs 16-bit Attention natively and other type mixes widened") {
#ifdef STAGECRAFT_WITH_CUDA
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  constexpr DType b = DType::kBFloat16, h = DType::kFloat16, f = DType::kFloat32,
                  none = DType::kUndefined;
  struct Case {
    bool grad;
    std::vector<DType> in, out;
    bool native;
  };
  const Case cases[] = {
      {false, {b, b, b}, {b, f}, true},
      {false, {h, h, h, f}, {h, f}, true},
      {false, {b, b, b, none}, {b}, true},
      {false, {f, f, f, f}, {f, f}, true},   // float32: the float kernels
      {false, {b, h, b}, {b, f}, false},     // two 16-bit types
      {false, {b, b, b, b}, {b, f}, false},  // a 16-bit mask
      {false, {b, b, b}, {b, b}, false},     // a 16-bit lse
      // AttentionGrad, forward_inputs = 4: Q, K, V, mask, O, lse, dO, dlse -> dQ, dK, dV, dmask.
      {true, {b, b, b, f, b, f, b, f}, {b, b, b, none}, true},
      {true, {b, b, b, none, b, none, b, none}, {b, none, b, none}, true},
      {true, {b, b, b, f, b, b, b, f}, {b, b, b, none}, false},  // a 16-bit lse
      {true, {b, b, b, f, b, f, b, f}, {f, b, b, none}, false},  // a float32 dQ
  };
  for (const Case& c : cases) {
    onnx::NodeProto node;
    node.set_op_type(c.grad ? "AttentionGrad" : "Attention");
    node.set_domain("ai.stagecraft");
    if (c.grad) {
      onnx::AttributeProto* a = node.add_attribute();
      a->set_name("forward_inputs");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(4);
    }
    const Attrs attrs(node);
    const OpSignature sig{node.op_type(), c.in, c.out, attrs};
    CAPTURE(node.op_type());
    CAPTURE(c.in.size());
    CAPTURE(c.native);
    CHECK(cuda->check(sig).empty());
    CHECK(cuda->runs_widened(sig) == !c.native);
  }
#endif
}

TEST_CASE("the cuda backend is in the build and says when no GPU is visible") {
  const Backend* cuda = cuda_backend();
#ifdef STAGECRAFT_WITH_CUDA
  REQUIRE(cuda != nullptr);
  CHECK(cuda->name() == "cuda");
  std::string why = cuda->unavailable();
  std::string chosen;
  const Backend& picked = auto_backend(&chosen);
  if (why.empty()) {
    CHECK(&picked == cuda);
    CHECK(chosen == "a GPU is visible");
    CHECK(&backend_by_name("cuda") == cuda);
  } else {
    CHECK(why.find("no CUDA GPU is visible") == 0);
    CHECK(&picked == &cpu_backend());
    CHECK(chosen == why);
    CHECK_THROWS_WITH_AS(backend_by_name("cuda"),
                         ("--backend cuda: " + why + "; use --backend cpu").c_str(), Error);
    CHECK_THROWS_AS(cuda->make_device(0, 1), Error);
  }
#else
  CHECK(cuda == nullptr);
  CHECK_THROWS_WITH_AS(backend_by_name("cuda"), doctest::Contains("no CUDA backend"), Error);
#endif
  CHECK(&backend_by_name("auto") == &auto_backend());
  CHECK_THROWS_WITH_AS(backend_by_name("tpu"), "unknown backend 'tpu' (valid: auto, cpu, cuda)",
                       Error);
}

}  // namespace
}  // namespace stagecraft::rt
