#pragma once
/// \file
/// stagerun's preemption: SIGTERM, SIGINT or SIGUSR1 asks a run to stop after the step in
/// flight. The handlers only record the first signal (an atomic: async-signal-safe); the run
/// polls it at every step barrier (rt::RunOptions::stop_requested), under mpirun every rank
/// agrees there on the last step (rt::StepFlags), the run saves its checkpoint (--checkpoint),
/// and stagerun says so in one line and exits with `kStoppedExitCode`. A second signal stops the
/// process at once: the signal's disposition from before stagerun's (under mpirun, the
/// runtime/mpi/world.h line saying where the rank was) is restored and the signal raised again.
/// Under mpirun a SIGTERM or SIGINT sent by the rank's parent (mpirun, or its daemon on another
/// machine, ending the job because a rank died or mpirun itself was signalled) also stops at
/// once; a stop for the whole job is SIGUSR1 to mpirun, which forwards it to every rank, or any
/// of the three signals to one rank.

#include <cstdint>
#include <string>

namespace stagecraft::tools {

/// The exit status of a run stopped by a signal after a whole step (sysexits.h's EX_TEMPFAIL:
/// resuming from the checkpoint goes on). docs/cli.md lists it with the other exit codes.
inline constexpr int kStoppedExitCode = 75;

/// Installs the handlers of SIGTERM, SIGINT and SIGUSR1 (not of one this process was started
/// ignoring, e.g. SIGINT of a background job). `under_mpirun`: a SIGTERM or SIGINT from the
/// parent process stops at once (see the file comment).
void install_stop_handlers(bool under_mpirun);

/// The first stop signal's number, 0 while none came (rt::RunOptions::stop_requested).
int stop_requested();

/// "SIGTERM", "SIGINT", "SIGUSR1", else "signal N".
std::string signal_name(int signal_number);

/// The line a stopped run prints (after "stagerun: "): `stopped by SIGTERM after step 1234;
/// checkpoint ckpt holds it`, or without a checkpoint `...; no checkpoint (--checkpoint DIR
/// saves one)`; `step` 0: before its first step.
std::string stopped_line(int signal_number, int64_t step, const std::string& checkpoint_dir);

}  // namespace stagecraft::tools
