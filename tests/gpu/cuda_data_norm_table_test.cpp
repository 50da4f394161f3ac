// The CUDA backend's data and norm families against the CPU backend's, without a GPU: every op
// of the CPU's data, shape, reduce and norm families and of their gradients has a CUDA kernel
// with the same contract flag, and the CUDA backend accepts and refuses the same signatures.
#include <doctest/doctest.h>

#include <span>
#include <string>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/cpu/families.h"
#include "tests/gpu/table_util.h"

namespace stagecraft::rt {
namespace {

using gpu_test::find_entry;

TEST_CASE("the cuda backend covers the cpu's data, shape, reduce and norm ops and gradients") {
#ifdef STAGECRAFT_WITH_CUDA
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  const std::span<const KernelEntry> families[] = {
      cpu::data_kernels(), cpu::shape_kernels(),     cpu::reduce_kernels(),
      cpu::norm_kernels(), cpu::grad_data_kernels(), cpu::grad_norm_kernels()};
  int ops = 0;
  for (const auto& family : families)
    for (const KernelEntry& cpu_entry : family) {
      CAPTURE(cpu_entry.op_type);
      const KernelEntry* entry = find_entry(cuda->table(), cpu_entry.op_type);
      REQUIRE(entry != nullptr);
      CHECK(entry->writes_every_output == cpu_entry.writes_every_output);
      ++ops;
    }
  CHECK(ops == 34);  // 11 data, 4 shape, 2 reduce, 2 norm, 12 + 3 gradients

  // The CPU's answers: a signature it takes, and ones it refuses.
  const Attrs none;
  const DType f32[] = {DType::kFloat32};
  const DType f64[] = {DType::kFloat64};
  const DType gather_in[] = {DType::kFloat32, DType::kInt64};
  const DType int64_pair[] = {DType::kInt64, DType::kInt64};
  const OpSignature gather{"Gather", gather_in, f32, none};
  const OpSignature converting_gather{"Gather", int64_pair, f32, none};
  const OpSignature softmax_f64{"Softmax", f64, f64, none};
  CHECK(cuda->check(gather).empty());
  CHECK_FALSE(cuda->check(converting_gather).empty());
  CHECK(cuda->check(converting_gather) == cpu_backend().check(converting_gather));
  CHECK_FALSE(cuda->check(softmax_f64).empty());
  CHECK(cuda->check(softmax_f64) == cpu_backend().check(softmax_f64));
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

}  // namespace
}  // namespace stagecraft::rt
