// The fused Gelu's CUDA kernels (runtime/cuda/activations.cpp, elementwise_kernels.cu,
// grad_eltwise_kernels.cu) against the double-precision reference the CPU's are checked
// against (tests/runtime/gelu_util.h).
#include <doctest/doctest.h>

#include "runtime/core/backend.h"
#include "tests/runtime/gelu_util.h"

namespace stagecraft::testing {
namespace {

TEST_CASE("cuda Gelu and GeluGrad against a double-precision reference") {
  const rt::Backend* cuda = rt::cuda_backend();
  REQUIRE(cuda != nullptr);
  gelu::check_kernels(*cuda);
}

}  // namespace
}  // namespace stagecraft::testing
