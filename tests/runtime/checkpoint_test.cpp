// Checkpoints: a run resumed from a checkpoint gives the losses of the uninterrupted run bit for
// bit; a save that dies half-way leaves the last good checkpoint loadable; a checkpoint of
// another plan of the model loads (tests/runtime/reshard_test.cpp has more); --export writes the original model with the trained weights.
#include "runtime/exec/checkpoint.h"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/tensor_io.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

namespace fs = std::filesystem;

plan::PlanOptions options_for(const std::string& file, const std::string& loss, int devices) {
  plan::PlanOptions o = testing::training_options(std::string(STAGECRAFT_SAMPLES) + "/" + file,
                                                  devices, "1f1b", loss);
  o.training_config.lr_schedule = "cosine";  // the step count matters
  o.training_config.total_steps = 20;
  if (file == "gpt_tiny.onnx") o.dims["seq"] = 8;
  return o;
}

std::string make_plan(const plan::PlanOptions& o, const std::string& path) {
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, path);
  return path;
}

std::vector<double> train(Pipeline& p, int steps, RunOptions options = {}) {
  options.steps = steps;
  return p.run(p.synthetic_inputs(), options).losses;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())) == 0;
}

TEST_CASE("a resumed run gives the losses of the uninterrupted run, bit for bit") {
  struct Case {
    const char* file;
    const char* loss;
  };
  for (Case c : {Case{"toy.onnx", "mse"}, Case{"gpt_tiny.onnx", "cross-entropy"}}) {
    CAPTURE(c.file);
    testing::TempDir dir;
    std::string plan_dir = make_plan(options_for(c.file, c.loss, 2), dir.file("plan"));
    // Six steps straight, saving every three (the saves must not disturb the run).
    auto straight = Pipeline::load(plan_dir, cpu_backend(), 1);
    RunOptions options;
    std::vector<int64_t> saved;
    options.checkpoint_every = 3;
    options.checkpoint = [&](int64_t step) {
      saved.push_back(step);
      save_checkpoint(*straight, dir.file(fmt::format("ckpt_{}", step)));
    };
    std::vector<double> want = train(*straight, 6, options);
    CHECK(saved == std::vector<int64_t>{3, 6});
    auto plain = Pipeline::load(plan_dir, cpu_backend(), 1);
    CHECK(train(*plain, 6) == want);

    nlohmann::json manifest = read_json(dir.file("ckpt_3/manifest.json"));
    CHECK(manifest["format"] == "stagecraft-checkpoint");
    CHECK(manifest["step"] == 3);
    CHECK(manifest["optimizer"] == "adam");
    CHECK(manifest["stages"].size() == plain->plan().stages.size());

    // Three steps, a checkpoint, then three more in a fresh pipeline.
    auto first = Pipeline::load(plan_dir, cpu_backend(), 1);
    std::vector<double> losses = train(*first, 3);
    save_checkpoint(*first, dir.file("ckpt"));
    auto resumed = Pipeline::load(plan_dir, cpu_backend(), 1);
    CHECK(load_checkpoint(*resumed, dir.file("ckpt")) == 3);
    CHECK(resumed->steps_done() == 3);
    for (double l : train(*resumed, 3)) losses.push_back(l);
    REQUIRE(losses.size() == want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      CAPTURE(k);
      CHECK(losses[k] == want[k]);  // exact
    }
    // And the weights end the same.
    for (size_t s = 0; s < resumed->plan().stages.size(); ++s)
      for (const auto& [name, w] : resumed->stage_weights(static_cast<int>(s))) {
        CAPTURE(name);
        CHECK(same_bytes(w, straight->stage_weights(static_cast<int>(s)).at(name)));
      }
  }
}

TEST_CASE("a checkpoint loads into a plan of other stages: its weights found by name") {
  testing::TempDir dir;
  std::string plan_dir = make_plan(options_for("toy.onnx", "mse", 2), dir.file("plan"));
  auto p = Pipeline::load(plan_dir, cpu_backend(), 1);
  train(*p, 1);
  save_checkpoint(*p, dir.file("ckpt"));
  // The stage files' hashes are a record, not a key: the weights are found by name.
  nlohmann::json manifest = read_json(dir.file("ckpt/manifest.json"));
  manifest["stages"][1]["file_hash"] = "fnv1a64:0000000000000000";
  std::ofstream(dir.file("ckpt/manifest.json")) << manifest.dump();
  auto q = Pipeline::load(plan_dir, cpu_backend(), 1);
  CHECK(load_checkpoint(*q, dir.file("ckpt")) == 1);
  // A plan with another stage count: each weight restored from the stage that saved it.
  std::string three = make_plan(options_for("toy.onnx", "mse", 3), dir.file("plan3"));
  auto r = Pipeline::load(three, cpu_backend(), 1);
  REQUIRE(r->plan().stages.size() == 3);
  CHECK(load_checkpoint(*r, dir.file("ckpt")) == 1);
  int restored = 0;
  for (const plan::Stage& stage : r->plan().stages)
    for (const auto& [name, w] : r->stage_weights(stage.index)) {
      if (w.dtype != DType::kFloat32) continue;
      bool found = false;
      for (const plan::Stage& saved : p->plan().stages)
        if (auto it = p->stage_weights(saved.index).find(name);
            it != p->stage_weights(saved.index).end()) {
          CHECK(same_bytes(w, it->second));
          found = true;
        }
      CHECK(found);
      ++restored;
    }
  CHECK(restored > 0);
  CHECK_THROWS_WITH_AS(load_checkpoint(*r, dir.file("nothing")), doctest::Contains("no such checkpoint"), Error);
}

TEST_CASE("a save that dies half-way leaves the last good checkpoint loadable") {
  testing::TempDir dir;
  std::string plan_dir = make_plan(options_for("toy.onnx", "mse", 2), dir.file("plan"));
  auto p = Pipeline::load(plan_dir, cpu_backend(), 1);
  train(*p, 3);
  std::string ckpt = dir.file("ckpt");
  save_checkpoint(*p, ckpt);
  std::map<std::string, Tensor> at3;
  for (const auto& [name, w] : p->stage_weights(0)) at3[name] = clone(w);
  train(*p, 2);
  SaveOptions crash;
  crash.fail_after_files = 2;
  CHECK_THROWS_WITH_AS(save_checkpoint(*p, ckpt, crash), doctest::Contains("test hook"), Error);
  CHECK(fs::exists(fmt::format("{}.tmp-{}", ckpt, ::getpid())));  // the crash's leftovers

  auto check_loads_step_3 = [&](const std::string& from) {
    auto q = Pipeline::load(plan_dir, cpu_backend(), 1);
    CHECK(load_checkpoint(*q, from) == 3);
    for (const auto& [name, w] : q->stage_weights(0))
      if (w.dtype == DType::kFloat32) CHECK(same_bytes(w, at3.at(name)));
    CHECK(!q->optimizer_state(0).empty());
  };
  check_loads_step_3(ckpt);
  // A crash between the two renames: only ckpt.old is left; it is what loads.
  fs::rename(ckpt, ckpt + ".old");
  CHECK(checkpoint_to_load(ckpt) == ckpt + ".old");
  check_loads_step_3(ckpt);
  // The next save puts a complete checkpoint in place and cleans up.
  save_checkpoint(*p, ckpt);
  CHECK(fs::exists(ckpt + "/manifest.json"));
  CHECK(!fs::exists(ckpt + ".old"));
  CHECK(read_json(ckpt + "/manifest.json")["step"] == 5);
}

TEST_CASE("export writes the original model with the trained weights") {
  testing::TempDir dir;
  // A copy of the model, so that changing it can be tested.
  std::string model = dir.file("toy.onnx");
  fs::copy_file(std::string(STAGECRAFT_SAMPLES) + "/toy.onnx", model);
  plan::PlanOptions o = options_for("toy.onnx", "mse", 2);
  o.model_path = model;
  std::string plan_dir = make_plan(o, dir.file("plan"));
  auto p = Pipeline::load(plan_dir, cpu_backend(), 1);
  train(*p, 3);
  save_checkpoint(*p, dir.file("ckpt"));
  std::string out = dir.file("trained.onnx");
  int replaced = export_model(*p, out);
  CHECK(replaced > 0);

  onnx::ModelProto original, exported;
  {
    std::ifstream a(model, std::ios::binary), b(out, std::ios::binary);
    REQUIRE(original.ParseFromIstream(&a));
    REQUIRE(exported.ParseFromIstream(&b));
  }
  CHECK(exported.graph().node_size() == original.graph().node_size());
  CHECK(exported.graph().initializer_size() == original.graph().initializer_size());
  // Every weight of the checkpoint is in the export, with the checkpoint's values.
  nlohmann::json manifest = read_json(dir.file("ckpt/manifest.json"));
  int checked = 0, changed = 0;
  for (const auto& stage : manifest["stages"])
    for (const auto& w : stage["weights"]) {
      std::string name = w["name"];
      CAPTURE(name);
      Tensor saved = read_npy(dir.file("ckpt/" + w["file"].get<std::string>()));
      for (int i = 0; i < exported.graph().initializer_size(); ++i) {
        if (exported.graph().initializer(i).name() != name) continue;
        Tensor got = tensor_from_proto(exported.graph().initializer(i), name);
        CHECK(same_bytes(got, saved));
        if (!same_bytes(got, tensor_from_proto(original.graph().initializer(i), name))) ++changed;
        ++checked;
      }
    }
  CHECK(checked == replaced);
  CHECK(changed > 0);  // training moved them

  // The model changed since the plan was made: refused.
  { std::ofstream(model, std::ios::app) << "x"; }
  CHECK_THROWS_WITH_AS(export_model(*p, dir.file("again.onnx")),
                       doctest::Contains("but plan.json's model_hash is"), Error);
  fs::remove(model);
  CHECK_THROWS_WITH_AS(export_model(*p, dir.file("again.onnx")), doctest::Contains("is missing"), Error);
  CHECK(!fs::exists(dir.file("again.onnx")));
}

}  // namespace
}  // namespace stagecraft::rt
