// The doctest main of every test program, with one rule doctest lacks: a run asked for named
// test cases (ctest runs each case as `--test-case=NAME`) that matches none fails. A case whose
// name CMake cannot pass through (a ';' splits the name) otherwise "passes" running nothing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string_view>

namespace {

unsigned matched_cases = 0;

/// Counts the test cases the filters let through; reports nothing else.
struct MatchCounter : doctest::IReporter {
  explicit MatchCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    matched_cases = stats.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("match_counter", 1, MatchCounter);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;
  bool named = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    named |= arg.starts_with("--test-case=") || arg.starts_with("-tc=");
  }
  if (result == 0 && named && matched_cases == 0) {
    std::fprintf(stderr, "no test case matches the --test-case filter: nothing ran\n");
    return 1;
  }
  return result;
}
