// stagecraft-gpu-probe COMMAND...: runs COMMAND where the CUDA backend can run, else prints
// why not and exits 77, which ctest reports as a skipped test (SKIP_RETURN_CODE). The `gpu`
// tests go through it, so a machine without a GPU skips them cleanly, saying so.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "runtime/core/backend.h"

int main(int argc, char** argv) {
  std::string why = stagecraft::rt::cuda_unusable();
  if (!why.empty()) {
    std::printf("SKIP: needs a CUDA GPU: %s\n", why.c_str());
    return 77;
  }
  if (argc < 2) return 0;
  execvp(argv[1], argv + 1);
  std::perror(argv[1]);
  return 127;
}
