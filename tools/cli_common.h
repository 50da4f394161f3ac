#pragma once
/// \file
/// What the command-line tools (stagec, stagedump, stagerun, stagecraft-lm-data) share about
/// their command lines: --version, and CLI11's parse errors turned into the project's one-line
/// usage errors ("stagec: usage error: --devices must be 1 or more, not 0", exit 2) instead of
/// CLI11's own text and exit codes 105-114.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace stagecraft::cli {

/// "stagec 0.1.0": the tool's name and the project's version (CMake's PROJECT_VERSION).
std::string version_line(std::string_view tool);

/// Adds --version to `app`: it prints `version_line(tool)` on stdout and exits 0.
void add_version_flag(CLI::App& app, std::string_view tool);

/// Parses the command line. --help and --version print and return their exit code (0); any
/// other CLI11 parse error is thrown as `Error(kUsage)` in one line, for `run_main` to print.
/// Returns nullopt when the tool should go on.
std::optional<int> parse(CLI::App& app, int argc, char** argv);

/// The one-line message for a CLI11 parse error of `app` (which has just failed to parse):
/// "--devices needs a value", "unknown option '--devcies' (did you mean '--devices'?)",
/// "--lr: 'abc' is not a number". Exposed for tests.
std::string usage_message(const CLI::App& app, const CLI::ParseError& error);

/// A check that a value is an integer in [min, max]: "must be 1 or more, not 0", "must be an
/// integer, not 'abc'". CLI11 runs it on the text before converting it, so it also words what
/// would otherwise be a conversion error; `max` is the option's type's largest value.
CLI::Validator integer_in(int64_t min, int64_t max = std::numeric_limits<int64_t>::max());

/// `integer_in(min, largest T)`: for an option stored in a T.
template <typename T>
CLI::Validator at_least(int64_t min) {
  return integer_in(min, static_cast<int64_t>(std::numeric_limits<T>::max()));
}

}  // namespace stagecraft::cli
