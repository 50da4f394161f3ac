// The CUDA backend runs every op the CPU backend runs (issue 13): each entry of the CPU's whole
// dispatch table, forward and gradient, has a CUDA entry with the same contract flag. Ops the CPU
// gained before their CUDA kernel was written are listed here by name, so the gap is visible
// and can only shrink: an op listed that has a CUDA kernel, or one missing that is not listed,
// fails the test.
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <string_view>

#include "runtime/core/backend.h"

namespace stagecraft::rt {
namespace {

// CPU ops without a CUDA kernel yet (a plan using one is refused on CUDA: "no cuda kernel").
// Empty: every op the CPU runs has its CUDA kernel.
const std::set<std::string_view> kCpuOnly = {};

TEST_CASE("the cuda backend has a kernel for every op of the cpu backend") {
#ifdef STAGECRAFT_WITH_CUDA
  const Backend* cuda = cuda_backend();
  REQUIRE(cuda != nullptr);
  int covered = 0;
  std::set<std::string_view> cuda_ops;
  for (const KernelEntry& e : cuda->table()) {
    CAPTURE(e.op_type);
    CHECK(cuda_ops.insert(e.op_type).second);  // one entry per op
  }
  for (const KernelEntry& cpu_entry : cpu_backend().table()) {
    CAPTURE(cpu_entry.op_type);
    const KernelEntry* entry = nullptr;
    for (const KernelEntry& e : cuda->table())
      if (e.op_type == cpu_entry.op_type) entry = &e;
    if (kCpuOnly.count(cpu_entry.op_type)) {
      CHECK_MESSAGE(entry == nullptr,
                    "listed as CPU-only but has a CUDA kernel: drop it from kCpuOnly");
      continue;
    }
    REQUIRE_MESSAGE(entry != nullptr, "no CUDA kernel (write one, or list the op in kCpuOnly)");
    CHECK(entry->writes_every_output == cpu_entry.writes_every_output);
    ++covered;
  }
  for (const KernelEntry& e : cuda->table()) {
    CAPTURE(e.op_type);
    bool on_cpu = false;
    for (const KernelEntry& c : cpu_backend().table()) on_cpu = on_cpu || c.op_type == e.op_type;
    CHECK_MESSAGE(on_cpu, "a CUDA kernel for an op the CPU backend does not run");
  }
  MESSAGE("cuda covers " << covered << " of the cpu's " << cpu_backend().table().size() << " ops");
  CHECK(covered + static_cast<int>(kCpuOnly.size()) ==
        static_cast<int>(cpu_backend().table().size()));
#else
  CHECK(cuda_backend() == nullptr);
#endif
}

}  // namespace
}  // namespace stagecraft::rt
