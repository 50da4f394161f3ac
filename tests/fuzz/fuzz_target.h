#pragma once
/// \file
/// What every fuzz target of tests/fuzz shares (issue 17). A target is one
/// `LLVMFuzzerTestOneInput` over one reader of a file we did not write. It is built twice:
/// with replay_main.cpp as a plain program that replays a corpus (the default suite, any
/// compiler), and with clang's libFuzzer (`tools/fuzz.sh`, STAGECRAFT_FUZZ=ON).
///
/// The rule a target holds a reader to: bad input ends in a stagecraft `Error` of an input kind
/// (usage, io, format, model, unsupported, shape, plan) whose message is one line. An internal error, any other exception,
/// a crash, a sanitizer report or a hang is a finding: the target aborts, so libFuzzer keeps the
/// input and the replay test fails naming it.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "runtime/format/error.h"

namespace stagecraft::fuzz {

/// Aborts with one line on stderr: `what` went wrong while reading the current input.
[[noreturn]] void finding(std::string_view what);

/// With STAGECRAFT_FUZZ_VERBOSE set, prints how each input ended ("accepted" or the refusal's
/// line): to see what a corpus exercises.
void report(const char* outcome);

/// Runs `body`; an input-caused `Error` is a pass, anything else a `finding`.
template <typename Body>
void expect_clean(Body&& body) {
  try {
    body();
    report("accepted");
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInternal) finding(std::string("internal error: ") + e.what());
    if (std::string_view(e.what()).find('\n') != std::string_view::npos)
      finding(std::string("an error of more than one line: ") + e.what());
    report(e.what());
  } catch (const std::exception& e) {
    finding(std::string("escaped exception: ") + e.what());
  } catch (...) {
    finding("escaped exception of unknown type");
  }
}

/// A folder of this process's own under the system temp dir, made on first use and removed
/// at exit; targets write each input there under a fixed name.
const std::string& scratch_dir();

/// Writes `size` bytes to `scratch_dir()/name` and returns the path.
std::string scratch_file(std::string_view name, const uint8_t* data, size_t size);

/// The folder named by environment variable `variable` (a plan or a checkpoint the target
/// edits a copy of), or a finding-free exit with a line saying how to set it.
std::string template_dir(const char* variable);

/// Copies folder `from` to `scratch_dir()/name` (replacing what was there) and returns it.
std::string fresh_copy(const std::string& from, std::string_view name);

}  // namespace stagecraft::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
