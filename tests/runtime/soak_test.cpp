// Issue 35 item 4, the soak check (label "soak", not in the default run: tools/test.sh and
// .ci/run leave it out; `ctest -L soak` runs it, a few minutes on a busy 2-core machine): the
// toy training plan trains 20,000 steps in this process, untraced as stagerun without --trace
// runs. The resident set grows by under 1% after the first 100 steps, and the median step time
// of the last 1,000 steps is within 5% of the first 1,000's (nothing per step piles up).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "tests/runtime/long_run.h"

namespace stagecraft::rt {
namespace {

TEST_CASE("20,000 steps keep resident memory and the step time flat") {
  const LongRun run = long_run(20000);
  CHECK(run.growth < 0.01);
  const std::vector<double> first(run.step_s.begin(), run.step_s.begin() + 1000),
      last(run.step_s.end() - 1000, run.step_s.end());
  const double before = median(first), after = median(last);
  MESSAGE(
      fmt::format("median step {:.4f} ms over the first 1,000 steps, {:.4f} ms over the last "
                  "1,000; resident growth {:.3f}%",
                  before * 1e3, after * 1e3, run.growth * 100));
  CHECK(std::abs(after - before) <= 0.05 * before);
}

}  // namespace
}  // namespace stagecraft::rt
