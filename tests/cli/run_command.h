#pragma once
/// \file
/// Running a command-line tool from a test.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "tests/test_util.h"

namespace stagecraft::testing {

/// Runs `command` (a shell line), its stdout and stderr into files in `dir`; returns stdout.
/// Fails the test on a non-zero exit, with the command and its stderr.
inline std::string run_command(const TempDir& dir, const std::string& command) {
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  int status = std::system(fmt::format("{} >{} 2>{}", command, out, err).c_str());
  INFO(command);
  INFO(read_bytes(err));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return read_bytes(out);
}

}  // namespace stagecraft::testing
