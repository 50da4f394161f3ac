#pragma once
/// \file
/// The fixed cost of each schedule instruction kind as the runtime runs it, measured with the
/// runtime's own code (stagec --profile stores it in the profile database's "instruction_ms";
/// the simulator charges it per instruction: cost_models/calibration.h):
/// - FWD, BWD, BWD_INPUT, BWD_WEIGHT, OPT_STEP: a run of an empty program (one Identity of one
///   float) bound by `rt::Program::from_model` on the backend, as a stage's program is run;
/// - SEND_ACT, SEND_GRAD: handing a one-tensor message to a link of the in-process transport
///   (`rt::InProcessTransport::send`) that has room;
/// - RECV_ACT, RECV_GRAD, ALLREDUCE, ALLREDUCE_SHARED: a hand-off between two threads through
///   that transport: half the round trip of a message sent to a worker thread that receives it
///   and sends it back (a push, a wake-up of the waiting thread, a pop).
/// Each is the median of many repetitions (warmed up first).

#include <map>
#include <string>
#include <string_view>

namespace stagecraft::profile {

/// Milliseconds per instruction kind (every kind of runtime/format/schedule.h, by its name),
/// measured on the backend named `backend` with `threads` threads as the file comment says.
std::map<std::string, double> measure_instruction_costs(int threads,
                                                        std::string_view backend = "cpu");

/// The median time of one run of an empty program (one Identity of one float) on `backend`,
/// milliseconds (profiler.cpp: timed as an op is).
double measure_empty_program(int threads, std::string_view backend);

}  // namespace stagecraft::profile
