// The fuzz targets without libFuzzer: `fuzz-T PATH...` runs the target once on every file
// under each PATH (a corpus folder or one file), in name order, and fails naming the input
// that crashed, aborted or took longer than the hang limit. With no input at all it fails too:
// a replay that replays nothing proves nothing.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

namespace {

namespace fs = std::filesystem;

constexpr double kHangSeconds = 10.0;  // what libFuzzer's -timeout=10 calls a hang
char current_input[4096] = "";

void on_fatal_signal(int signal_number) {
  const char* head = "fuzz replay: crashed on input ";
  ssize_t ignored = ::write(STDERR_FILENO, head, std::strlen(head));
  ignored = ::write(STDERR_FILENO, current_input, std::strlen(current_input));
  ignored = ::write(STDERR_FILENO, "\n", 1);
  (void)ignored;
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

std::vector<fs::path> inputs_under(const fs::path& path) {
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& entry : fs::recursive_directory_iterator(path))
      if (entry.is_regular_file()) files.push_back(entry.path());
  } else if (fs::is_regular_file(path)) {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  for (int s : {SIGABRT, SIGSEGV, SIGFPE, SIGBUS, SIGILL}) ::signal(s, on_fatal_signal);
  int replayed = 0;
  double slowest = 0;
  std::string slowest_name;
  for (int i = 1; i < argc; ++i) {
    if (!fs::exists(argv[i])) {
      std::fprintf(stderr, "fuzz replay: %s does not exist\n", argv[i]);
      return 1;
    }
    for (const fs::path& file : inputs_under(argv[i])) {
      std::ifstream in(file, std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
      std::snprintf(current_input, sizeof current_input, "%s", file.c_str());
      auto start = std::chrono::steady_clock::now();
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (seconds > kHangSeconds) {
        std::fprintf(stderr, "fuzz replay: %s took %.1f s (hang limit %.0f s)\n", file.c_str(),
                     seconds, kHangSeconds);
        return 1;
      }
      if (seconds > slowest) {
        slowest = seconds;
        slowest_name = file.string();
      }
      ++replayed;
    }
  }
  if (replayed == 0) {
    std::fprintf(stderr, "fuzz replay: no inputs found under the paths given\n");
    return 1;
  }
  std::printf("fuzz replay: %d inputs, no finding (slowest %.3f s: %s)\n", replayed, slowest,
              slowest_name.c_str());
  return 0;
}
