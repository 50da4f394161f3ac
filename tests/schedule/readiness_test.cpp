// The format's dependency rules (runtime/format/readiness.h) and the plan's vocabulary
// (runtime/format/vocabulary.h): what an instruction waits for, the play in order that proves a
// schedule finishes, and the one name table per enum.
#include "runtime/format/readiness.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "compiler/schedule/build_schedule.h"
#include "runtime/format/error.h"
#include "runtime/format/vocabulary.h"

namespace stagecraft::schedule {
namespace {

TEST_CASE("readiness: each instruction waits for what it reads") {
  PipelineShape shape{2, 1, 2, true};
  Readiness r(shape);
  const Instruction recv{Op::kRecvAct, 1, 0, 0};
  const Instruction forward1{Op::kForward, 1, 0};
  CHECK(r.ready({Op::kForward, 0, 0}));  // the first stage reads the batch
  CHECK(!r.ready(recv));
  CHECK(r.waiting_for(recv) == "no SEND_ACT from stage 0 has run");
  CHECK(r.waiting_for(forward1) == "its RECV_ACT has not run");
  r.mark_done({Op::kForward, 0, 0});
  CHECK(r.waiting_for({Op::kSendAct, 0, 0, 1}).empty());
  r.mark_done({Op::kSendAct, 0, 0, 1});
  CHECK(r.ready(recv));
  r.mark_done(recv);
  CHECK(r.ready(forward1));
  r.mark_done(forward1);
  // The last stage's backward needs no gradient from after it; stage 0's does.
  CHECK(r.ready({Op::kBackwardInput, 1, 0}));
  CHECK(r.waiting_for({Op::kBackward, 0, 0}) == "its RECV_GRAD has not run");
  CHECK(r.waiting_for({Op::kBackwardWeight, 1, 0}) == "its BWD_INPUT has not run");
  r.mark_done({Op::kBackwardInput, 1, 0});
  CHECK(r.ready({Op::kBackwardWeight, 1, 0}));
  r.mark_done({Op::kBackwardWeight, 1, 0});
  CHECK(r.waiting_for({Op::kOptimizerStep, 1, -1}) == "1 of 2 weight gradients are done");
}

TEST_CASE("readiness: an optimizer step waits for every shared partner's exchange") {
  PipelineShape shape{2, 1, 1, true, 1, {{0, 1}}};
  Readiness r(shape);
  for (int stage : {0, 1}) r.mark_done({Op::kBackward, stage, 0});
  CHECK(r.ready({Op::kAllReduceShared, 0, -1}));
  r.mark_done({Op::kAllReduceShared, 0, -1});
  CHECK(r.waiting_for({Op::kOptimizerStep, 0, -1}) ==
        "the ALLREDUCE_SHARED of stage 1 has not run");
  r.mark_done({Op::kAllReduceShared, 1, -1});
  CHECK(r.ready({Op::kOptimizerStep, 0, -1}));
}

TEST_CASE("play runs every built schedule to the end in a valid order") {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                            ScheduleKind::kZBH1, ScheduleKind::kInference}) {
    CAPTURE(to_string(kind));
    bool training = kind != ScheduleKind::kInference;
    PipelineShape shape{3, kind == ScheduleKind::kInterleaved ? 2 : 1, 6, training};
    Schedule schedule = build_schedule(kind, shape);
    Readiness r(shape);
    size_t total = 0, played = 0;
    for (const auto& list : schedule) total += list.size();
    Readiness check(shape);
    std::vector<size_t> next = play(schedule, r, [&](int, const Instruction& in) {
      CHECK(check.ready(in));  // every instruction runs only once its inputs have
      check.mark_done(in);
      ++played;
    });
    CHECK(played == total);
    for (size_t device = 0; device < schedule.size(); ++device)
      CHECK(next[device] == schedule[device].size());
    CHECK_NOTHROW(check_finished(schedule, next, r));
  }
}

TEST_CASE("check_finished names every stuck device") {
  PipelineShape shape{2, 1, 1, false};
  // Device 1 receives before device 0 sends, and device 0 waits for nothing: only 1 is stuck
  // when device 0's list is cut short.
  Schedule schedule = {{{Op::kForward, 0, 0}}, {{Op::kRecvAct, 1, 0, 0}, {Op::kForward, 1, 0}}};
  Readiness r(shape);
  std::vector<size_t> next = play(schedule, r, [](int, const Instruction&) {});
  CHECK(next == std::vector<size_t>{1, 0});
  CHECK_THROWS_WITH_AS(check_finished(schedule, next, r),
                       "schedule deadlocks: device 1 at instruction 0 (RECV_ACT stage 1 mb 0 from "
                       "stage 0): no SEND_ACT from stage 0 has run",
                       Error);
}

TEST_CASE("vocabulary: one name per value, parsed back, bad names refused with the list") {
  for (std::string_view name : schedule_names()) CHECK(to_string(parse_schedule(name)) == name);
  for (std::string_view name : optimizer_names()) CHECK(to_string(parse_optimizer(name)) == name);
  for (std::string_view name : precision_names()) CHECK(to_string(parse_precision(name)) == name);
  for (std::string_view name : objective_names()) CHECK(to_string(parse_objective(name)) == name);
  for (std::string_view name : recompute_names()) CHECK(to_string(parse_recompute(name)) == name);
  CHECK(schedule_names().size() == 8);
  CHECK(optimizer_names().size() == 8);
  CHECK(!find_schedule("1F1B").has_value());
  CHECK(find_optimizer("adagrad") == OptimizerKind::kAdagrad);
  CHECK_THROWS_WITH_AS(parse_objective("fast"), "unknown objective 'fast'; valid: speed, memory",
                       Error);
  CHECK_THROWS_WITH_AS(parse_recompute("some"), "unknown recompute 'some'; valid: none, all, auto",
                       Error);
  try {
    parse_optimizer("lamb");
    FAIL("expected an Error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUsage);
  }
}

}  // namespace
}  // namespace stagecraft::schedule
