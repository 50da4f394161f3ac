#include "tests/fuzz/fuzz_target.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace stagecraft::fuzz {

namespace fs = std::filesystem;

void finding(std::string_view what) {
  std::fprintf(stderr, "fuzz finding: %.*s\n", static_cast<int>(what.size()), what.data());
  std::fflush(stderr);
  std::abort();
}

void report(const char* outcome) {
  static const bool verbose = std::getenv("STAGECRAFT_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "fuzz: %s\n", outcome);
}

namespace {

struct Scratch {
  std::string path;
  Scratch() {
    fs::path p = fs::temp_directory_path() / ("stagecraft-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(p);
    path = p.string();
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

const std::string& scratch_dir() {
  static const Scratch scratch;
  return scratch.path;
}

std::string scratch_file(std::string_view name, const uint8_t* data, size_t size) {
  std::string path = (fs::path(scratch_dir()) / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) finding("cannot write the scratch file " + path);
  return path;
}

std::string template_dir(const char* variable) {
  const char* value = std::getenv(variable);
  if (value == nullptr || !fs::is_directory(value)) {
    std::fprintf(stderr,
                 "fuzz: set %s to a folder this target copies (tools/fuzz.sh and the replay "
                 "tests make one with stagec and stagerun)\n",
                 variable);
    std::exit(2);
  }
  return value;
}

std::string fresh_copy(const std::string& from, std::string_view name) {
  fs::path to = fs::path(scratch_dir()) / name;
  std::error_code ec;
  // libFuzzer's timeout alarm (SIGALRM, every second) can interrupt the copy's system calls:
  // that is the harness's business, not a finding, so an interrupted copy is tried again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    fs::remove_all(to, ec);
    ec.clear();
    fs::copy(from, to, fs::copy_options::recursive, ec);
    if (ec != std::errc::interrupted) break;
  }
  if (ec) finding("cannot copy " + from + " to " + to.string() + ": " + ec.message());
  return to.string();
}

}  // namespace stagecraft::fuzz
