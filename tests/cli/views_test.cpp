// Issue 16, "views worth looking at", end to end on plans stagec writes from the GPT sample:
// stagedump --trace with a measured run (stagerun --trace: compute, receives' waits, sends and
// a memory counter per device) in one Trace Event Format file, with a run of another plan
// refused; a traced run over --data batches; and stagedump --dot, the real data flow with long
// chains collapsed and every cut edge labelled with plan.json's bytes (parsed by Graphviz's dot
// when it is installed). The HTML page is checked in a browser by browser_test.sh.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "tests/test_util.h"

namespace stagecraft {
namespace {

struct Result {
  int status;
  std::string out, err;
};

Result run(const testing::TempDir& dir, const std::string& command) {
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  int status = std::system(fmt::format("{} >{} 2>{}", command, out, err).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, testing::read_bytes(out),
          testing::read_bytes(err)};
}

std::string ok(const testing::TempDir& dir, const std::string& command) {
  Result r = run(dir, command);
  INFO(command);
  INFO(r.err);
  REQUIRE(r.status == 0);
  return r.out;
}

const std::string kGpt = std::string(STAGECRAFT_SAMPLES) +
                         "/gpt_tiny.onnx --train --loss cross-entropy --batch 8 --dim seq=16 "
                         "--device-spec cpu --microbatches 4";

/// The instructions of each device in schedule.json: (all, timed by the runtime).
/// (ALLREDUCE_SHARED, only in plans with shared weights, is the one the runtime does not time.)
std::vector<std::pair<int, int>> instructions(const std::string& plan) {
  nlohmann::json schedule = nlohmann::json::parse(testing::read_bytes(plan + "/schedule.json"));
  std::vector<std::pair<int, int>> out;
  // What the runtime times: compute, all-reduces, the receives' waits and the sends.
  const std::set<std::string> timed = {"FWD",      "BWD",       "BWD_INPUT", "BWD_WEIGHT",
                                       "OPT_STEP", "ALLREDUCE", "RECV_ACT",  "RECV_GRAD",
                                       "SEND_ACT", "SEND_GRAD"};
  for (const auto& device : schedule["devices"]) {
    int all = 0, compute = 0;
    for (const auto& ins : device["instructions"]) {
      ++all;
      if (timed.count(ins["op"].get<std::string>())) ++compute;
    }
    out.push_back({all, compute});
  }
  return out;
}

TEST_CASE("stagedump --trace --measured: predicted and measured runs in one trace") {
  testing::TempDir dir;
  const std::string zb = dir.file("zb"), interleaved = dir.file("interleaved");
  ok(dir, fmt::format("{} {} --devices 3 --schedule zb-h1 -o {}", STAGECRAFT_STAGEC, kGpt, zb));
  ok(dir, fmt::format("{} {} --devices 2 --schedule interleaved -o {}", STAGECRAFT_STAGEC, kGpt,
                      interleaved));
  const std::string measured = dir.file("zb.trace.json");
  // The same run's summary (--json) gives the meter's peak and each device's fixed bytes.
  const nlohmann::json summary = [&] {
    nlohmann::json last;
    std::istringstream lines(ok(dir, fmt::format("{} {} --steps 3 -q --json --trace {}",
                                                 STAGECRAFT_STAGERUN, zb, measured)));
    for (std::string line; std::getline(lines, line);) last = nlohmann::json::parse(line);
    return last;
  }();
  REQUIRE(summary["type"] == "summary");
  const std::string both = dir.file("both.json");
  ok(dir, fmt::format("{} {} --trace {} --measured {}", STAGECRAFT_STAGEDUMP, zb, both, measured));

  const nlohmann::json trace = nlohmann::json::parse(testing::read_bytes(both));
  REQUIRE(trace["traceEvents"].is_array());
  CHECK(trace["displayTimeUnit"] == "ms");
  std::map<int, std::string> process;         // pid -> name
  std::map<std::pair<int, int>, int> slices;  // (pid, step) -> instruction slices
  std::map<std::pair<int, int>, int> sends;   // (pid, step) -> send slices
  std::map<int, int> step_slices, counters;   // pid -> count
  std::map<int, int64_t> lowest, highest;     // pid -> memory counter's range
  for (const auto& e : trace["traceEvents"]) {
    // Trace Event Format: every event has ph and pid; X has ts, dur, tid; C has ts.
    REQUIRE(e.contains("ph"));
    REQUIRE(e["pid"].is_number_integer());
    const int pid = e["pid"].get<int>();
    if (e["ph"] == "M") {
      CHECK(e["tid"].is_number_integer());
      if (e["name"] == "process_name") process[pid] = e["args"]["name"].get<std::string>();
    } else if (e["ph"] == "C") {
      CHECK(e["ts"].is_number());
      REQUIRE(e["args"]["bytes"].is_number_integer());
      const int64_t bytes = e["args"]["bytes"].get<int64_t>();
      lowest[pid] = counters[pid] == 0 ? bytes : std::min(lowest[pid], bytes);
      highest[pid] = std::max(highest[pid], bytes);
      ++counters[pid];
    } else {
      REQUIRE(e["ph"] == "X");
      CHECK(e["ts"].is_number());
      CHECK(e["dur"].get<double>() >= 0);
      CHECK(e["tid"].is_number_integer());
      if (e["cat"] == "step")
        ++step_slices[pid];
      else
        ++slices[{pid, e["args"].value("step", 1)}];
      if (e["cat"] == "send") {
        CHECK(e["tid"].get<int>() >= 3);  // a send lane
        CHECK(e["name"].get<std::string>().starts_with("send "));
        ++sends[{pid, e["args"].value("step", 1)}];
      }
    }
  }
  const auto counts = instructions(zb);
  REQUIRE(counts.size() == 3);
  for (int d = 0; d < 3; ++d) {
    CAPTURE(d);
    const int predicted = 1 + d, run = 1001 + d;
    CHECK(process[predicted] == fmt::format("predicted / device {}", d));
    CHECK(process[run] == fmt::format("measured / device {}", d));
    // The predicted step: every instruction, sends and receives too; one memory counter.
    CHECK(slices[{predicted, 1}] == counts[d].first);
    CHECK(counters[predicted] > 0);
    CHECK(step_slices[predicted] == 1);
    // Each measured step: every instruction the runtime times, the sends among them (the same
    // number as the predicted step's).
    for (int step = 1; step <= 3; ++step) {
      CAPTURE(step);
      CHECK(slices[{run, step}] == counts[d].second);
      CHECK(sends[{run, step}] == sends[{predicted, 1}]);
    }
    CHECK(sends[{run, 2}] > 0);
    CHECK(step_slices[run] == 3);
    // The measured memory counter: at each step's start and after every instruction (all 3
    // steps); never below the device's weights and arena (training adds its gradients and
    // optimizer state), rising over a step (activations kept until their backward), and at most
    // the meter's peak (which also sees instants inside an instruction).
    const nlohmann::json& device = summary["device"][d];
    CHECK(counters[run] == 3 * (counts[d].first + 1));
    CHECK(lowest[run] >=
          device["weight_bytes"].get<int64_t>() + device["arena_bytes"].get<int64_t>());
    CHECK(highest[run] > lowest[run]);
    CHECK(highest[run] <= device["peak_bytes"].get<int64_t>());
    // --json: the reported step's time in sends.
    CHECK(device["send_ms"].get<double>() > 0);
  }

  // Interleaved chunks are told apart in the slice names.
  const std::string text =
      ok(dir, fmt::format("{} {} --trace -", STAGECRAFT_STAGEDUMP, interleaved));
  CHECK(text.find("\"F0 chunk 1\"") != std::string::npos);

  // A run of another plan: one line naming the file, non-zero.
  Result other = run(dir, fmt::format("{} {} --trace {} --measured {}", STAGECRAFT_STAGEDUMP,
                                      interleaved, dir.file("x.json"), measured));
  CHECK(other.status != 0);
  CHECK_MESSAGE(std::regex_search(other.err, std::regex("^stagedump: plan error: .*zb.trace.json: "
                                                        "traceEvents\\[[0-9]+\\] is on device 2, "
                                                        "but the plan has 2 devices: a run of "
                                                        "another plan\n$")),
                other.err);
  // --json runs have no instruction times: refused for --trace, taken by --html.
  const std::string jsonl = dir.file("zb.run.jsonl");
  testing::write_bytes(jsonl,
                       ok(dir, fmt::format("{} {} --steps 2 -q --json", STAGECRAFT_STAGERUN, zb)));
  Result json_trace = run(dir, fmt::format("{} {} --trace {} --measured {}", STAGECRAFT_STAGEDUMP,
                                           zb, dir.file("y.json"), jsonl));
  CHECK(json_trace.status == 2);
  CHECK(json_trace.err.find("has no instruction times") != std::string::npos);
  ok(dir, fmt::format("{} {} --html {} --measured {}", STAGECRAFT_STAGEDUMP, zb,
                      dir.file("page.html"), jsonl));
  Result json_other = run(dir, fmt::format("{} {} --html {} --measured {}", STAGECRAFT_STAGEDUMP,
                                           interleaved, dir.file("z.html"), jsonl));
  CHECK_MESSAGE(
      json_other.err.find("zb.run.jsonl: field 'devices' is 3, but the plan") != std::string::npos,
      json_other.err);
}

// --data runs one step per batch; their traces join into one run whose steps follow each other
// (each after every device's last event of the one before: a device that ends a step early
// must not pull the next step's start back into it).
TEST_CASE("stagerun --trace over --data batches: one step after another, every device") {
  testing::TempDir dir;
  const std::string plan = dir.file("plan"), data = dir.file("data"),
                    trace = dir.file("data.trace.json");
  ok(dir, fmt::format("{} {} --devices 2 --schedule 1f1b -o {}", STAGECRAFT_STAGEC, kGpt, plan));
  ok(dir, fmt::format("{} --out {} --batches 2 --batch 8 --seq 16", STAGECRAFT_LM_DATA, data));
  ok(dir, fmt::format("{} {} --steps 3 -q --data {} --trace {}", STAGECRAFT_STAGERUN, plan, data,
                      trace));
  const nlohmann::json both = nlohmann::json::parse(
      ok(dir, fmt::format("{} {} --trace - --measured {}", STAGECRAFT_STAGEDUMP, plan, trace)));
  std::map<int, std::vector<std::pair<double, double>>> steps;  // pid -> measured step slices
  for (const auto& e : both["traceEvents"])
    if (e["ph"] == "X" && e["cat"] == "step" && e["pid"].get<int>() > 1000)
      steps[e["pid"].get<int>()].push_back(
          {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
  REQUIRE(steps.size() == 2);
  for (const auto& [pid, list] : steps) {
    CAPTURE(pid);
    REQUIRE(list.size() == 3);
    for (size_t s = 1; s < list.size(); ++s) CHECK(list[s].first >= list[s - 1].second);
  }
}

TEST_CASE("stagedump --dot: data flow by stage, chains collapsed, cut edges with their bytes") {
  testing::TempDir dir;
  const std::string plan = dir.file("plan");
  ok(dir, fmt::format("{} {} --devices 3 --schedule 1f1b -o {}", STAGECRAFT_STAGEC, kGpt, plan));
  const std::string dot = ok(dir, fmt::format("{} {} --dot -", STAGECRAFT_STAGEDUMP, plan));
  const nlohmann::json plan_json = nlohmann::json::parse(testing::read_bytes(plan + "/plan.json"));

  size_t ops = 0;
  for (const auto& stage : plan_json["stages"]) ops += stage["nodes"].size();
  // Nodes: op boxes (single ops and collapsed chains) inside the clusters.
  const std::regex node(R"(\n    s[0-9]+_[0-9]+ \[label=)");
  const auto nodes = static_cast<size_t>(
      std::distance(std::sregex_iterator(dot.begin(), dot.end(), node), std::sregex_iterator()));
  MESSAGE(fmt::format("gpt_tiny: {} ops drawn as {} nodes", ops, nodes));
  CHECK(ops >= 50);  // 54 with attention and GELU fused
  CHECK(nodes <= 40);                              // about half the ops: readable on one screen
  CHECK(dot.find(" ops: ") != std::string::npos);  // a collapsed chain

  // Every tensor crossing stages is an edge labelled with its bytes, as plan.json has them.
  std::map<std::string, int64_t> crossing;  // name -> bytes
  for (const auto& stage : plan_json["stages"])
    for (const auto& out : stage["outputs"])
      if (!out["peer_stages"].empty()) crossing[out["name"]] = out["bytes"].get<int64_t>();
  REQUIRE(!crossing.empty());
  const std::regex cut(
      R"re(-> s[0-9]+_[0-9]+ \[label="([^"\\]*)\\n[^"]* \(([0-9,]+) B\)", class="cut")re");
  std::set<std::string> labelled;
  for (auto it = std::sregex_iterator(dot.begin(), dot.end(), cut); it != std::sregex_iterator();
       ++it) {
    const std::string name = (*it)[1].str();
    std::string digits = (*it)[2].str();
    std::erase(digits, ',');
    CAPTURE(name);
    REQUIRE(crossing.count(name) == 1);
    CHECK(std::stoll(digits) == crossing[name]);
    labelled.insert(name);
  }
  CHECK(labelled.size() == crossing.size());

  // Graphviz parses it, where it is installed.
  if (std::system("command -v dot >/dev/null 2>&1") == 0) {
    testing::write_bytes(dir.file("plan.dot"), dot);
    ok(dir, fmt::format("dot -Tsvg {} -o {}", dir.file("plan.dot"), dir.file("plan.svg")));
  } else {
    MESSAGE("Graphviz's dot is not installed: the DOT text is not parsed");
  }
}

}  // namespace
}  // namespace stagecraft
