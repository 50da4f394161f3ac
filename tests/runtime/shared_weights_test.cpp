// Weights read by several stages (a GPT's tied embedding and output head; a chain whose first
// and last layers use one matrix): every holder keeps a copy, the copies' gradients are summed
// before the optimizer step, so pipelined training equals one device's and the copies stay
// bit-identical; plan.json records the holders and is refused when they disagree; checkpoints
// and exports hold the weight once; the planner counts every copy; stagedump lists them.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "compiler/plan/planner.h"
#include "compiler/schedule/build_schedule.h"
#include "compiler/schedule/simulator.h"
#include "runtime/core/backend.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/pipeline.h"
#include "runtime/exec/transport.h"
#include "runtime/format/error.h"
#include "samples/builder/sample_models.h"
#include "tests/plan_format/sample_plan.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"
#include "tools/dump/render.h"
#include "tools/dump/view.h"

namespace stagecraft::rt {
namespace {

/// The two sample models, written once into a folder that lives as long as the tests.
struct SharedModels {
  testing::TempDir dir;
  std::string gpt, chain;
  SharedModels() {
    gpt = dir.file("gpt_tied.onnx");
    samples::build_gpt(testing::tied_gpt_options()).write(gpt);
    chain = dir.file("shared_chain.onnx");
    samples::build_shared_chain().write(chain);
  }
};

const SharedModels& models() {
  static const SharedModels instance;
  return instance;
}

constexpr const char* kWte = "transformer.wte.weight";
constexpr const char* kShared = "shared.weight";

plan::PlanOptions options_for(const std::string& model, int devices, const std::string& schedule,
                              const std::string& optimizer) {
  const bool gpt = model == models().gpt;
  plan::PlanOptions o =
      testing::training_options(model, devices, schedule, gpt ? "cross-entropy" : "mse");
  if (schedule == "interleaved") o.chunks = 2;
  o.optimizer = stagecraft::parse_optimizer(optimizer);
  o.training_config.lr = optimizer == "sgd" ? 0.1 : 0.01;
  // Adam's default epsilon (1e-8) turns last-bit differences in near-zero gradients into
  // updates of up to lr: on one device, 1F1B's weights already differ from GPipe's by 7e-4 after
  // six steps (the microbatches' gradients add in another order). 1e-3 keeps those within 1e-5
  // while a lost tie still moves the weights by whole gradients.
  o.training_config.epsilon = 1e-3;
  if (gpt) o.dims["seq"] = 8;
  return o;
}

std::string write(const plan::PlanOptions& o, const std::string& path) {
  plan::PlannedModel planned = plan::make_plan(o);
  plan::write_plan(planned, path);
  return path;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())) == 0;
}

/// The trained float weights by name, each from the lowest stage that holds it.
std::map<std::string, Tensor> trained_weights(const Pipeline& p) {
  std::map<std::string, Tensor> out;
  for (const plan::Stage& stage : p.plan().stages)
    for (const auto& [name, t] : p.stage_weights(stage.index))
      if (t.dtype == DType::kFloat32) out.emplace(name, clone(t));
  return out;
}

/// Counts the holders whose copy (weight and optimizer state) differs from the lowest holder's.
int copies_that_differ(const Pipeline& p) {
  int differ = 0;
  for (const plan::Stage& stage : p.plan().stages)
    for (const plan::SharedWeight& w : stage.shared_weights) {
      int owner = w.stages.front();
      if (owner == stage.index) continue;
      if (!same_bytes(p.stage_weights(stage.index).at(w.name), p.stage_weights(owner).at(w.name)))
        ++differ;
      const auto& mine = p.optimizer_state(stage.index);
      const auto& theirs = p.optimizer_state(owner);
      if (mine.count(w.name) != theirs.count(w.name)) {
        ++differ;
        continue;
      }
      if (!mine.count(w.name)) continue;
      for (const auto& [key, t] : theirs.at(w.name).tensors)
        if (!mine.at(w.name).has(key) || !same_bytes(mine.at(w.name).tensors.at(key), t)) ++differ;
    }
  return differ;
}

struct Trained {
  std::vector<double> losses;
  std::map<std::string, Tensor> weights;
  int copies_differ = 0;
  std::vector<plan::SharedWeight> shared;  ///< Every stage's list, concatenated.
  std::vector<int> reader_stages;          ///< The stages holding a reader of the weight.
};

Trained train(const plan::PlanOptions& o, int steps, const std::vector<std::string>& readers) {
  testing::TempDir dir;
  auto pipeline = Pipeline::load(write(o, dir.file("plan")), cpu_backend(), 1);
  RunOptions options;
  options.steps = steps;
  Trained out;
  out.losses = pipeline->run(pipeline->synthetic_inputs(), options).losses;
  out.weights = trained_weights(*pipeline);
  out.copies_differ = copies_that_differ(*pipeline);
  for (const plan::Stage& stage : pipeline->plan().stages) {
    out.shared.insert(out.shared.end(), stage.shared_weights.begin(), stage.shared_weights.end());
    bool reads = std::any_of(stage.nodes.begin(), stage.nodes.end(), [&](const std::string& n) {
      return std::find(readers.begin(), readers.end(), n) != readers.end();
    });
    if (reads) out.reader_stages.push_back(stage.index);
  }
  return out;
}

TEST_CASE(
    "shared weights: pipelined training equals one device's (1e-5) and every copy stays "
    "bit-identical, for every schedule, with SGD and Adam") {
  struct Model {
    std::string path;
    const char* weight;
    int steps;
    std::vector<std::string> readers;  ///< The nodes that read the weight.
  };
  const Model all[] = {{models().gpt, kWte, 6, {"/transformer/wte/Gather", "/lm_head/Transpose"}},
                       {models().chain, kShared, 20, {"/layers.0/MatMul", "/layers.5/MatMul"}}};
  for (const Model& m : all) {
    int widest = 0;  // the most stages between two holders of the weight in any run
    for (std::string optimizer : {"sgd", "adam"}) {
      CAPTURE(m.path);
      CAPTURE(optimizer);
      Trained reference = train(options_for(m.path, 1, "gpipe", optimizer), m.steps, m.readers);
      CHECK(reference.shared.empty());  // one stage holds everything
      REQUIRE(reference.losses.size() == static_cast<size_t>(m.steps));
      CHECK(reference.losses.back() < reference.losses.front());  // it learns
      for (std::string schedule : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
        for (int devices : {1, 2, 4}) {
          CAPTURE(schedule);
          CAPTURE(devices);
          plan::PlanOptions o = options_for(m.path, devices, schedule, optimizer);
          Trained run = train(o, m.steps, m.readers);
          // The plan lists the weight exactly where its readers went.
          auto w = std::find_if(run.shared.begin(), run.shared.end(),
                                [&](const plan::SharedWeight& s) { return s.name == m.weight; });
          if (run.reader_stages.size() < 2) {
            CHECK(w == run.shared.end());
          } else {
            REQUIRE(w != run.shared.end());
            CHECK(w->stages == run.reader_stages);
            widest = std::max(widest, w->stages.back() - w->stages.front());
          }
          CHECK(run.copies_differ == 0);
          REQUIRE(run.losses.size() == reference.losses.size());
          for (size_t k = 0; k < run.losses.size(); ++k) {
            CAPTURE(k);
            CHECK(std::fabs(run.losses[k] - reference.losses[k]) <=
                  1e-5 * std::max(1.0, std::fabs(reference.losses[k])));
          }
          REQUIRE(run.weights.size() == reference.weights.size());
          int bad = 0;
          double worst = 0;
          for (const auto& [name, ref] : reference.weights) {
            const Tensor& got = run.weights.at(name);
            REQUIRE(got.shape == ref.shape);
            for (int64_t i = 0; i < ref.numel(); ++i) {
              double diff = std::fabs(static_cast<double>(got.as<float>()[i]) - ref.as<float>()[i]);
              worst = std::max(worst, diff);
              bad +=
                  diff > 1e-5 * std::max(1.0, std::fabs(static_cast<double>(ref.as<float>()[i])));
            }
          }
          CAPTURE(worst);
          CHECK(bad == 0);
        }
      }
    }
    CHECK(widest >= 3);  // some split puts the tied ops three stages apart
  }
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const std::string& path, const nlohmann::json& json) {
  testing::write_bytes(path, json.dump(1));
}

TEST_CASE("a checkpoint holds a shared weight once: resuming restores it to every holder") {
  testing::TempDir dir;
  plan::PlanOptions o = options_for(models().gpt, 2, "1f1b", "adam");
  std::string plan_dir = write(o, dir.file("plan"));
  auto straight = Pipeline::load(plan_dir, cpu_backend(), 1);
  RunOptions six;
  six.steps = 6;
  std::vector<double> uninterrupted = straight->run(straight->synthetic_inputs(), six).losses;

  auto first = Pipeline::load(plan_dir, cpu_backend(), 1);
  RunOptions three;
  three.steps = 3;
  std::vector<double> losses = first->run(first->synthetic_inputs(), three).losses;
  save_checkpoint(*first, dir.file("ckpt"));
  nlohmann::json manifest = read_json(dir.file("ckpt/manifest.json"));
  CHECK(manifest["version"] == kCheckpointVersion);
  int weight_entries = 0, state_entries = 0;
  for (const auto& stage : manifest["stages"]) {
    for (const auto& w : stage["weights"])
      if (w["name"] == kWte) {
        ++weight_entries;
        CHECK(stage["index"] == 0);  // the lowest holder's copy
      }
    for (const auto& s : stage["optimizer"]) state_entries += s["weight"] == kWte;
  }
  CHECK(weight_entries == 1);
  CHECK(state_entries == 2);  // Adam's two moments, once

  // A fresh pipeline: both copies at their initial value, which the checkpoint's differs from.
  auto resumed = Pipeline::load(plan_dir, cpu_backend(), 1);
  CHECK_FALSE(same_bytes(resumed->stage_weights(1).at(kWte), first->stage_weights(0).at(kWte)));
  CHECK(load_checkpoint(*resumed, dir.file("ckpt")) == 3);
  CHECK(same_bytes(resumed->stage_weights(0).at(kWte), first->stage_weights(0).at(kWte)));
  CHECK(same_bytes(resumed->stage_weights(1).at(kWte), first->stage_weights(0).at(kWte)));
  CHECK(copies_that_differ(*resumed) == 0);
  std::vector<double> rest = resumed->run(resumed->synthetic_inputs(), three).losses;
  losses.insert(losses.end(), rest.begin(), rest.end());
  REQUIRE(losses.size() == uninterrupted.size());
  for (size_t k = 0; k < losses.size(); ++k) {
    CAPTURE(k);
    CHECK(losses[k] == uninterrupted[k]);
  }
  CHECK(copies_that_differ(*resumed) == 0);

  // A checkpoint whose lowest holder lacks the weight is refused.
  for (auto& w : manifest["stages"][0]["weights"])
    if (w["name"] == kWte) w["name"] = "not.a.weight";
  write_json(dir.file("ckpt/manifest.json"), manifest);
  CHECK_THROWS_WITH_AS(load_checkpoint(*resumed, dir.file("ckpt")),
                       doctest::Contains("'not.a.weight'"), Error);
}

TEST_CASE("--export writes a weight held three stages apart once, with its trained value") {
  testing::TempDir dir;
  plan::PlanOptions o = options_for(models().chain, 4, "1f1b", "sgd");
  auto pipeline = Pipeline::load(write(o, dir.file("plan")), cpu_backend(), 1);
  const plan::Stage& last = pipeline->plan().stages[3];
  REQUIRE(last.shared_weights.size() == 1);
  CHECK(last.shared_weights[0].stages == std::vector<int>{0, 3});
  Tensor initial = clone(pipeline->stage_weights(3).at(kShared));
  RunOptions options;
  options.steps = 5;
  pipeline->run(pipeline->synthetic_inputs(), options);
  const Tensor& trained = pipeline->stage_weights(3).at(kShared);
  CHECK_FALSE(same_bytes(trained, initial));
  CHECK(same_bytes(trained, pipeline->stage_weights(0).at(kShared)));
  CHECK(export_model(*pipeline, dir.file("out.onnx")) > 0);
  onnx::ModelProto exported;
  std::ifstream in(dir.file("out.onnx"), std::ios::binary);
  REQUIRE(exported.ParseFromIstream(&in));
  int found = 0;
  for (const onnx::TensorProto& t : exported.graph().initializer()) {
    if (t.name() != kShared) continue;
    ++found;
    REQUIRE(t.raw_data().size() == static_cast<size_t>(trained.bytes()));
    CHECK(std::memcmp(t.raw_data().data(), trained.data, t.raw_data().size()) == 0);
  }
  CHECK(found == 1);
}

TEST_CASE(
    "the planner counts a shared weight, its gradient and optimizer state on every holder, and "
    "the exchange in the step time: stagedump lists it") {
  testing::TempDir dir;
  plan::PlanOptions o = options_for(models().chain, 4, "1f1b", "adam");
  std::string plan_dir = write(o, dir.file("plan"));
  auto pipeline = Pipeline::load(plan_dir, cpu_backend(), 1);
  const plan::Plan& plan = pipeline->plan();
  for (const plan::Stage& stage : plan.stages) {
    CAPTURE(stage.index);
    // The stage's parameters are those of its own stage file, the shared copy included.
    int64_t held = 0;
    for (const auto& [name, t] : pipeline->stage_weights(stage.index))
      if (t.dtype == DType::kFloat32) held += t.numel();
    CHECK(stage.params == held);
    CHECK(stage.memory.weights == 4 * stage.params);
    CHECK(stage.memory.gradients == 4 * stage.params);
    CHECK(stage.memory.optimizer == 8 * stage.params);  // Adam's two moments
    bool holder = stage.index == 0 || stage.index == 3;
    CHECK(pipeline->stage_weights(stage.index).count(kShared) == (holder ? 1u : 0u));
    CHECK(stage.shared_weights.size() == (holder ? 1u : 0u));
    CHECK((stage.shared_exchange_ms > 0) == holder);
  }
  // The exchange is in the predicted step: without it the same schedule is faster.
  dump::PlanView view = dump::load_view(plan_dir);
  // The plan's own stage times, as the planner simulated them.
  schedule::StageCosts costs = testing::stage_costs(plan);
  CHECK(schedule::simulate(view.schedule, view.shape, costs).step_s * 1e3 ==
        doctest::Approx(plan.predicted.step_ms));
  double with = schedule::simulate(view.schedule, view.shape, costs).step_s;
  costs.shared_allreduce_s.assign(costs.shared_allreduce_s.size(), 0.0);
  double without = schedule::simulate(view.schedule, view.shape, costs).step_s;
  CHECK(with >= without + plan.stages[0].shared_exchange_ms / 1e3 * 0.999);
  // The schedule exchanges on the holders' devices only, before their optimizer steps.
  for (int device = 0; device < 4; ++device) {
    int exchanges = 0;
    for (const schedule::Instruction& in : view.schedule[device])
      exchanges += in.op == schedule::Op::kAllReduceShared;
    CHECK(exchanges == (device == 0 || device == 3 ? 1 : 0));
  }
  std::string text = dump::render_text(view);
  CAPTURE(text);
  CHECK(text.find("shared weights per stage") != std::string::npos);
  CHECK(text.find("shared.weight float32[16,16] 256 params (held by stages 0, 3)") !=
        std::string::npos);
  nlohmann::ordered_json json = dump::render_json(view);
  CHECK(json["stages"][3]["shared_weights"][0]["name"] == kShared);
  CHECK(json["stages"][1]["shared_weights"].empty());
}

/// Writes a chain plan on 4 devices, lets `edit` change plan.json (and schedule.json), and
/// returns the one-line error loading it gives ("" when it loads).
std::string load_error(const std::function<void(nlohmann::json&, nlohmann::json&)>& edit) {
  testing::TempDir dir;
  std::string plan_dir = write(options_for(models().chain, 4, "1f1b", "sgd"), dir.file("plan"));
  nlohmann::json plan = read_json(dir.file("plan/plan.json"));
  nlohmann::json schedule = read_json(dir.file("plan/schedule.json"));
  edit(plan, schedule);
  // Sealed again as stagec would: what is tested is what the runtime makes of such a plan.
  write_json(dir.file("plan/schedule.json"), schedule);
  plan["schedule_hash"] = plan::json_hash(schedule);
  testing::write_bytes(dir.file("plan/plan.json"),
                       plan::plan_json_text(nlohmann::ordered_json::parse(plan.dump())));
  try {
    Pipeline::load(plan_dir, cpu_backend(), 1);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// Drops every ALLREDUCE_SHARED from a schedule.json body.
void drop_exchanges(nlohmann::json& schedule) {
  for (auto& device : schedule["devices"]) {
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& in : device["instructions"])
      if (in["op"] != "ALLREDUCE_SHARED") kept.push_back(in);
    device["instructions"] = kept;
  }
}

TEST_CASE("a plan whose holders disagree about a shared weight is refused, naming the field") {
  CHECK(load_error([](nlohmann::json&, nlohmann::json&) {}).empty());
  std::string error = load_error([](nlohmann::json& plan, nlohmann::json&) {
    plan["stages"][3]["shared_weights"][0]["shape"] = {16, 8};
  });
  CHECK(error.find("field 'stages[0].shared_weights[0].shape' is [16,16], but stage 3 holds "
                   "'shared.weight' as [16,8]") != std::string::npos);
  error = load_error([](nlohmann::json& plan, nlohmann::json&) {
    plan["stages"][3]["shared_weights"][0]["dtype"] = "float64";
  });
  CHECK(error.find("field 'stages[0].shared_weights[0].dtype' is float32, but stage 3 holds "
                   "'shared.weight' as float64") != std::string::npos);
  error = load_error([](nlohmann::json& plan, nlohmann::json&) {
    plan["stages"][3]["shared_weights"] = nlohmann::json::array();
  });
  CHECK(error.find("field 'stages[0].shared_weights[0].stages' name stage 3 as a holder of "
                   "'shared.weight', but stages[3].shared_weights does not list it") !=
        std::string::npos);
  error = load_error([](nlohmann::json& plan, nlohmann::json&) {
    plan["stages"][0]["shared_weights"][0]["stages"] = {0};
    plan["stages"][3]["shared_weights"][0]["stages"] = {0};
  });
  CHECK(error.find("field 'stages[0].shared_weights[0].stages' lists 1 stage for "
                   "'shared.weight'; a shared weight has two or more") != std::string::npos);
  // Consistent in plan.json, but not what the stage files hold.
  error = load_error([](nlohmann::json& plan, nlohmann::json&) {
    plan["stages"][0]["shared_weights"][0]["name"] = "no.such.weight";
    plan["stages"][3]["shared_weights"][0]["name"] = "no.such.weight";
  });
  CAPTURE(error);
  CHECK(error.find("stages[0].shared_weights[0] names weight 'no.such.weight', which "
                   "stage_0.onnx does not hold") != std::string::npos);
  // Holders that plan.json does not list: the schedule's exchanges are refused, and without
  // them the two stages that train the weight are.
  error = load_error([](nlohmann::json& plan, nlohmann::json&) {
    for (auto& stage : plan["stages"]) stage["shared_weights"] = nlohmann::json::array();
  });
  CHECK(error.find("ALLREDUCE_SHARED stage 0): the stage holds no shared weight") !=
        std::string::npos);
  error = load_error([](nlohmann::json& plan, nlohmann::json& schedule) {
    for (auto& stage : plan["stages"]) stage["shared_weights"] = nlohmann::json::array();
    drop_exchanges(schedule);
  });
  CHECK(error.find("stages[0] and stages[3] both train weight 'shared.weight', but "
                   "stages[3].shared_weights does not list it") != std::string::npos);
  // A holder without its exchange.
  error = load_error([](nlohmann::json&, nlohmann::json& schedule) { drop_exchanges(schedule); });
  CHECK(error.find("stage 0 holds shared weights but has no ALLREDUCE_SHARED") !=
        std::string::npos);
  // Plans of format 2 (before shared weights were recorded) are refused.
  error = load_error([](nlohmann::json& plan, nlohmann::json&) { plan["format_version"] = 2; });
  CHECK(error.find(fmt::format("field 'format_version' is 2; this build reads version {}",
                               plan::kPlanFormatVersion)) != std::string::npos);
}

TEST_CASE("schedules exchange shared gradients before the optimizer step, without deadlock") {
  schedule::PipelineShape shape{2, 2, 4, true};
  shape.shared_groups = {{0, 2}, {1, 2}};  // stages 0 and 2 share device 0
  schedule::Schedule built = schedule::build_schedule(ScheduleKind::kInterleaved, shape);
  CHECK_NOTHROW(schedule::validate_schedule(built, shape));
  // Device 0: its two exchanges, then its two optimizer steps.
  const auto& device0 = built[0];
  auto position = [&](schedule::Op op, int stage) {
    return std::find(device0.begin(), device0.end(), schedule::Instruction{op, stage, -1}) -
           device0.begin();
  };
  CHECK(position(schedule::Op::kAllReduceShared, 2) < position(schedule::Op::kOptimizerStep, 0));
  // An optimizer step before a partner's exchange on its own device deadlocks.
  schedule::Schedule swapped = built;
  auto& list = swapped[0];
  auto opt0 = std::find(list.begin(), list.end(),
                        schedule::Instruction{schedule::Op::kOptimizerStep, 0, -1});
  auto ex2 = std::find(list.begin(), list.end(),
                       schedule::Instruction{schedule::Op::kAllReduceShared, 2, -1});
  std::iter_swap(opt0, ex2);
  CHECK_THROWS_WITH_AS(schedule::validate_schedule(swapped, shape),
                       doctest::Contains("the ALLREDUCE_SHARED of stage 2 has not run"), Error);
  // The exchange time waits before the optimizer step.
  schedule::StageCosts costs;
  costs.forward_s.assign(4, 1.0);
  costs.backward_input_s.assign(4, 1.0);
  costs.backward_weight_s.assign(4, 1.0);
  double plain = schedule::simulate(built, shape, costs).step_s;
  costs.shared_allreduce_s.assign(4, 5.0);
  CHECK(schedule::simulate(built, shape, costs).step_s == doctest::Approx(plain + 5.0));
  // Groups outside the pipeline are refused.
  shape.shared_groups = {{0, 4}};
  CHECK_THROWS_WITH_AS(schedule::build_schedule(ScheduleKind::kInterleaved, shape),
                       doctest::Contains("shared weight group 0 is [0,4]"), Error);
}

TEST_CASE("the in-process transport sums shared gradients in stage order, alike on every holder") {
  const std::vector<int> holders = {1, 4, 6};
  InProcessTransport transport({}, 1);
  // Values whose sum depends on the order of addition in float32.
  const float parts[3] = {1.0f, 1e8f, -1e8f};
  std::vector<Tensor> sums(3);
  std::vector<std::thread> threads;
  for (int h = 2; h >= 0; --h)
    threads.emplace_back([&, h] {
      auto device = cpu_backend().make_device(h, 1);
      Tensor g = Tensor::owned(DType::kFloat32, {2});
      g.as<float>()[0] = parts[h];
      g.as<float>()[1] = static_cast<float>(h);
      transport.start_shared_sum("w", holders, holders[h], g, *device);
      transport.finish_shared_sum("w", holders[h], g, *device);
      sums[h] = g;
    });
  for (std::thread& t : threads) t.join();
  for (const Tensor& s : sums) {
    CHECK(s.as<float>()[0] == (1.0f + 1e8f) + -1e8f);  // stage order: 0, not 1
    CHECK(s.as<float>()[1] == 3.0f);
  }
  // The next step sums afresh.
  auto device = cpu_backend().make_device(0, 1);
  Tensor g = Tensor::owned(DType::kFloat32, {2});
  CHECK_THROWS_WITH_AS(transport.finish_shared_sum("w", 1, g, *device),
                       doctest::Contains("did not start"), Error);
  transport.start_shared_sum("w", holders, 1, g, *device);
  CHECK_THROWS_WITH_AS(transport.start_shared_sum("w", {1, 4}, 4, g, *device),
                       doctest::Contains("names holders [1,4], another [1,4,6]"), Error);
  transport.abort();
  CHECK_THROWS_AS(transport.finish_shared_sum("w", 1, g, *device), Aborted);
}

}  // namespace
}  // namespace stagecraft::rt
