#pragma once
/// \file
/// Schedules in torch.distributed.pipelining's action-list CSV, both ways: a torch user can run
/// a stagecraft schedule in torch (`stagedump PLAN --torch-csv FILE`), and a schedule written for
/// torch plans and runs here (`stagec --schedule-csv FILE`).
///
/// The format (torch's `_dump_csv` / `_load_csv`): one row per pipeline rank, in rank order;
/// each cell one action `{stage}{type}{microbatch}`, such as `0F1` (stage 0's forward of
/// microbatch 1), `1B0` (full backward), `1I0` (input gradient, our BWD_INPUT), `0W2` (weight
/// gradient, our BWD_WEIGHT); an empty cell is an idle slot. The "compute_comms" form adds the
/// transfers: `{s}SEND_F{m}`, `{s}RECV_F{m}`, `{s}SEND_B{m}`, `{s}RECV_B{m}`, and
/// `{s}REDUCE_GRAD` for the data-parallel gradient sum.
///
/// Reading: the compute actions give each device's order; stagecraft places the transfers
/// itself as its builders do (a receive right before the compute that needs it, a send right
/// after), so the transfer actions of a compute_comms file are checked and then left to that
/// rule, as are FSDP's UNSHARD and RESHARD and REDUCE_GRAD. An overlapped pair
/// (`(a;b)OVERLAP_F_B`, DualPipeV's) runs its actions one after the other. Stage s must sit on
/// rank s mod P (torch's looped placement: every built-in schedule but the V-shaped ones).

#include <string>
#include <string_view>

#include "compiler/schedule/build_schedule.h"
#include "runtime/format/schedule.h"

namespace stagecraft::schedule {

/// Which actions a written CSV holds.
enum class TorchCsvForm {
  kComputeOnly,   ///< "compute_only": F, B, I, W (what torch's PipelineScheduleMulti loads).
  kComputeComms,  ///< "compute_comms": and the transfers (torch's _PipelineScheduleRuntime).
};

/// `schedule` as torch's CSV, rows ending in "\r\n" as Python's csv module writes them. The
/// optimizer steps and the shared weights' exchanges, which torch runs outside its schedule,
/// are left out; ALLREDUCE is REDUCE_GRAD in the compute_comms form.
std::string to_torch_csv(const Schedule& schedule, TorchCsvForm form);

/// What a torch CSV says: each device's compute order and the shape it implies.
struct TorchCsvSchedule {
  ComputeOrder order;
  int devices = 0;       ///< P: one per row.
  int chunks = 0;        ///< V: the stages (highest stage + 1) over P.
  int microbatches = 0;  ///< M: the highest microbatch + 1.
  bool training = false;  ///< Any backward action.
};

/// Reads torch's CSV `text` (either form); `source` names it in errors. Throws
/// `Error(kFormat)` in one line naming the source, the row and the cell for an action torch's
/// grammar does not have, a stage on another rank than stage mod P, numbers out of range, or no
/// action at all. The order itself (every microbatch's F before its B before its W, no
/// deadlock) is checked by validate_schedule on the lowered schedule (check_torch_csv).
TorchCsvSchedule read_torch_csv(std::string_view text, const std::string& source);

/// read_torch_csv of the file at `path`: `Error(kIo)` naming it when it cannot be read, is not a
/// regular file or is over 64 MiB.
TorchCsvSchedule read_torch_csv_file(const std::string& path);

/// The schedule `csv` runs on `shape` (schedule_from_order), validated (validate_schedule):
/// throws `Error(kUsage)` when the shape's devices, chunks, microbatches or training disagree
/// with the file's, and the validator's error with `source` in front when the order cannot run.
Schedule check_torch_csv(const TorchCsvSchedule& csv, const PipelineShape& shape,
                         const std::string& source);

}  // namespace stagecraft::schedule
