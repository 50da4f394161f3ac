// The doctest main of the GPU tests: without a usable CUDA GPU it prints why and exits 77,
// which ctest reports as skipped (SKIP_RETURN_CODE), instead of passing with nothing checked.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "runtime/core/backend.h"

int main(int argc, char** argv) {
  std::string why = stagecraft::rt::cuda_unusable();
  if (!why.empty()) {
    std::printf("SKIP: needs a CUDA GPU: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
