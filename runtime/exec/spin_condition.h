#pragma once
/// \file
/// `SpinCondition`: a condition variable whose waiters first watch the guarded state for a short
/// while before they sleep. A pipeline's devices hand each other a message every few tens of
/// microseconds; a worker that sleeps on a plain condition variable is woken by the kernel, which
/// on an idle core (a halted virtual CPU above all) takes 50-200 us, a cost the plan does not count
/// and the step pays on every hand-off. A waiter that spins sees the change within a microsecond.
/// Spinning takes its core, so it is worth it only when every worker thread has a core of its own
/// (`RunOptions::spin_us`, off unless asked for), and a waiter spins by yielding its core, timed: a
/// yield that ran another thread on the core (the one it waits for, which the scheduler may have
/// woken beside it, or another process's) ends the spin and the waiter sleeps, so that the next
/// wake-up can put it on a core of its own. (Pinning each worker to a core was tried: on an idle
/// machine it ran a 2-device gpt_tiny inference step in 0.40 ms against 0.40-0.64 unpinned, but
/// with one other busy process it took 4-16 ms a step, the pinned worker waiting out the other
/// process's time slices.)

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace stagecraft::rt {

class SpinCondition {
 public:
  /// How long a waiter watches before it sleeps (0: it sleeps at once).
  void set_spin(std::chrono::microseconds spin) { spin_ = spin; }
  /// Call with the guarding mutex held, after changing the state the waiters test.
  void notify_all() {
    epoch_.fetch_add(1, std::memory_order_release);
    cv_.notify_all();
  }
  /// Until `ready()` (tested with `lock` held).
  template <typename Ready>
  void wait(std::unique_lock<std::mutex>& lock, Ready ready) {
    if (spin(lock, ready, std::chrono::steady_clock::now() + spin_)) return;
    cv_.wait(lock, ready);
  }
  /// Until `ready()` or `deadline`; returns `ready()`.
  template <typename Duration, typename Ready>
  bool wait_until(std::unique_lock<std::mutex>& lock,
                  std::chrono::time_point<std::chrono::steady_clock, Duration> deadline,
                  Ready ready) {
    auto end = std::chrono::steady_clock::now() + spin_;
    if (deadline < end)
      end = std::chrono::time_point_cast<std::chrono::steady_clock::duration>(deadline);
    if (spin(lock, ready, end)) return true;
    return cv_.wait_until(lock, deadline, ready);
  }

 private:
  /// Whether `ready()` became true while watching until `end` (`lock` is held again on return).
  template <typename Ready>
  bool spin(std::unique_lock<std::mutex>& lock, Ready& ready,
            std::chrono::steady_clock::time_point end) {
    if (ready()) return true;
    if (spin_.count() <= 0) return false;
    uint64_t seen = epoch_.load(std::memory_order_acquire);
    lock.unlock();
    while (true) {
      // A yield, not a pause, and timed: a yield that took long ran another thread on this core
      // (the thread this one waits for, which the scheduler may have woken beside it, or another
      // process). Spinning on would keep that thread from a core; sleeping lets the scheduler
      // put the two on different cores at the next wake-up.
      const auto before = std::chrono::steady_clock::now();
      std::this_thread::yield();
      const auto after = std::chrono::steady_clock::now();
      if (epoch_.load(std::memory_order_acquire) != seen) {
        lock.lock();
        if (ready()) return true;
        seen = epoch_.load(std::memory_order_acquire);
        lock.unlock();
      }
      if (after >= end || after - before > kSharedCore) break;
    }
    lock.lock();
    return ready();
  }
  /// A yield longer than this ran another thread on the core.
  static constexpr std::chrono::microseconds kSharedCore{20};

  std::condition_variable cv_;
  std::atomic<uint64_t> epoch_{0};
  std::chrono::microseconds spin_{0};
};

}  // namespace stagecraft::rt
