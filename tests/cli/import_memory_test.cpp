// Import holds the weights once. Writes a GPT-style model with ~90 MiB of inline weights
// (with the project's own sample builder, in a child process), then runs `stagec --info` on it
// in another child and reads that child's peak resident memory from wait4(). Two copies of the
// weights would need at least twice the file size.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_util.h"

extern char** environ;

namespace {

struct ChildResult {
  int exit_code = -1;
  long peak_rss_kib = 0;
};

ChildResult run_child(std::vector<std::string> argv) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE_MESSAGE(rc == 0, "cannot start " << argv[0]);
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, usage.ru_maxrss};
}

TEST_CASE("stagec --info holds a model's weights in memory once") {
  stagecraft::testing::TempDir dir;
  std::string model = dir.file("gpt.onnx");
  auto made = run_child({STAGECRAFT_MAKE_SAMPLES, "gpt", "-o", model, "--layers", "4", "--width", "512",
                         "--heads", "8", "--vocab", "8192", "--seq", "64"});
  REQUIRE(made.exit_code == 0);
  auto file_kib = static_cast<long>(std::filesystem::file_size(model) / 1024);
  REQUIRE(file_kib > 64 * 1024);

  auto info = run_child({STAGECRAFT_STAGEC, "--info", model, "--batch", "2", "--dim", "seq=64"});
  REQUIRE(info.exit_code == 0);
  MESSAGE("model file " << file_kib / 1024 << " MiB, stagec --info peak RSS " << info.peak_rss_kib / 1024
                        << " MiB");
  // One copy plus the program itself (ONNX's schema registry, protobuf, libraries: ~20 MiB).
  CHECK(info.peak_rss_kib < file_kib + file_kib / 4 + 48 * 1024);
}

}  // namespace
