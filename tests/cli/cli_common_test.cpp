// The tools' shared command-line handling (tools/cli_common.h), the "did you mean" helper
// (runtime/format/suggest.h) and the command line's case-insensitive vocabulary.
#include <doctest/doctest.h>

#include "runtime/format/error.h"
#include "runtime/format/suggest.h"
#include "runtime/format/vocabulary.h"
#include "tools/cli_common.h"

namespace {

using namespace stagecraft;

/// The usage message `app` gives for `args` (the tool name first), or "" when it parses.
std::string message_of(CLI::App& app, std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  try {
    cli::parse(app, static_cast<int>(argv.size()), argv.data());
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
    return e.what();
  }
  return "";
}

TEST_CASE("edit distance counts insertions, deletions, substitutions and swaps, ignoring case") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("memory_bandwith", "memory_bandwidth") == 1);
  CHECK(edit_distance("--devcies", "--devices") == 1);  // one swap
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("H100", "h100") == 0);
}

TEST_CASE("closest name: a likely misspelling only, the first of equals") {
  const std::vector<std::string_view> fields = {"name", "memory_bytes", "memory_bandwidth"};
  CHECK(closest_name("memory_bandwith", fields) == "memory_bandwidth");
  CHECK(closest_name("memory_byte", fields) == "memory_bytes");
  CHECK(!closest_name("efficiency", fields).has_value());  // nothing close
  CHECK(!closest_name("name", fields).has_value());        // known: nothing to suggest
  CHECK(!closest_name("x", {"y"}).has_value());            // one character of one differs
  CHECK(!closest_name("tpu", {"h100", "cpu"}).has_value());  // a name of its own, not a typo
  CHECK(closest_name("h10", {"h100", "h200"}) == "h100");
  CHECK(did_you_mean("nme", fields) == " (did you mean 'name'?)");
  CHECK(did_you_mean("zzzz", fields).empty());
}

TEST_CASE("the command line's names ignore case, plan.json's are exact") {
  CHECK(parse_schedule("1F1B") == ScheduleKind::k1F1B);
  CHECK(parse_schedule("GPipe") == ScheduleKind::kGPipe);
  CHECK(parse_schedule("ZB-H1") == ScheduleKind::kZBH1);
  CHECK(parse_objective("Speed") == Objective::kSpeed);
  CHECK(parse_optimizer("AdamW") == OptimizerKind::kAdamW);
  CHECK(parse_precision("FP32") == Precision::kFp32);
  CHECK(parse_recompute("Auto") == Recompute::kAuto);
  CHECK(!find_schedule("1F1B").has_value());
  CHECK(!find_objective("Speed").has_value());
  CHECK_THROWS_WITH_AS(parse_schedule("zbh1"),
                       "unknown schedule 'zbh1' (did you mean 'zb-h1'?); valid: gpipe, 1f1b, "
                       "interleaved, zb-h1, zb-v, dualpipev, inference, custom",
                       Error);
}

TEST_CASE("CLI11's parse errors become one-line usage errors") {
  CLI::App app{"test tool", "tool"};
  int devices = 1;
  int64_t batch = 0;
  double lr = 0;
  std::string model;
  app.add_option("MODEL", model, "model")->required();
  app.add_option("--devices", devices, "devices")->check(cli::at_least<int>(1));
  app.add_option("--batch", batch, "batch")->check(cli::at_least<int64_t>(0));
  app.add_option("--lr", lr, "learning rate");
  cli::add_version_flag(app, "tool");

  CHECK(message_of(app, {"tool", "m", "--devices", "0"}) == "--devices must be 1 or more, not 0");
  CHECK(message_of(app, {"tool", "m", "--devices", "1.5"}) ==
        "--devices must be an integer, not '1.5'");
  CHECK(message_of(app, {"tool", "m", "--devices", "3000000000"}) ==
        "--devices must be at most 2147483647, not 3000000000");
  CHECK(message_of(app, {"tool", "m", "--batch", "-1"}) == "--batch must be 0 or more, not -1");
  CHECK(message_of(app, {"tool", "m", "--batch", "-99999999999999999999"}) ==
        "--batch must be 0 or more, not -99999999999999999999");
  CHECK(message_of(app, {"tool", "m", "--lr", "x"}) == "--lr: 'x' is not a number");
  CHECK(message_of(app, {"tool", "m", "--devices"}) == "--devices needs a value");
  CHECK(message_of(app, {"tool", "m", "--devices", "2", "--devices", "3"}) ==
        "--devices is given 2 times; give it once");
  CHECK(message_of(app, {"tool"}) == "MODEL is required; see tool --help");
  CHECK(message_of(app, {"tool", "m", "n"}) == "unexpected argument 'n'; see tool --help");
  CHECK(message_of(app, {"tool", "m", "--lrr=3"}) ==
        "unknown option '--lrr' (did you mean '--lr'?); see tool --help");
  CHECK(message_of(app, {"tool", "m", "--quiet"}) == "unknown option '--quiet'; see tool --help");
  CHECK(message_of(app, {"tool", "m", "--devices", "4"}).empty());
  CHECK(devices == 4);
  CHECK(cli::version_line("tool").starts_with("tool "));
}

}  // namespace
