// Schedule building: the order of each kind, refusals of bad shapes, validate_schedule over a
// sweep of shapes and on hand-broken schedules, and schedule.json.
#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <string>

#include "compiler/schedule/build_schedule.h"
#include "runtime/format/error.h"

namespace stagecraft::schedule {
namespace {

/// The error `body` throws; fails the test when it throws none.
template <typename Body>
Error error_from(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected an Error");
  return Error(ErrorKind::kInternal, "unreachable");
}

/// A device's compute ops as "F0/1 B0/0 W0/0 O0": letter, stage, '/', microbatch.
std::string compute_order(const std::vector<Instruction>& program) {
  std::string text;
  for (const Instruction& in : program) {
    std::string letter;
    switch (in.op) {
      case Op::kForward:
        letter = "F";
        break;
      case Op::kBackward:
        letter = "B";
        break;
      case Op::kBackwardInput:
        letter = "B";
        break;
      case Op::kBackwardWeight:
        letter = "W";
        break;
      case Op::kOptimizerStep:
        letter = "O";
        break;
      case Op::kAllReduce:
        letter = "A";
        break;
      default:
        continue;
    }
    text += text.empty() ? "" : " ";
    text += letter + std::to_string(in.stage);
    if (in.microbatch >= 0) text += "/" + std::to_string(in.microbatch);
  }
  return text;
}

TEST_CASE("1F1B warms up with P - i - 1 forwards, then alternates") {
  Schedule schedule = build_schedule(ScheduleKind::k1F1B, {2, 1, 3, true});
  CHECK(compute_order(schedule[0]) == "F0/0 F0/1 B0/0 F0/2 B0/1 B0/2 O0");
  CHECK(compute_order(schedule[1]) == "F1/0 B1/0 F1/1 B1/1 F1/2 B1/2 O1");
}

TEST_CASE("GPipe runs every forward, then the backwards in reverse") {
  Schedule schedule = build_schedule(ScheduleKind::kGPipe, {2, 1, 3, true});
  CHECK(compute_order(schedule[1]) == "F1/0 F1/1 F1/2 B1/2 B1/1 B1/0 O1");
}

TEST_CASE("ZB-H1 defers i weight gradients on device i") {
  Schedule schedule = build_schedule(ScheduleKind::kZBH1, {3, 1, 4, true});
  CHECK(compute_order(schedule[0]) ==
        "F0/0 F0/1 F0/2 B0/0 W0/0 F0/3 B0/1 W0/1 B0/2 W0/2 B0/3 W0/3 O0");
  CHECK(compute_order(schedule[2]) ==
        "F2/0 B2/0 F2/1 B2/1 F2/2 B2/2 W2/0 F2/3 B2/3 W2/1 W2/2 W2/3 O2");
}

TEST_CASE("interleaved walks the chunks in groups of P microbatches") {
  // P=2, V=2: device 0 holds stages 0 and 2. Warm-up 2 (P-1) + (V-1) P = 4 forwards.
  Schedule schedule = build_schedule(ScheduleKind::kInterleaved, {2, 2, 4, true});
  CHECK(compute_order(schedule[0]) ==
        "F0/0 F0/1 F2/0 F2/1 F0/2 B2/0 F0/3 B2/1 F2/2 B0/0 F2/3 B0/1 B2/2 B2/3 B0/2 B0/3 O0 O2");
}

TEST_CASE("sends and receives surround the compute") {
  Schedule schedule = build_schedule(ScheduleKind::k1F1B, {2, 1, 1, true});
  std::vector<Instruction> device0 = {{Op::kForward, 0, 0},
                                      {Op::kSendAct, 0, 0, 1},
                                      {Op::kRecvGrad, 0, 0, 1},
                                      {Op::kBackward, 0, 0},
                                      {Op::kOptimizerStep, 0, -1}};
  std::vector<Instruction> device1 = {{Op::kRecvAct, 1, 0, 0},
                                      {Op::kForward, 1, 0},
                                      {Op::kBackward, 1, 0},
                                      {Op::kSendGrad, 1, 0, 0},
                                      {Op::kOptimizerStep, 1, -1}};
  CHECK(schedule[0] == device0);
  CHECK(schedule[1] == device1);
}

TEST_CASE("data parallelism adds an all-reduce per stage before the optimizer steps") {
  PipelineShape shape{2, 2, 2, true, 4};
  Schedule schedule = build_schedule(ScheduleKind::kInterleaved, shape);
  std::string order = compute_order(schedule[1]);
  CHECK(order.substr(order.size() - 11) == "A1 A3 O1 O3");
  validate_schedule(schedule, shape);
}

TEST_CASE("inference runs forwards only") {
  PipelineShape shape{3, 1, 2, false};
  Schedule schedule = build_schedule(ScheduleKind::kInference, shape);
  CHECK(compute_order(schedule[1]) == "F1/0 F1/1");
  CHECK(schedule[1].size() == 6);  // receive, forward, send per microbatch
  validate_schedule(schedule, shape);
}

TEST_CASE("every kind validates over P in {1,2,3,4,8}, M in 1..16, V in {1,2,3}") {
  int checked = 0;
  for (int devices : {1, 2, 3, 4, 8}) {
    for (int microbatches = 1; microbatches <= 16; ++microbatches) {
      for (int chunks : {1, 2, 3}) {
        for (ScheduleKind kind :
             {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
              ScheduleKind::kZBH1, ScheduleKind::kInference}) {
          bool interleaved = kind == ScheduleKind::kInterleaved;
          if (chunks != 1 && !interleaved) continue;
          if (interleaved && microbatches % devices != 0) continue;
          PipelineShape shape{devices, chunks, microbatches, kind != ScheduleKind::kInference};
          INFO(to_string(kind), " P=", devices, " V=", chunks, " M=", microbatches);
          Schedule schedule = build_schedule(kind, shape);
          CHECK_NOTHROW(validate_schedule(schedule, shape));
          ++checked;
        }
      }
    }
  }
  CHECK(checked == 4 * 5 * 16 + 3 * (16 + 8 + 5 + 4 + 2));
}

TEST_CASE("bad shapes and names are refused with the numbers") {
  Error e = error_from([] { build_schedule(ScheduleKind::kInterleaved, {4, 2, 6, true}); });
  CHECK(e.kind() == ErrorKind::kUsage);
  CHECK(
      std::string(e.what()) ==
      "schedule 'interleaved' needs the microbatches (M=6) to be a multiple of the devices (P=4)");

  e = error_from([] { parse_schedule("pipedream"); });
  CHECK(e.kind() == ErrorKind::kUsage);
  CHECK(std::string(e.what()) ==
        "unknown schedule 'pipedream'; valid: gpipe, 1f1b, interleaved, zb-h1, zb-v, dualpipev, "
        "inference, custom");

  e = error_from([] { build_schedule(ScheduleKind::k1F1B, {0, 1, 4, true}); });
  CHECK(e.kind() == ErrorKind::kUsage);
  CHECK(std::string(e.what()) == "pipeline needs at least 1 device, not 0");

  e = error_from([] { build_schedule(ScheduleKind::kGPipe, {2, 1, 0, true}); });
  CHECK(e.kind() == ErrorKind::kUsage);
  CHECK(std::string(e.what()) == "pipeline needs at least 1 microbatch, not 0");

  e = error_from([] { build_schedule(ScheduleKind::kZBH1, {2, 2, 4, true}); });
  CHECK(std::string(e.what()) ==
        "schedule 'zb-h1' runs 1 chunk per device, not 2; use 'interleaved'");

  e = error_from([] { build_schedule(ScheduleKind::kInference, {2, 1, 4, true}); });
  CHECK(e.kind() == ErrorKind::kUsage);
  e = error_from([] { build_schedule(ScheduleKind::k1F1B, {2, 1, 4, false}); });
  CHECK(std::string(e.what()) ==
        "schedule '1f1b' is for training; an inference plan uses 'inference'");
}

TEST_CASE("schedule names round-trip") {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                            ScheduleKind::kZBH1, ScheduleKind::kInference}) {
    CHECK(parse_schedule(to_string(kind)) == kind);
  }
}

/// A valid 1F1B schedule for P=2, M=2 to break by hand.
struct Broken {
  PipelineShape shape{2, 1, 2, true};
  Schedule schedule = build_schedule(ScheduleKind::k1F1B, shape);

  /// The position of `target` in `device`'s list.
  size_t find(int device, Instruction target) const {
    auto& list = schedule[device];
    return std::find(list.begin(), list.end(), target) - list.begin();
  }
  std::string error() {
    Error e = error_from([&] { validate_schedule(schedule, shape); });
    CHECK(e.kind() == ErrorKind::kPlan);
    return e.what();
  }
};

TEST_CASE("validate_schedule names the first fault") {
  Broken broken;
  SUBCASE("a receive without its send") {
    auto& list = broken.schedule[0];
    list.erase(list.begin() + broken.find(0, {Op::kSendAct, 0, 1, 1}));
    CHECK(broken.error() == "device 0: stage 0 mb 1 has no SEND_ACT");
  }
  SUBCASE("a backward before its forward") {
    auto& list = broken.schedule[1];
    std::swap(list[broken.find(1, {Op::kForward, 1, 0})],
              list[broken.find(1, {Op::kBackward, 1, 0})]);
    CHECK(broken.error() == "device 1 instruction 1 (BWD stage 1 mb 0): comes before its FWD");
  }
  SUBCASE("a forward twice") {
    broken.schedule[0].push_back({Op::kForward, 0, 1});
    CHECK(broken.error() ==
          "device 0 instruction 9 (FWD stage 0 mb 1): appears twice (first at instruction 2)");
  }
  SUBCASE("a stage on the wrong device") {
    broken.schedule[1].push_back({Op::kForward, 0, 1});
    CHECK(broken.error() == "device 1 instruction 9 (FWD stage 0 mb 1): stage 0 lives on device 0");
  }
  SUBCASE("a send to the wrong peer") {
    broken.schedule[1][broken.find(1, {Op::kSendGrad, 1, 0, 0})].peer_stage = 1;
    CHECK(
        broken.error() ==
        "device 1 instruction 3 (SEND_GRAD stage 1 mb 0 to stage 1): peer must be stage 0, not 1");
  }
  SUBCASE("a receive with no neighbour") {
    broken.schedule[0].insert(broken.schedule[0].begin(), {Op::kRecvAct, 0, 0, -1});
    CHECK(broken.error() ==
          "device 0 instruction 0 (RECV_ACT stage 0 mb 0 from stage -1): stage 0 has no neighbour "
          "there");
  }
  SUBCASE("a missing optimizer step") {
    broken.schedule[1].pop_back();
    CHECK(broken.error() == "device 1: stage 1 has no OPT_STEP");
  }
  SUBCASE("an optimizer step before the last backward") {
    auto& list = broken.schedule[0];
    std::rotate(list.begin() + 4, list.end() - 1, list.end());
    CHECK(
        broken.error() ==
        "device 0 instruction 4 (OPT_STEP stage 0): comes before the stage's last weight gradient");
  }
  SUBCASE("data parallelism without the all-reduce") {
    broken.shape.data_parallel = 2;
    CHECK(broken.error() == "device 0: stage 0 has no ALLREDUCE with 2 data-parallel replicas");
  }
  SUBCASE("a training op in an inference plan") {
    broken.shape.training = false;
    CHECK(
        broken.error() ==
        "device 0 instruction 4 (RECV_GRAD stage 0 mb 0 from stage 1): a training op in inference");
  }
  SUBCASE("a device list too few") {
    broken.schedule.pop_back();
    CHECK(broken.error() == "schedule has 1 device lists; the pipeline has 2 devices");
  }
  SUBCASE("a structurally sound schedule that deadlocks") {
    // Device 0 waits for the gradient of microbatch 0 before sending its activations.
    auto& list = broken.schedule[0];
    std::rotate(list.begin(), list.begin() + broken.find(0, {Op::kRecvGrad, 0, 0, 1}),
                list.begin() + broken.find(0, {Op::kRecvGrad, 0, 0, 1}) + 1);
    CHECK(broken.error().starts_with("schedule deadlocks: device 0 at instruction 0 (RECV_GRAD"));
  }
}

TEST_CASE("schedule.json round-trips and leaves out fields an op does not use") {
  PipelineShape shape{3, 1, 4, true, 2};
  Schedule schedule = build_schedule(ScheduleKind::kZBH1, shape);
  nlohmann::json body = to_json(schedule);
  CHECK(body["devices"].size() == 3);
  CHECK(body["devices"][1]["device"] == 1);
  CHECK(body["devices"][0]["instructions"][0] ==
        nlohmann::json({{"op", "FWD"}, {"stage", 0}, {"mb", 0}}));
  CHECK(body["devices"][0]["instructions"][1] ==
        nlohmann::json({{"op", "SEND_ACT"}, {"stage", 0}, {"mb", 0}, {"peer", 1}}));
  CHECK(body["devices"][0]["instructions"].back() ==
        nlohmann::json({{"op", "OPT_STEP"}, {"stage", 0}}));
  CHECK(schedule_from_json(body) == schedule);
  CHECK(schedule_from_json(nlohmann::json::parse(body.dump())) == schedule);
}

TEST_CASE("schedule.json errors name the field") {
  nlohmann::json body = to_json(build_schedule(ScheduleKind::k1F1B, {2, 1, 2, true}));
  body["devices"][1]["instructions"][2]["op"] = "FORWARD";
  Error e = error_from([&] { schedule_from_json(body); });
  CHECK(e.kind() == ErrorKind::kFormat);
  CHECK(std::string(e.what()) ==
        "schedule.json: field 'devices[1].instructions[2].op' is not a known op: 'FORWARD'");

  body = to_json(build_schedule(ScheduleKind::k1F1B, {2, 1, 2, true}));
  body["devices"][0]["instructions"][1].erase("peer");
  e = error_from([&] { schedule_from_json(body); });
  CHECK(std::string(e.what()) ==
        "schedule.json: field 'devices[0].instructions[1].peer' is missing");

  e = error_from([] { schedule_from_json(nlohmann::json::object()); });
  CHECK(std::string(e.what()) == "schedule.json: field 'devices' must be an array of devices");
}

}  // namespace
}  // namespace stagecraft::schedule
