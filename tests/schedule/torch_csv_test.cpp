// Schedules in torch.distributed.pipelining's CSV (compiler/schedule/torch_csv.h): every built-in
// schedule written and read back gives the identical instruction list, in both of torch's forms;
// what torch writes for its own schedules reads; bad files are refused in one line naming the
// row and the cell; orders that cannot run are refused by the validator.
#include <doctest/doctest.h>

#include <string>

#include "compiler/schedule/build_schedule.h"
#include "compiler/schedule/torch_csv.h"
#include "runtime/format/error.h"

namespace stagecraft::schedule {
namespace {

std::string refusal(const std::string& text, const PipelineShape* shape = nullptr) {
  try {
    TorchCsvSchedule csv = read_torch_csv(text, "s.csv");
    if (shape) check_torch_csv(csv, *shape, "s.csv");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
    return e.what();
  }
  FAIL("expected a refusal of: " << text);
  return "";
}

TEST_CASE("torch CSV: every built-in schedule round-trips to the identical instruction list") {
  struct Case {
    ScheduleKind kind;
    PipelineShape shape;
  };
  const std::vector<Case> cases = {
      {ScheduleKind::kGPipe, {2, 1, 4, true}},
      {ScheduleKind::k1F1B, {4, 1, 8, true}},
      {ScheduleKind::k1F1B, {3, 1, 2, true}},
      {ScheduleKind::kZBH1, {4, 1, 6, true}},
      {ScheduleKind::kInterleaved, {2, 2, 4, true}},
      {ScheduleKind::kInterleaved, {4, 3, 8, true}},
      {ScheduleKind::kInference, {3, 1, 5, false}},
      {ScheduleKind::k1F1B, {2, 1, 4, true, 2}},  // data-parallel: an ALLREDUCE per stage
      {ScheduleKind::kGPipe, {3, 1, 3, true, 1, {{0, 2}}}},  // a weight stages 0 and 2 share
  };
  for (const Case& c : cases) {
    CAPTURE(to_string(c.kind));
    CAPTURE(c.shape.devices);
    CAPTURE(c.shape.chunks);
    CAPTURE(c.shape.microbatches);
    const Schedule built = build_schedule(c.kind, c.shape);
    for (TorchCsvForm form : {TorchCsvForm::kComputeOnly, TorchCsvForm::kComputeComms}) {
      const std::string text = to_torch_csv(built, form);
      const TorchCsvSchedule csv = read_torch_csv(text, "round.csv");
      CHECK(csv.devices == c.shape.devices);
      CHECK(csv.chunks == c.shape.chunks);
      CHECK(csv.microbatches == c.shape.microbatches);
      CHECK(csv.training == c.shape.training);
      CHECK(check_torch_csv(csv, c.shape, "round.csv") == built);
    }
  }
}

TEST_CASE("torch CSV: the written rows are torch's action strings") {
  const Schedule built = build_schedule(ScheduleKind::kZBH1, {2, 1, 2, true});
  // Device 0 warms up with one forward; device 1's W lags its B by one microbatch.
  CHECK(to_torch_csv(built, TorchCsvForm::kComputeOnly) ==
        "0F0,0F1,0I0,0W0,0I1,0W1\r\n"
        "1F0,1I0,1F1,1I1,1W0,1W1\r\n");
  CHECK(to_torch_csv(built, TorchCsvForm::kComputeComms) ==
        "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0I0,0W0,0RECV_B1,0I1,0W1\r\n"
        "1RECV_F0,1F0,1I0,1SEND_B0,1RECV_F1,1F1,1I1,1SEND_B1,1W0,1W1\r\n");
}

TEST_CASE("torch CSV: a schedule as torch writes it reads, idle slots and all") {
  // Torch's 1F1B for 2 ranks and 2 microbatches with full backwards, padded with empty cells
  // (idle steps), quoted and with LF line ends, plus FSDP's UNSHARD and RESHARD.
  const std::string text = "0UNSHARD,0F0,0F1,,0B0,0B1,0RESHARD\n\"1F0\",1B0,1F1,1B1\n\n";
  const TorchCsvSchedule csv = read_torch_csv(text, "torch.csv");
  CHECK(csv.devices == 2);
  CHECK(csv.chunks == 1);
  CHECK(csv.microbatches == 2);
  CHECK(csv.training);
  REQUIRE(csv.order.size() == 2);
  CHECK(csv.order[0].size() == 4);
  CHECK(csv.order[1].size() == 4);
  const Schedule s = check_torch_csv(csv, {2, 1, 2, true}, "torch.csv");
  CHECK(s == build_schedule(ScheduleKind::k1F1B, {2, 1, 2, true}));  // 1F1B's order, exactly
  // DualPipeV's overlapped pair runs its two actions in order.
  const TorchCsvSchedule overlapped =
      read_torch_csv("0F0,0F1,(0B0;0B1)OVERLAP_F_B\n1F0,1B0,1F1,1B1\n", "o.csv");
  REQUIRE(overlapped.order[0].size() == 4);
  CHECK(overlapped.order[0][3] == Instruction{Op::kBackward, 0, 1});
}

TEST_CASE("torch CSV: bad files are refused in one line naming the row and the cell") {
  CHECK(refusal("").find("s.csv: no action") == 0);
  CHECK(refusal("0F0,0X1\n").find("s.csv: row 1 (rank 0), cell 2 '0X1': unknown action type") ==
        0);
  CHECK(refusal("F0\n").find("cell 1 'F0': an action is [stage][type][microbatch]") !=
        std::string::npos);
  CHECK(refusal("0F\n").find("a F action names its microbatch") != std::string::npos);
  CHECK(refusal("0F0x\n").find("unexpected characters") != std::string::npos);
  CHECK(refusal("0REDUCE_GRAD1\n").find("names no microbatch") != std::string::npos);
  CHECK(refusal("99999F0\n").find("stage 99999 is past the 4096 supported") != std::string::npos);
  CHECK(refusal("0F0,1F0\n1F0\n").find("stage 1 is already on rank 0") != std::string::npos);
  CHECK(refusal("0F0\n0F1\n").find("stage 0 is already on rank 0") != std::string::npos);
  // Three stages over two ranks; a V-shaped placement (stage 3 on rank 0 of 2 ranks).
  CHECK(refusal("0F0,2F0\n1F0\n").find("the stage count 3 must be a multiple of the ranks") !=
        std::string::npos);
  CHECK(refusal("0F0,3F0\n1F0,2F0\n").find("row 1 (rank 0) runs stage 3, which stagecraft "
                                           "places on rank 1") != std::string::npos);
  CHECK(refusal("(0F0;0B0\n").find("must close") != std::string::npos);
  // Found by the fuzzer: a lone action naming stage 2811 and microbatch 555551 made the
  // validator size its tables for 1.6 billion (stage, microbatch) pairs.
  CHECK(refusal("2811B555551").find("0 forward actions for 2812 stages x 555552 microbatches") !=
        std::string::npos);
}

TEST_CASE("torch CSV: an order that cannot run, or another shape, is refused") {
  const PipelineShape two{2, 1, 2, true};
  // A backward before its forward.
  CHECK(refusal("0B0,0F0,0F1,0B1\n1F0,1B0,1F1,1B1\n", &two).find("s.csv") == 0);
  // A microbatch without its backward.
  CHECK(!refusal("0F0,0F1,0B1\n1F0,1B0,1F1,1B1\n", &two).empty());
  // Deadlock: rank 0 waits for microbatch 0's gradient before it sends microbatch 1's
  // activations, which rank 1 waits for before it runs microbatch 0.
  CHECK(!refusal("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n", &two).empty());
  // The shape the plan asks for differs from the file's.
  const PipelineShape four{2, 1, 4, true};
  CHECK(refusal("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", &four)
            .find("the schedule has 2 microbatches but the plan has 4 (--microbatches)") !=
        std::string::npos);
  const PipelineShape inference{2, 1, 2, false};
  CHECK(refusal("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", &inference)
            .find("the schedule has backward actions but the plan is for inference") !=
        std::string::npos);
}

}  // namespace
}  // namespace stagecraft::schedule
