// Issue 35 items 4 and 6: a run stopped by a signal finishes the step in flight, saves its
// checkpoint and says so (exit status 75), and resuming gives the losses of an uninterrupted run
// bit for bit; a run keeps its per-instruction events only for the traced steps, so its memory
// stays flat over a long run (the soak case, label "soak", trains 20,000 steps).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "tests/runtime/long_run.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

struct Finished {
  int code = -1;   ///< Exit status, -1 when killed by a signal.
  int signal = 0;  ///< The signal that killed it.
  std::string out, err;
};

// stagerun started with `args` (a shell-quoted string), stdout and stderr into files of `dir`.
struct Started {
  pid_t pid;
  std::string out, err;
};

Started start_stagerun(const testing::TempDir& dir, const std::string& args, const char* name) {
  Started s{0, dir.file(fmt::format("{}.out", name)), dir.file(fmt::format("{}.err", name))};
  const std::string line =
      fmt::format("exec {} {} >{} 2>{}", STAGECRAFT_STAGERUN, args, s.out, s.err);
  s.pid = fork();
  REQUIRE(s.pid >= 0);
  if (s.pid == 0) {
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return s;
}

Finished wait_for(const Started& s) {
  int status = 0;
  REQUIRE(waitpid(s.pid, &status, 0) == s.pid);
  Finished f;
  if (WIFEXITED(status)) f.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) f.signal = WTERMSIG(status);
  f.out = testing::read_bytes(s.out);
  f.err = testing::read_bytes(s.err);
  return f;
}

// Waits (up to 60 s) until `file` holds `text`.
bool wait_for_text(const std::string& file, const std::string& text) {
  for (int k = 0; k < 6000; ++k) {
    std::ifstream in(file);
    std::stringstream all;
    all << in.rdbuf();
    if (all.str().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The records of `stagerun --json` output (JSON Lines).
std::vector<nlohmann::json> records(const std::string& out) {
  std::vector<nlohmann::json> all;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) all.push_back(nlohmann::json::parse(line));
  return all;
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> all;
  for (const nlohmann::json& r : records(out))
    if (r["type"] == "step") all.push_back(r["loss"].get<double>());
  return all;
}

TEST_CASE(
    "SIGTERM stops stagerun after a whole step with its checkpoint, and --resume goes on bit for "
    "bit") {
  testing::TempDir dir;
  const std::string plan = toy_training_plan(dir), ck = dir.file("ck");
  // Long enough never to end by itself; a checkpoint every step, whose line says the run is
  // under way.
  Started run = start_stagerun(
      dir, fmt::format("{} --steps 100000 --json --checkpoint {} --save-every 1", plan, ck),
      "stopped");
  REQUIRE(wait_for_text(run.err, " at step 3:"));
  REQUIRE(kill(run.pid, SIGTERM) == 0);
  Finished stopped = wait_for(run);
  CAPTURE(stopped.err);
  CHECK(stopped.code == 75);
  std::vector<nlohmann::json> got = records(stopped.out);
  REQUIRE(got.size() >= 5);
  const nlohmann::json& record = got[got.size() - 2];
  CHECK(record["type"] == "stopped");
  CHECK(record["signal"] == "SIGTERM");
  CHECK(record["checkpoint"] == ck);
  const int64_t after = record["after_step"].get<int64_t>();
  CHECK(after >= 3);
  CHECK(got.back()["type"] == "summary");
  CHECK(got.back()["step_ms"].size() == static_cast<size_t>(after));
  const std::string last_line = fmt::format(
      "stagerun: stopped by SIGTERM after step {}; checkpoint {} holds it\n", after, ck);
  CHECK(stopped.err.ends_with(last_line));

  // Resumed for 3 more steps: the losses of a straight run of them all, bit for bit.
  Started resumed =
      start_stagerun(dir, fmt::format("{} --steps 3 --json -q --resume {}", plan, ck), "resumed");
  Finished rest = wait_for(resumed);
  REQUIRE(rest.code == 0);
  Started straight =
      start_stagerun(dir, fmt::format("{} --steps {} --json -q", plan, after + 3), "straight");
  Finished whole = wait_for(straight);
  REQUIRE(whole.code == 0);
  std::vector<double> curve = losses(stopped.out), more = losses(rest.out);
  CHECK(curve.size() == static_cast<size_t>(after));
  curve.insert(curve.end(), more.begin(), more.end());
  CHECK(curve == losses(whole.out));  // bit for bit
}

TEST_CASE("SIGUSR1 without --checkpoint stops stagerun saying no checkpoint holds the step") {
  testing::TempDir dir;
  const std::string plan = toy_training_plan(dir);
  Started run = start_stagerun(
      dir,
      fmt::format("{} --steps 100000 --trace {} --trace-steps 2", plan, dir.file("trace.json")),
      "usr1");
  // The progress line comes after 2 s of steps.
  REQUIRE(wait_for_text(run.err, "stagerun: step "));
  REQUIRE(kill(run.pid, SIGUSR1) == 0);
  Finished stopped = wait_for(run);
  CAPTURE(stopped.err);
  CHECK(stopped.code == 75);
  CHECK(stopped.err.find("stagerun: stopped by SIGUSR1 after step ") != std::string::npos);
  CHECK(stopped.err.ends_with("; no checkpoint (--checkpoint DIR saves one)\n"));
  CHECK(stopped.out.find("step ") != std::string::npos);  // the figures of the steps run
  // --trace-steps 2: the trace holds two steps' slices, however many ran.
  const nlohmann::json trace = nlohmann::json::parse(testing::read_bytes(dir.file("trace.json")));
  // A slice per step on each of the 2 devices' tracks: "step 1 (warm-up)", "step 2 (median)".
  std::multiset<std::string> steps;
  for (const nlohmann::json& e : trace["traceEvents"])
    if (e.contains("name") && e["name"].is_string() &&
        e["name"].get<std::string>().starts_with("step "))
      steps.insert(e["name"].get<std::string>().substr(0, 6));
  CHECK(steps == std::multiset<std::string>{"step 1", "step 1", "step 2", "step 2"});
}

// In process: a stop request seen after step 3 ends the run after step 4 (the step in flight),
// with its checkpoint, on every device.
TEST_CASE("a stop request ends Pipeline::run after the step in flight with a checkpoint") {
  testing::TempDir dir;
  auto pipeline = Pipeline::load(toy_training_plan(dir), cpu_backend(), 1);
  std::atomic<int> requested{0};
  std::vector<int64_t> saved;
  RunOptions options;
  options.steps = 100;
  options.progress = [&](int done, int, double) {
    if (done == 3) requested = SIGTERM;
  };
  options.stop_requested = [&] { return requested.load(); };
  options.checkpoint = [&](int64_t step) { saved.push_back(step); };
  RunReport report = pipeline->run(pipeline->synthetic_inputs(), options);
  CHECK(report.stop_signal == SIGTERM);
  CHECK(report.step_s.size() == 4);
  CHECK(report.losses.size() == 4);
  CHECK(saved == std::vector<int64_t>{4});
  CHECK(pipeline->steps_done() == 4);
}

TEST_CASE("a run keeps events and memory samples of its first trace_steps steps only") {
  testing::TempDir dir;
  auto pipeline = Pipeline::load(toy_training_plan(dir), cpu_backend(), 1);
  RunOptions options;
  options.steps = 5;
  RunReport all = pipeline->run(pipeline->synthetic_inputs(), options);
  options.trace_steps = 2;
  RunReport two = pipeline->run(pipeline->synthetic_inputs(), options);
  options.trace_steps = 0;
  RunReport none = pipeline->run(pipeline->synthetic_inputs(), options);
  REQUIRE(all.events.size() % 5 == 0);
  CHECK(two.events.size() == all.events.size() / 5 * 2);
  CHECK(two.memory.size() == all.memory.size() / 5 * 2);
  CHECK(none.events.empty());
  CHECK(none.memory.empty());
  CHECK(none.step_s.size() == 5);
  CHECK(none.devices.at(0).busy_s > 0);  // the figures do not need the events
}

TEST_CASE("resident memory stays flat over 3,000 untraced steps") {
  const LongRun run = long_run(3000);
  CHECK(run.growth < 0.01);
}

}  // namespace
}  // namespace stagecraft::rt
