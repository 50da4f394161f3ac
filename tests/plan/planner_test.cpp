// The planning driver on the checked-in samples: every schedule and objective, baselines,
// refusals with the numbers, manual split points, and the plan directory on disk.
#include "compiler/plan/planner.h"

#include <doctest/doctest.h>
#include <onnx/checker.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::plan {
namespace {

std::string sample(const std::string& name) { return std::string(STAGECRAFT_SAMPLES) + "/" + name; }

/// The ToyModel at global batch 8 in 2 microbatches, inference on `devices` devices.
PlanOptions toy_options(int devices) {
  PlanOptions o;
  o.model_path = sample("toy.onnx");
  o.devices = devices;
  o.batch = 8;
  o.microbatches = 2;
  return o;
}

PlanOptions gpt_options(int devices, const std::string& schedule, bool training) {
  PlanOptions o;
  o.model_path = sample("gpt_tiny.onnx");
  o.devices = devices;
  o.schedule = stagecraft::parse_schedule(schedule);
  o.training = training;
  o.microbatches = 2 * devices;
  o.batch = 4 * devices;
  o.dims["seq"] = 16;
  return o;
}

TEST_CASE("the GPT sample plans for 1, 2 and 4 devices under every schedule and objective") {
  for (int devices : {1, 2, 4}) {
    for (const char* schedule : {"gpipe", "1f1b", "interleaved", "zb-h1", "inference"}) {
      for (const char* objective : {"speed", "memory"}) {
        CAPTURE(devices);
        CAPTURE(schedule);
        CAPTURE(objective);
        bool training = std::string(schedule) != "inference";
        PlanOptions o = gpt_options(devices, schedule, training);
        o.objective = stagecraft::parse_objective(objective);
        PlannedModel planned = make_plan(o);
        const Plan& p = planned.plan;
        int chunks = std::string(schedule) == "interleaved" ? 2 : 1;
        REQUIRE(static_cast<int>(p.stages.size()) == devices * chunks);
        CHECK_NOTHROW(validate_plan(p, "plan.json"));
        std::size_t nodes = 0;
        for (const auto& st : p.stages) {
          CHECK(!st.nodes.empty());
          CHECK(st.device == st.index % devices);
          nodes += st.nodes.size();
        }
        CHECK(nodes == planned.model.graph.live_nodes());
        CHECK(p.predicted.step_ms > 0);
        CHECK(p.predicted.samples_per_s > 0);
        CHECK(p.predicted.bubble_fraction >= 0);
        CHECK(p.predicted.bubble_fraction < 1);
        if (devices == 1) CHECK(p.predicted.bubble_fraction == doctest::Approx(0).epsilon(1e-9));
        if (training) CHECK(p.stages[0].bwd_ms > 0);
      }
    }
  }
}

TEST_CASE(
    "time-balanced splits are at least as fast as the parameter- and op-count-balanced ones") {
  for (const char* model : {"gpt_tiny.onnx", "resnet_small.onnx"}) {
    CAPTURE(model);
    PlanOptions o = gpt_options(4, "1f1b", true);
    o.model_path = sample(model);
    if (std::string(model) != "gpt_tiny.onnx") o.dims.clear();
    Plan p = make_plan(o).plan;
    MESSAGE(std::string(model) << ": ours " << p.predicted.step_ms << " ms, parameters "
                               << p.baseline_parameters.step_ms << " ms, uniform "
                               << p.baseline_uniform.step_ms << " ms");
    CHECK(p.predicted.step_ms <= p.baseline_parameters.step_ms * (1 + 1e-9));
    CHECK(p.predicted.step_ms <= p.baseline_uniform.step_ms * (1 + 1e-9));
    CHECK(p.baseline_parameters.split_after.size() == 3);
  }
}

TEST_CASE("a model that fits on no split is refused with the stage, its anatomy and the capacity") {
  testing::TempDir dir;
  PlanOptions o = gpt_options(2, "1f1b", true);
  o.device_spec = testing::device_file(dir, 100000, {"tiny", 1e12, 2e12, 1e11, 1e-6});
  // The refusal's message (a plan error: FAIL when the plan fits).
  auto refusal = [](const PlanOptions& options) -> std::string {
    try {
      make_plan(options);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kPlan);
      return e.what();
    }
    FAIL("a 100 kB device fit the model");
    return "";
  };
  {
    const std::string what = refusal(o);
    INFO(what);
    CHECK(what.find("no split into 2 stages fits") != std::string::npos);
    CHECK(what.find("weights") != std::string::npos);
    CHECK(what.find("microbatches in flight; device has 97.7 KiB") != std::string::npos);
    CHECK(what.find("(use more devices, --recompute auto, --precision mixed, a lighter "
                    "--optimizer, or fewer --microbatches)") != std::string::npos);
  }
  // The suggestions leave out what the command already asked for.
  o.recompute = Recompute::kAuto;
  o.precision = Precision::kMixed;
  o.optimizer = OptimizerKind::kSgd;
  {
    const std::string what = refusal(o);
    INFO(what);
    CHECK(what.find("(use more devices, or fewer --microbatches)") != std::string::npos);
  }
  // GPipe holds every microbatch until the backwards: 1F1B is one more way.
  o.schedule = stagecraft::parse_schedule("gpipe");
  {
    const std::string what = refusal(o);
    INFO(what);
    CHECK(what.find("(use more devices, fewer --microbatches, or --schedule 1f1b (fewer "
                    "microbatches in flight))") != std::string::npos);
  }
}

TEST_CASE("bad planning options are refused with the flag named") {
  auto refused = [](PlanOptions o, const std::string& needle) {
    try {
      make_plan(o);
      FAIL("accepted: " << needle);
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  PlanOptions o = gpt_options(2, "1f1b", true);
  o.batch = 7;
  refused(o, "--batch 7 is not divisible by --microbatches 4");
  o = gpt_options(2, "1f1b", false);
  refused(o,
          "--schedule 1f1b: schedule '1f1b' is for training; an inference plan uses 'inference'");
  o = gpt_options(2, "inference", true);
  refused(o, "--schedule inference: schedule 'inference' runs forwards only");
  o = gpt_options(2, "1f1b", true);
  o.chunks = 3;
  refused(o, "--schedule 1f1b: schedule '1f1b' runs 1 chunk per device, not 3; use 'interleaved'");
  o = gpt_options(2, "interleaved", true);
  o.microbatches = 3;
  o.batch = 6;
  refused(o, "needs the microbatches (M=3) to be a multiple of the devices (P=2)");
  o = gpt_options(2, "1f1b", true);
  o.split_after = {"no-such-node"};
  refused(o, "--split-after 'no-such-node' names no node");
  o = gpt_options(200, "inference", false);
  o.microbatches = 1;
  o.batch = 1;
  refused(o, "200 stages (200 devices x 1 chunks) for a model of");
  o = gpt_options(2, "inference", false);
  o.recompute = Recompute::kAll;
  refused(o, "--recompute all needs --train");
}

TEST_CASE("manual split points are honoured and still predicted") {
  PlanOptions o = toy_options(2);
  PlannedModel auto_plan = make_plan(o);
  o.split_after = {auto_plan.plan.stages[0].nodes.front()};
  PlannedModel manual = make_plan(o);
  CHECK(manual.plan.stages[0].nodes.size() == 1);
  CHECK(manual.plan.stages[0].why.find("as --split-after asked") != std::string::npos);
  CHECK(manual.plan.predicted.step_ms > 0);
}

TEST_CASE("the plan directory holds valid stage models and a loadable plan") {
  testing::TempDir dir;
  PlanOptions options = gpt_options(2, "1f1b", true);
  options.loss.kind = "cross-entropy";
  PlannedModel planned = make_plan(options);
  std::string out = dir.file("plan");
  write_plan(planned, out);
  Plan loaded = load_plan(out);
  CHECK(loaded.stages.size() == 2);
  for (const auto& st : loaded.stages) {
    CHECK_NOTHROW(onnx::checker::check_model(out + "/" + st.file));
    CHECK(st.file_hash.rfind("fnv1a64:", 0) == 0);
  }
  CHECK(std::filesystem::exists(out + "/schedule.json"));
  // Re-planning into the same directory replaces it; a foreign directory is never replaced.
  write_plan(planned, out);
  std::filesystem::create_directory(dir.file("mine"));
  std::ofstream(dir.file("mine/notes.txt")) << "keep me";
  CHECK_THROWS_WITH_AS(write_plan(planned, dir.file("mine")),
                       doctest::Contains("refusing to replace it"), Error);
  CHECK(std::filesystem::exists(dir.file("mine/notes.txt")));
}

TEST_CASE("inference working memory is the stage's arena, planned by liveness") {
  PlanOptions o = toy_options(1);
  Plan p = make_plan(o).plan;
  // Gemm [4,10] and Relu [4,10] are live together (2 x 160 B, each rounded up to 192 for
  // alignment); the final Gemm output is a stage output, outside the arena.
  REQUIRE(p.stages.size() == 1);
  const Stage& stage = p.stages[0];
  CHECK(stage.arena_bytes == 384);
  CHECK(stage.memory.temporary == stage.arena_bytes);
  REQUIRE(stage.arena.size() == 2);
  CHECK(stage.arena[0].offset != stage.arena[1].offset);
  for (const ArenaTensor& t : stage.arena) CHECK(t.bytes == 160);
  o.training = true;
  o.schedule = stagecraft::ScheduleKind::k1F1B;
  p = make_plan(o).plan;
  // Training's forward runs the values its backward does not read in the same arena (here both
  // Gemm [4,10] and Relu [4,10]: the backward reads the Relu's input, which the Gemm's gradient
  // reads too, but the arena is planned for the whole forward); the backward (no loss in this
  // dry run: one gradient buffer of the largest tensor, 160 B) fits in it.
  CHECK(p.stages[0].memory.temporary == 384);
}

TEST_CASE(
    "recomputation keeps fewer activations and costs a forward: auto picks the stages that need "
    "it") {
  PlanOptions o = gpt_options(2, "1f1b", true);
  o.dims["seq"] = 32;
  o.device_spec = "cpu";
  Plan none = make_plan(o).plan;
  o.recompute = stagecraft::Recompute::kAll;
  // The same split, so each stage compares with itself (left free, the planner may cut
  // elsewhere once recomputation changes the stages' costs).
  o.split_after = none.predicted.split_after;
  Plan all = make_plan(o).plan;
  o.split_after.clear();
  REQUIRE(none.stages.size() == 2);
  REQUIRE(all.stages.size() == 2);
  for (std::size_t k = 0; k < 2; ++k) {
    CAPTURE(k);
    CHECK(!none.stages[k].recompute);
    CHECK(all.stages[k].recompute);
    CHECK(all.stages[k].nodes == none.stages[k].nodes);  // the same split
    // Lower where more than one microbatch is in flight. 1F1B's last stage holds one: its
    // inputs, then that microbatch rebuilt for its backward, which is what it held without
    // recomputation (the inputs are counted with the activations either way).
    if (none.stages[k].in_flight > 1) {
      CHECK(all.stages[k].memory.activations < none.stages[k].memory.activations);
    } else {
      CHECK(all.stages[k].memory.activations == none.stages[k].memory.activations);
    }
    CHECK(all.stages[k].bwd_ms == doctest::Approx(none.stages[k].bwd_ms + none.stages[k].fwd_ms));
    CHECK_NOTHROW(validate_plan(all, "plan.json"));
  }
  CHECK(all.predicted.step_ms > none.predicted.step_ms);
  CHECK(all.predicted.device_peak_bytes[0] < none.predicted.device_peak_bytes[0]);
  // The field goes through plan.json.
  Plan back = plan_from_json(nlohmann::json::parse(to_json(all).dump()), "plan.json");
  CHECK(back.stages[0].recompute);

  // A device between the first stage's needs with recomputation and without (and above the
  // second stage's without): auto recomputes the first stage only.
  int64_t t0 = none.stages[0].memory.total(), t1 = none.stages[1].memory.total();
  int64_t r0 = all.stages[0].memory.total();
  CAPTURE(t0);
  CAPTURE(t1);
  CAPTURE(r0);
  REQUIRE(std::max(t1, r0) < t0);
  int64_t capacity = (std::max(t1, r0) + t0) / 2;
  testing::TempDir dir;
  o.device_spec = testing::device_file(dir, capacity);
  o.split_after = none.predicted.split_after;
  o.recompute = stagecraft::Recompute::kNone;
  CHECK_THROWS_AS(make_plan(o), Error);
  o.recompute = stagecraft::Recompute::kAuto;
  Plan picked = make_plan(o).plan;
  REQUIRE(picked.stages.size() == 2);
  CHECK(picked.stages[0].recompute);
  CHECK(!picked.stages[1].recompute);
  for (const Stage& st : picked.stages) CHECK(st.memory.total() <= capacity);
  // A device that holds everything: auto recomputes nothing.
  o.device_spec = "cpu";
  o.split_after.clear();
  for (const Stage& st : make_plan(o).plan.stages) CHECK(!st.recompute);
  // The memory objective recomputes wherever that lowers the stage's memory: 1F1B's first stage
  // (several microbatches in flight), not its last (one in flight: recomputing only adds).
  o.objective = stagecraft::Objective::kMemory;
  o.split_after = none.predicted.split_after;
  Plan smallest = make_plan(o).plan;
  REQUIRE(smallest.stages.size() == 2);
  CHECK(smallest.stages[0].recompute);
  CHECK(!smallest.stages[1].recompute);
  CHECK(smallest.predicted.peak_memory_bytes < none.predicted.peak_memory_bytes);
}

}  // namespace
}  // namespace stagecraft::plan

namespace stagecraft::plan {
namespace {

TEST_CASE("training a model with no trainable weights is refused") {
  testing::TempDir dir;
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  auto* g = model.mutable_graph();
  g->set_name("no_weights");
  testing::add_tensor_info(g->add_input(), "x", onnx::TensorProto::FLOAT, {4, 3});
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {4, 3});
  testing::add_node(g, "Relu", {"x"}, {"y"}, "relu");
  testing::write_model(model, dir.file("m.onnx"));
  PlanOptions o;
  o.model_path = dir.file("m.onnx");
  o.devices = 1;
  o.training = true;
  o.loss.kind = "mse";
  o.device_spec = "cpu";
  CHECK_THROWS_WITH_AS(make_plan(o), doctest::Contains("no trainable weights"), Error);
}

}  // namespace
}  // namespace stagecraft::plan

namespace stagecraft::plan {
namespace {

TEST_CASE("baselines are costed like the plan: one device, one split, the same peak and step") {
  for (bool training : {false, true}) {
    CAPTURE(training);
    PlanOptions o = gpt_options(1, training ? "1f1b" : "inference", training);
    o.device_spec = "cpu";
    Plan p = make_plan(o).plan;
    CHECK(p.predicted.peak_memory_bytes > 0);
    for (const Prediction* b : {&p.baseline_parameters, &p.baseline_uniform}) {
      CHECK(b->peak_memory_bytes == p.predicted.peak_memory_bytes);
      CHECK(b->step_ms == doctest::Approx(p.predicted.step_ms));
    }
  }
}

}  // namespace
}  // namespace stagecraft::plan

namespace stagecraft::plan {
namespace {

// The GPT sample trained by 2 replicas of a 2-device 1F1B pipeline, global batch 16.
PlanOptions data_parallel_options() {
  PlanOptions o = gpt_options(2, "1f1b", true);
  o.devices = 4;
  o.data_parallel = 2;
  o.microbatches = 2;
  o.batch = 16;
  o.loss.kind = "cross-entropy";
  return o;
}

TEST_CASE(
    "the placement of ranks: the identity on one node, else the one with the shorter predicted "
    "step") {
  PlanOptions o = data_parallel_options();
  o.device_spec = "cpu";
  SUBCASE("one node (cpu's default cluster): pipelines on consecutive ranks, nothing to choose") {
    PlannedModel planned = make_plan(o);
    CHECK(planned.plan.placement == std::vector<int>{0, 1, 2, 3});
    CHECK(planned.placement_choice.empty());
  }
  // 2 devices per node, a network 8x slower than the node's link.
  o.cluster = sample("../specs/cpu_2_per_machine.json");
  auto step_with = [&](PlanOptions options, const std::vector<int>& placement) {
    // The other placement's step, as the choice line reports it.
    PlannedModel planned = make_plan(options);
    CAPTURE(planned.placement_choice);
    REQUIRE(!planned.placement_choice.empty());
    CHECK(planned.plan.placement == placement);
    CHECK_NOTHROW(validate_plan(planned.plan, "plan.json"));
    return planned;
  };
  SUBCASE("training: the gradients' all-reduce outweighs the activations: replicas side by side") {
    PlannedModel planned = step_with(o, {0, 2, 1, 3});
    CHECK(planned.placement_choice.find(
              "placement: each device's replicas on neighbouring ranks") == 0);
    // The all-reduce now runs inside a node: the intra-node ring's time, not the network's.
    for (const Stage& st : planned.plan.stages) CHECK(st.allreduce_ms > 0);
    PlanOptions identity = o;
    identity.cluster.clear();  // one node: the identity, every link the node's
    CHECK(planned.plan.predicted.step_ms >= make_plan(identity).plan.predicted.step_ms - 1e-9);
  }
  SUBCASE("inference: only activations cross: each pipeline inside a node") {
    o.training = false;
    o.schedule = ScheduleKind::kInference;
    o.loss.kind.clear();
    PlannedModel planned = step_with(o, {0, 1, 2, 3});
    CHECK(planned.placement_choice.find("placement: each pipeline on neighbouring ranks") == 0);
  }
}

TEST_CASE("data parallelism: R replicas of a P-device pipeline, the all-reduce counted") {
  PlanOptions o = data_parallel_options();
  o.training_config.lr = 0.001;
  PlannedModel planned = make_plan(o);
  const Plan& p = planned.plan;
  CHECK(p.devices == 2);
  CHECK(p.data_parallel == 2);
  CHECK(p.batch == 16);
  CHECK(p.microbatch_size == 4);  // 16 = 2 replicas x 2 microbatches x 4
  CHECK_NOTHROW(validate_plan(p, "plan.json"));
  CHECK(p.training_config.lr == 0.001);  // no scaling by default
  CHECK(p.training_config.lr_scaling == "none");
  // Every stage all-reduces its gradients after its last backward, before its optimizer step.
  for (const auto& list : planned.schedule) {
    int all_reduce = -1, optimizer = -1, last_backward = -1;
    for (int k = 0; k < static_cast<int>(list.size()); ++k) {
      if (list[k].op == schedule::Op::kAllReduce) all_reduce = k;
      if (list[k].op == schedule::Op::kOptimizerStep) optimizer = k;
      if (list[k].op == schedule::Op::kBackward) last_backward = k;
    }
    CHECK(last_backward < all_reduce);
    CHECK(all_reduce < optimizer);
  }
  // The ring: 2 (R - 1) steps of 1/R of the fp32 gradients over the link between devices d and
  // P + d (one 8-GPU node: NVLink).
  for (const Stage& st : p.stages) {
    CAPTURE(st.index);
    const double bytes = 4.0 * static_cast<double>(st.params);
    const LinkSpec& link = p.cluster.intra_node;
    const double ring_ms = 2.0 * (link.latency_s + bytes / 2 / link.bandwidth) * 1e3;
    CHECK(st.allreduce_ms == doctest::Approx(ring_ms));
    CHECK(st.memory.communication >= static_cast<int64_t>(1.5 * bytes));  // bucket and a chunk
  }
  // The simulation runs it (one bucket: the stages are far below 25 MiB) on the replica link
  // from the end of the stage's last backward; ALLREDUCE waits for what is left of it.
  int seen = 0;
  for (const schedule::TimelineEvent& e : p.timeline) {
    if (e.op != schedule::Op::kAllReduce) continue;
    ++seen;
    double last_backward = 0;
    for (const schedule::TimelineEvent& b : p.timeline)
      if (b.stage == e.stage &&
          (b.op == schedule::Op::kBackward || b.op == schedule::Op::kBackwardWeight))
        last_backward = std::max(last_backward, b.end_s);
    const double allreduce_s = p.stages[static_cast<size_t>(e.stage)].allreduce_ms / 1e3;
    CHECK(e.end_s == doctest::Approx(std::max(e.start_s, last_backward + allreduce_s)));
    CHECK(e.end_s - e.start_s <= allreduce_s * (1 + 1e-9));
  }
  CHECK(seen == 2);
  CHECK(p.predicted.samples_per_s == doctest::Approx(16 / (p.predicted.step_ms / 1e3)));
  // 2 devices per node: with each pipeline on a node the replicas' ring would cross nodes (the
  // network's 5e10 B/s); the planner puts each device's replicas on one node instead (its
  // link's 4.5e11 B/s), which it predicts faster.
  testing::TempDir dir;
  std::ofstream(dir.file("c.json"))
      << R"({"devices_per_node": 2, "intra_node": {"bandwidth": 4.5e11, "latency_s": 3e-6},
             "inter_node": {"bandwidth": 5e10, "latency_s": 5e-6}})";
  PlanOptions across = o;
  across.cluster = dir.file("c.json");
  const Plan q = make_plan(across).plan;
  CHECK(q.placement == std::vector<int>{0, 2, 1, 3});
  for (const Stage& st : q.stages) {
    const double bytes = 4.0 * static_cast<double>(st.params);
    CHECK(st.allreduce_ms == doctest::Approx(2.0 * (3e-6 + bytes / 2 / 4.5e11) * 1e3));
  }
  // --lr-scaling.
  o.lr_scaling = LrScaling::kLinear;
  CHECK(make_plan(o).plan.training_config.lr == doctest::Approx(0.002));
  o.lr_scaling = LrScaling::kSqrt;
  const Plan scaled = make_plan(o).plan;
  CHECK(scaled.training_config.lr == doctest::Approx(0.001 * std::sqrt(2.0)));
  CHECK(scaled.training_config.base_lr == 0.001);
  CHECK(scaled.training_config.lr_scaling == "sqrt");
}

TEST_CASE("data parallelism refuses devices or a batch that do not divide, in one line") {
  auto refused = [](PlanOptions o, const std::string& expected) {
    try {
      make_plan(o);
      FAIL("accepted: " << expected);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kUsage);
      CHECK(std::string(e.what()) == expected);
    }
  };
  PlanOptions o = gpt_options(2, "1f1b", true);
  o.devices = 3;
  o.data_parallel = 2;
  refused(o,
          "--devices 3 is not divisible by --data-parallel 2: each replica runs a pipeline of the "
          "same number of devices");
  o.devices = 4;
  o.microbatches = 4;
  o.batch = 12;
  refused(o,
          "--batch 12 is not divisible by --data-parallel 2 x --microbatches 4 = 8: every "
          "replica's microbatches must be the same size");
}

}  // namespace
}  // namespace stagecraft::plan

namespace stagecraft::plan {
namespace {

TEST_CASE("--data-parallel auto keeps the replica count of the highest predicted throughput") {
  PlanOptions o = gpt_options(2, "1f1b", true);
  o.loss.kind = "cross-entropy";
  o.devices = 4;
  o.microbatches = 2;
  o.batch = 16;
  // Each replica count planned on its own, as auto plans it.
  double best = 0;
  int fastest = 0;
  for (int replicas : {1, 2, 4}) {
    PlanOptions one = o;
    one.data_parallel = replicas;
    const double throughput = make_plan(one).plan.predicted.samples_per_s;
    if (throughput > best) {
      best = throughput;
      fastest = replicas;
    }
  }
  PlanOptions automatic = o;
  automatic.data_parallel_auto = true;
  automatic.data_parallel = 3;  // ignored
  PlannedModel chosen = make_plan(automatic);
  CHECK(chosen.plan.data_parallel == fastest);
  CHECK(chosen.plan.predicted.samples_per_s == doctest::Approx(best));
  const std::string& line = chosen.data_parallel_choice;
  CHECK(line.find(fmt::format("--data-parallel auto: {} replica", fastest)) == 0);
  for (const char* tried : {"1 x 4 devices: step ", "2 x 2 devices: step ", "4 x 1 devices: step "})
    CHECK(line.find(tried) != std::string::npos);
  // A batch that only some replica counts divide: the others say why.
  automatic.batch = 4;  // 4 = 1 x 2 x 2 or 2 x 2 x 1, not 4 x 2 x b
  PlannedModel some = make_plan(automatic);
  CHECK(some.data_parallel_choice.find("4 x 1 devices: --batch 4 is not divisible by "
                                       "--data-parallel 4 x --microbatches 2 = 8") !=
        std::string::npos);
  CHECK(some.plan.data_parallel <= 2);
  // None possible: one line listing every replica count.
  automatic.batch = 3;
  try {
    make_plan(automatic);
    FAIL("a batch of 3 was planned");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kPlan);
    CHECK(std::string(e.what()).find("--data-parallel auto: no replica count of 4 devices can be "
                                     "planned: 1 x 4 devices: --batch 3 is not divisible") == 0);
  }
}

}  // namespace
}  // namespace stagecraft::plan

namespace stagecraft::plan {
namespace {

TEST_CASE("a stage's communication buffers do not grow with the microbatch count") {
  // GPipe's first stage holds every microbatch's activations, but its link back holds at most
  // two gradients (schedule.h's link_capacity) beside the one its backward reads.
  std::vector<std::string> cut;  // the same split at every count
  auto communication = [&](int microbatches) {
    PlanOptions o = gpt_options(2, "gpipe", true);
    o.loss.kind = "cross-entropy";
    o.microbatches = microbatches;
    o.batch = 2 * microbatches;
    o.split_after = cut;
    PlannedModel planned = make_plan(o);
    if (cut.empty()) cut = {planned.plan.stages[0].nodes.back()};
    return planned.plan.stages[0].memory.communication;
  };
  const int64_t four = communication(4);
  CHECK(four > 0);
  CHECK(communication(16) == four);
  CHECK(communication(32) == four);
}

}  // namespace
}  // namespace stagecraft::plan
