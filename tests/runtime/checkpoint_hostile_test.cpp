// Checkpoints from a hostile or damaged source (issue 17): a manifest's `file` entries stay
// inside the checkpoint and name regular files; a manifest that leaves out weights or optimizer
// state is refused rather than resumed from the initial values; an absurd step is refused; and
// the leftovers of killed saves are cleaned by the next save.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

namespace fs = std::filesystem;

/// A two-stage Adam training plan of the toy model, one step taken and saved to `ckpt`.
struct Saved {
  testing::TempDir dir;
  std::string plan_dir, ckpt;
  nlohmann::json manifest;

  Saved() {
    plan::PlanOptions o;
    o.model_path = std::string(STAGECRAFT_SAMPLES) + "/toy.onnx";
    o.devices = 2;
    o.batch = 8;
    o.microbatches = 4;
    o.training = true;
    o.schedule = ScheduleKind::k1F1B;
    o.optimizer = OptimizerKind::kAdam;
    o.loss.kind = "mse";
    o.device_spec = "cpu";
    plan_dir = dir.file("plan");
    plan::PlannedModel planned = plan::make_plan(o);
    plan::write_plan(planned, plan_dir);
    auto p = Pipeline::load(plan_dir, cpu_backend(), 1);
    RunOptions run;
    run.steps = 1;
    p->run(p->synthetic_inputs(), run);
    ckpt = dir.file("ckpt");
    save_checkpoint(*p, ckpt);
    std::ifstream in(ckpt + "/manifest.json");
    manifest = nlohmann::json::parse(in);
  }

  /// Writes `edited` as the manifest and expects the load to be refused with `needle`, the
  /// pipeline untouched.
  void refused(const nlohmann::json& edited, const std::string& needle) {
    std::ofstream(ckpt + "/manifest.json") << edited.dump();
    auto q = Pipeline::load(plan_dir, cpu_backend(), 1);
    CHECK_THROWS_WITH_AS(load_checkpoint(*q, ckpt), doctest::Contains(needle.c_str()), Error);
    CHECK(q->steps_done() == 0);
  }
};

TEST_CASE("a checkpoint's file entries must stay inside it and name regular files") {
  Saved s;
  testing::write_bytes(s.dir.file("outside.npy"), "not read");
  auto with_file = [&](const std::string& file) {
    nlohmann::json m = s.manifest;
    m["stages"][0]["weights"][0]["file"] = file;
    return m;
  };
  s.refused(with_file(s.dir.file("outside.npy")), "absolute paths are refused");
  s.refused(with_file("../outside.npy"), "'..' is refused");
  s.refused(with_file("stage_0/../../outside.npy"), "'..' is refused");
  fs::create_symlink(s.dir.file("outside.npy"), s.ckpt + "/link.npy");
  s.refused(with_file("link.npy"), "link.npy is a symlink");
  // A FIFO blocked --resume for ever (issue 17).
  REQUIRE(::mkfifo((s.ckpt + "/fifo.npy").c_str(), 0600) == 0);
  s.refused(with_file("fifo.npy"), "fifo.npy is not a regular file");
  s.refused(with_file("stage_0"), "stage_0 is not a regular file");
  s.refused(with_file(""), "the path is empty");
  s.refused(with_file("missing.npy"), "missing.npy does not exist");
  // The field and the entry are named.
  s.refused(with_file("../outside.npy"), "field 'stages[0].weights[0].file' ('../outside.npy')");
}

TEST_CASE("a manifest that leaves out weights or optimizer state is refused") {
  Saved s;
  nlohmann::json no_weights = s.manifest;
  no_weights["stages"][0]["weights"] = nlohmann::json::array();
  s.refused(no_weights, "field 'stages' lacks weight '");
  nlohmann::json no_state = s.manifest;
  no_state["stages"][0]["optimizer"] = nlohmann::json::array();
  s.refused(no_state, "field 'stages[0].optimizer' lacks state 'm' of weight '");
  nlohmann::json only_m = s.manifest;
  auto& states = only_m["stages"][0]["optimizer"];
  states.erase(std::remove_if(states.begin(), states.end(),
                              [](const nlohmann::json& o) { return o["state"] == "v"; }),
               states.end());
  s.refused(only_m, "lacks state 'v' of weight '");
  // The intact manifest still loads.
  std::ofstream(s.ckpt + "/manifest.json") << s.manifest.dump();
  auto q = Pipeline::load(s.plan_dir, cpu_backend(), 1);
  CHECK(load_checkpoint(*q, s.ckpt) == 1);
}

TEST_CASE("a step past 2^53 is refused") {
  Saved s;
  nlohmann::json m = s.manifest;
  m["step"] = std::numeric_limits<int64_t>::max();
  s.refused(m, "field 'step' is 9223372036854775807, more than 2^53");
}

TEST_CASE("a save removes the leftovers of killed saves, not those of live ones") {
  Saved s;
  // A pid that is surely gone: a child that has exited and been reaped.
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(child > 0);
  ::waitpid(child, nullptr, 0);
  const std::string dead = fmt::format("{}.tmp-{}", s.ckpt, child);
  const std::string alive = fmt::format("{}.tmp-{}", s.ckpt, ::getppid());
  const std::string other = s.ckpt + ".tmp-notapid";
  for (const std::string& d : {dead, alive, other}) fs::create_directories(d + "/stage_0");
  auto p = Pipeline::load(s.plan_dir, cpu_backend(), 1);
  save_checkpoint(*p, s.ckpt);
  CHECK(!fs::exists(dead));
  CHECK(fs::exists(alive));
  CHECK(fs::exists(other));
  CHECK(fs::exists(s.ckpt + "/manifest.json"));
}

}  // namespace
}  // namespace stagecraft::rt
