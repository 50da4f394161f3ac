// stagerun's stop handlers (stagerun_stop.h).
#include "tools/stagerun_stop.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iterator>

namespace stagecraft::tools {
namespace {

// A signal handler reaches only what is global: the first stop signal, and what each signal
// did before stagerun's handler (restored by the second).
std::atomic<int> first_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler's flag must be lock-free");
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};
struct sigaction previous[std::size(kStopSignals)];
bool parent_ends_job = false;  // under mpirun: the parent's SIGTERM or SIGINT ends the job

size_t slot_of(int signal_number) {
  for (size_t k = 0; k < std::size(kStopSignals); ++k)
    if (kStopSignals[k] == signal_number) return k;
  return 0;
}

extern "C" void on_stop_signal(int signal_number, siginfo_t* info, void*) {
  const bool from_launcher =
      parent_ends_job && signal_number != SIGUSR1 && info != nullptr && info->si_pid == getppid();
  int none = 0;
  if (!from_launcher && first_signal.compare_exchange_strong(none, signal_number)) return;
  // The second signal, or the launcher ending the job: what the signal did before, at once
  // (the signal is blocked in its handler: raised again, it arrives on the return).
  sigaction(signal_number, &previous[slot_of(signal_number)], nullptr);
  raise(signal_number);
}

}  // namespace

void install_stop_handlers(bool under_mpirun) {
  parent_ends_job = under_mpirun;
  for (size_t k = 0; k < std::size(kStopSignals); ++k) {
    struct sigaction action {};
    action.sa_sigaction = on_stop_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(kStopSignals[k], nullptr, &previous[k]) != 0) continue;
    // A signal the process was started ignoring stays ignored (a background job's SIGINT).
    if (!(previous[k].sa_flags & SA_SIGINFO) && previous[k].sa_handler == SIG_IGN) continue;
    sigaction(kStopSignals[k], &action, nullptr);
  }
}

int stop_requested() { return first_signal.load(std::memory_order_relaxed); }

std::string signal_name(int signal_number) {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return fmt::format("signal {}", signal_number);
  }
}

std::string stopped_line(int signal_number, int64_t step, const std::string& checkpoint_dir) {
  const std::string when =
      step > 0 ? fmt::format("after step {}", step) : std::string("before its first step");
  return fmt::format("stopped by {} {}; {}", signal_name(signal_number), when,
                     checkpoint_dir.empty()
                         ? std::string("no checkpoint (--checkpoint DIR saves one)")
                         : fmt::format("checkpoint {} holds it", checkpoint_dir));
}

}  // namespace stagecraft::tools
