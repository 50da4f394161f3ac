// The CUDA backend where there is no GPU (every machine of CI): `--backend cuda` is refused in
// one line before anything is allocated, `auto` picks the CPU and says why, and the backend
// still answers what it could run. Where a GPU is visible these check the other side.
#include <doctest/doctest.h>

#include <string>

#include "runtime/core/backend.h"
#include "runtime/format/error.h"

namespace stagecraft::rt {
namespace {

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
