// Import holds the weights once. Writes a GPT-style model with ~90 MiB of inline weights
// (with the project's own sample builder, in a child process), then runs `stagec --info` on it
// in another child and reads that child's peak resident memory from wait4(). Two copies of the
// weights would need at least twice the file size.
// Issue 28: a model whose external data is larger than the memory stagec may use (RLIMIT_DATA)
// is planned and written, its stage files referencing the model's data file.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

extern char** environ;

namespace {

struct ChildResult {
  int exit_code = -1;
  long peak_rss_kib = 0;
};

/// Runs argv[0] with stdout to /dev/null and, when `data_limit` > 0, at most that many bytes of
/// data memory (RLIMIT_DATA: heap and private writable maps, not the file maps it reads).
ChildResult run_child(std::vector<std::string> argv, rlim_t data_limit = 0) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = ::fork();
  REQUIRE_MESSAGE(pid >= 0, "cannot fork for " << argv[0]);
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, 1);
    if (data_limit > 0) {
      struct rlimit limit {data_limit, data_limit};
      ::setrlimit(RLIMIT_DATA, &limit);
    }
    ::execve(args[0], args.data(), environ);
    ::_exit(127);
  }
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

TEST_CASE("stagec plans and writes a model whose weights exceed the memory it may use") {
  stagecraft::testing::TempDir dir;
  std::string model = dir.file("gpt.onnx");
  // ~340 MB of weights in a sparse external data file (no bytes written).
  auto made = run_child({STAGECRAFT_MAKE_SAMPLES, "gpt", "-o", model, "--no-weight-bytes", "--layers",
                         "4", "--width", "1024", "--heads", "16", "--vocab", "32000", "--seq", "64"});
  REQUIRE(made.exit_code == 0);
  int64_t data_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    if (e.path().extension() == ".data") data_bytes += static_cast<int64_t>(e.file_size());
  REQUIRE(data_bytes > (int64_t{300} << 20));
  const rlim_t limit = static_cast<rlim_t>(data_bytes / 2);
  auto planned = run_child({STAGECRAFT_STAGEC, model, "-o", dir.file("plan"), "--devices", "2",
                            "--train", "--loss", "cross-entropy", "--batch", "2", "--dim", "seq=64",
                            "--precision", "mixed"},
                           limit);
  MESSAGE("weights " << data_bytes / (1 << 20) << " MiB, data limit " << limit / (1 << 20)
                     << " MiB, stagec peak RSS " << planned.peak_rss_kib / 1024 << " MiB");
  REQUIRE(planned.exit_code == 0);
  CHECK(planned.peak_rss_kib * 1024 < data_bytes / 2);
  // The plan directory holds graphs, not weights: its own files are a small part of them.
  int64_t plan_bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.file("plan")))
    if (!e.is_symlink() && e.is_regular_file()) plan_bytes += static_cast<int64_t>(e.file_size());
  CHECK(plan_bytes < data_bytes / 20);
  onnx::ModelProto stage;
  std::ifstream in(dir.file("plan/stage_1.onnx"), std::ios::binary);
  REQUIRE(stage.ParseFromIstream(&in));
  int referenced = 0;
  for (const onnx::TensorProto& t : stage.graph().initializer())
    for (const auto& e : t.external_data())
      if (e.key() == "location" && e.value().rfind("model_weights/", 0) == 0) ++referenced;
  CHECK(referenced > 0);
}

}  // namespace
