// Measured profiling: the profile database file, signature keys, the profiler over the samples,
// and plans made with the measured cost model.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "compiler/import.h"
#include "compiler/plan/planner.h"
#include "cost_models/device_spec.h"
#include "cost_models/profile_db.h"
#include "runtime/format/error.h"
#include "tests/error_of.h"
#include "tests/test_util.h"
#include "tools/profile/profiler.h"

namespace stagecraft {
namespace {

namespace fs = std::filesystem;

std::string sample(const std::string& name) { return std::string(STAGECRAFT_SAMPLES) + "/" + name; }

ImportedModel import_sample(const std::string& name, int64_t batch, std::map<std::string, int64_t> dims = {}) {
  ImportOptions o;
  o.batch = batch;
  o.dims = std::move(dims);
  return import_model(sample(name), o);
}

using testing::error_of;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

/// x float32[4,4] -> OP(attributes) -> y, built directly in the IR.
ir::Graph one_op_graph(const std::string& op, std::vector<onnx::AttributeProto> attributes,
                       std::vector<int64_t> shape = {4, 4}, DType dtype = DType::kFloat32) {
  ir::Graph g;
  g.name = "one_op";
  ir::Value x;
  x.name = "x";
  x.dtype = dtype;
  x.shape = shape;
  x.shape_known = true;
  x.is_graph_input = true;
  ir::ValueId xi = g.add_value(x);
  ir::Value y = x;
  y.name = "y";
  y.is_graph_input = false;
  y.is_graph_output = true;
  ir::ValueId yi = g.add_value(y);
  g.inputs.push_back(xi);
  g.outputs.push_back(yi);
  ir::Node n;
  n.name = op + "_node";
  n.op_type = op;
  n.inputs = {xi};
  n.outputs = {yi};
  n.attributes = std::move(attributes);
  g.add_node(std::move(n));
  return g;
}

onnx::AttributeProto int_attr(const std::string& name, int64_t value) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(value);
  return a;
}

TEST_CASE("a profile database survives a save and a load, written atomically") {
  testing::TempDir dir;
  std::string path = dir.file("sub/folder/db.json");  // the folder is created
  cost::ProfileDb db("cpu", 2);
  const std::string matmul = "MatMul(float32[4,8],float32[8,8])->(float32[4,8])#0";
  db.put(matmul, {"MatMul", 0.125, 100, {}});
  db.put("Relu(float32[4,8])->(float32[4,8])#1", {"Relu", 0.0005, 7, {}});
  // Backward entries by input kinds: B and W, B alone, none at all.
  db.put_backward(matmul, "aw", {0.25, 40, 0.375, 30});
  db.put_backward(matmul, "aa", {0.5, 20, 0, 0});
  db.put_backward("Relu(float32[4,8])->(float32[4,8])#1", "a", {});
  CHECK_THROWS_AS(db.put_backward("Add(x)#9", "aa", {1, 1, 0, 0}), Error);  // no forward entry
  db.save(path);
  // Only the file itself: the temporary one was renamed into place.
  int files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    CHECK(e.path().filename() == "db.json");
    ++files;
  }
  CHECK(files == 1);

  cost::ProfileDb back = cost::ProfileDb::load(path);
  CHECK(back.backend() == "cpu");
  CHECK(back.threads() == 2);
  REQUIRE(back.size() == 2);
  const cost::ProfileEntry* e = back.find("MatMul(float32[4,8],float32[8,8])->(float32[4,8])#0");
  REQUIRE(e != nullptr);
  CHECK(e->op == "MatMul");
  CHECK(e->fwd_ms == doctest::Approx(0.125));
  CHECK(e->runs == 100);
  CHECK(back.find("nothing") == nullptr);
  REQUIRE(e->backward.size() == 2);
  const cost::BackwardEntry* aw = back.find_backward(matmul, "aw");
  REQUIRE(aw != nullptr);
  CHECK(aw->input_ms == doctest::Approx(0.25));
  CHECK(aw->input_runs == 40);
  CHECK(aw->weight_ms == doctest::Approx(0.375));
  CHECK(aw->weight_runs == 30);
  const cost::BackwardEntry* aa = back.find_backward(matmul, "aa");
  REQUIRE(aa != nullptr);
  CHECK(aa->input_ms == doctest::Approx(0.5));
  CHECK(aa->weight_runs == 0);
  CHECK(aa->weight_ms == 0);
  const cost::BackwardEntry* none = back.find_backward("Relu(float32[4,8])->(float32[4,8])#1", "a");
  REQUIRE(none != nullptr);
  CHECK(none->input_runs == 0);
  CHECK(none->weight_runs == 0);
  CHECK(back.find_backward(matmul, "wa") == nullptr);
  CHECK(nlohmann::json::parse(std::ifstream(path))["version"] == cost::ProfileDb::kVersion);

  // Saving again replaces the file; open() of a missing file is an empty database.
  back.put("Add(x)#2", {"Add", 1.5, 3, {}});
  back.save(path);
  CHECK(cost::ProfileDb::load(path).size() == 3);
  cost::ProfileDb fresh = cost::ProfileDb::open(dir.file("missing.json"), "cpu", 4);
  CHECK(fresh.size() == 0);
  CHECK(fresh.threads() == 4);
}

TEST_CASE("a database measured with other kernels is measured again, and says so") {
  testing::TempDir dir;
  const std::string path = dir.file("db.json");
  const std::string stamp = profile::kernels_stamp("cpu");
  CHECK(stamp.size() == 16);
  CHECK(stamp != profile::kernels_stamp("cuda"));  // each backend's own kernel sources
  // Written before stamps were kept: no "kernels" field, read as "".
  cost::ProfileDb old("cpu", 1);
  old.put("Relu(float32[4,8])->(float32[4,8])#1", {"Relu", 0.5, 10, {}});
  old.set_instruction_ms({{"FWD", 0.001}});
  old.save(path);
  CHECK(!nlohmann::json::parse(std::ifstream(path)).contains("kernels"));
  cost::ProfileDb db = cost::ProfileDb::load(path);
  CHECK(db.kernels().empty());
  CHECK(profile::refresh_kernels(db, path) ==
        path + ": measured with other cpu kernels (no kernels stamp; these are " + stamp +
            "): its 1 signatures and calibrations are measured again");
  CHECK(db.size() == 0);
  CHECK(db.instruction_ms().empty());
  CHECK(db.kernels() == stamp);
  // This build's: kept, and the stamp survives a save and a load.
  db.put("Relu(float32[4,8])->(float32[4,8])#1", {"Relu", 0.25, 10, {}});
  db.save(path);
  cost::ProfileDb again = cost::ProfileDb::load(path);
  CHECK(again.kernels() == stamp);
  CHECK(profile::refresh_kernels(again, path).empty());
  CHECK(again.size() == 1);
  // Another build's stamp: measured again.
  again.set_kernels("0123456789abcdef");
  CHECK(profile::refresh_kernels(again, path)
            .find("(kernels 0123456789abcdef; these are " + stamp + ")") != std::string::npos);
  CHECK(again.size() == 0);
  // An empty database just takes the stamp.
  cost::ProfileDb empty("cpu", 1);
  CHECK(profile::refresh_kernels(empty, path).empty());
  CHECK(empty.kernels() == stamp);
}

TEST_CASE("a corrupt or foreign profile database is refused with the file and the field named") {
  testing::TempDir dir;
  std::string path = dir.file("db.json");

  write_text(path, "{\"format\": \"stagecraft-profile\", \"version\": 1, \"backend\": \"cpu\", \"threads\": 1,");
  std::string msg = error_of(ErrorKind::kFormat, [&] { cost::ProfileDb::load(path); });
  CHECK(msg.find(path) == 0);
  CHECK(msg.find("not valid JSON") != std::string::npos);

  write_text(path, R"({"format": "stagecraft-profile", "version": 3, "backend": "cpu", "threads": 1, "entries": {}})");
  msg = error_of(ErrorKind::kFormat, [&] { cost::ProfileDb::load(path); });
  CHECK(msg.find(path) == 0);
  CHECK(msg.find("field 'version' is 3") != std::string::npos);

  write_text(path, R"({"format": "something-else", "version": 1, "backend": "cpu", "threads": 1, "entries": {}})");
  msg = error_of(ErrorKind::kFormat, [&] { cost::ProfileDb::load(path); });
  CHECK(msg.find("field 'format'") != std::string::npos);

  write_text(path, R"json({"format": "stagecraft-profile", "version": 1, "backend": "cpu", "threads": 1,
                       "entries": {"Relu(k)": {"op": "Relu", "fwd_ms": "fast", "runs": 3}}})json");
  msg = error_of(ErrorKind::kFormat, [&] { cost::ProfileDb::load(path); });
  CHECK(msg.find(path) == 0);
  CHECK(msg.find("fwd_ms") != std::string::npos);
  CHECK(msg.find("Relu(k)") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);

  // Malformed backward entries: each refused with the entry and the field named.
  auto with_backward = [&](int version, const std::string& backward) {
    write_text(path, fmt::format(R"json({{"format": "stagecraft-profile", "version": {}, "backend": "cpu", "threads": 1,
                       "entries": {{"MatMul(k)": {{"op": "MatMul", "fwd_ms": 0.5, "runs": 3, "backward": {}}}}}}})json",
                                 version, backward));
    return error_of(ErrorKind::kFormat, [&] { cost::ProfileDb::load(path); });
  };
  msg = with_backward(2, R"({"aw": {"input_ms": 0.5, "input_runs": 3, "weight_ms": -1, "weight_runs": 3}})");
  CHECK(msg.find(R"x(entries["MatMul(k)"].backward["aw"].weight_ms)x") != std::string::npos);
  CHECK(msg.find("positive") != std::string::npos);
  msg = with_backward(2, R"({"aw": {"input_ms": 0.5}})");
  CHECK(msg.find("input_ms' is given without 'input_runs'") != std::string::npos);
  msg = with_backward(2, R"({"a?": {}})");
  CHECK(msg.find("\"a?\"") != std::string::npos);
  msg = with_backward(2, R"({"aw": {"input_ms": 0.5, "input_runs": 3, "b_ms": 1}})");
  CHECK(msg.find("unknown field") != std::string::npos);
  msg = with_backward(2, "[]");
  CHECK(msg.find("backward' must be a JSON object") != std::string::npos);
  // Version 1 had no backward entries.
  msg = with_backward(1, R"({"aw": {"input_ms": 0.5, "input_runs": 3}})");
  CHECK(msg.find("unknown field") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);

  // A database measured with another thread count is not mixed with this one.
  cost::ProfileDb two("cpu", 2);
  two.save(path);
  msg = error_of(ErrorKind::kUsage, [&] { cost::ProfileDb::open(path, "cpu", 1); });
  CHECK(msg.find(path) == 0);
  CHECK(msg.find("threads") != std::string::npos);
}

TEST_CASE("signature keys: equal for identical nodes, different for other shapes or attributes") {
  ImportedModel m16 = import_sample("gpt_tiny.onnx", 4, {{"seq", 16}});
  const ir::Graph& g = m16.graph;
  // The GPT's blocks repeat: every op of the second block has the key of its twin in the first.
  std::map<std::string, std::vector<std::string>> keys_by_op;
  for (ir::NodeId id : g.topological_order()) {
    const ir::Node& n = g.node(id);
    keys_by_op[n.op_type].push_back(cost::signature_key(g, n));
  }
  REQUIRE(keys_by_op.count("MatMul"));
  std::set<std::string> distinct(keys_by_op["MatMul"].begin(), keys_by_op["MatMul"].end());
  CHECK(distinct.size() < keys_by_op["MatMul"].size());
  CHECK(keys_by_op["MatMul"].front().rfind("MatMul(float32[", 0) == 0);

  // Another sequence length: the same node has another key.
  ImportedModel m8 = import_sample("gpt_tiny.onnx", 4, {{"seq", 8}});
  auto first_matmul = [](const ir::Graph& graph) {
    for (ir::NodeId id : graph.topological_order())
      if (graph.node(id).op_type == "MatMul") return cost::signature_key(graph, graph.node(id));
    return std::string();
  };
  CHECK(first_matmul(m8.graph) != first_matmul(g));

  // Same shapes, other attributes.
  ir::Graph a0 = one_op_graph("Softmax", {int_attr("axis", 0)});
  ir::Graph a1 = one_op_graph("Softmax", {int_attr("axis", 1)});
  ir::Graph a1_again = one_op_graph("Softmax", {int_attr("axis", 1)});
  a1_again.node(0).name = "renamed";  // names do not enter the key
  CHECK(cost::signature_key(a0, a0.node(0)) != cost::signature_key(a1, a1.node(0)));
  CHECK(cost::signature_key(a1, a1.node(0)) == cost::signature_key(a1_again, a1_again.node(0)));
  ir::Graph wide = one_op_graph("Softmax", {int_attr("axis", 1)}, {4, 8});
  CHECK(cost::signature_key(wide, wide.node(0)) != cost::signature_key(a1, a1.node(0)));
}

TEST_CASE("profiling the toy and GPT samples fills the database, and a second pass measures nothing") {
  testing::TempDir dir;
  std::string path = dir.file("db.json");
  cost::ProfileDb db("cpu", 1);
  for (auto model : {import_sample("toy.onnx", 8), import_sample("gpt_tiny.onnx", 4, {{"seq", 16}})}) {
    const ir::Graph& g = model.graph;
    std::size_t before = db.size();
    int calls = 0;
    auto progress = [&](int done, int total) {
      ++calls;
      CHECK(done <= total);
    };
    profile::ProfileStats first = profile::profile_graph(g, db, 1, profile::Direction::kForward, progress);
    CHECK(first.signatures > 0);
    CHECK(first.measured + first.cached == first.signatures);
    CHECK(first.measured == calls);
    CHECK(db.size() == before + static_cast<std::size_t>(first.measured));
    // Every node's signature is there, with a positive time over at least 3 runs.
    for (ir::NodeId id : g.topological_order()) {
      const cost::ProfileEntry* e = db.find(cost::signature_key(g, g.node(id)));
      REQUIRE(e != nullptr);
      CHECK(e->op == g.node(id).op_type);
      CHECK(e->fwd_ms > 0);
      CHECK(e->runs >= 3);
      CHECK(e->runs <= 100);
    }
    db.save(path);
    cost::ProfileDb reloaded = cost::ProfileDb::load(path);
    profile::ProfileStats second = profile::profile_graph(g, reloaded, 1);
    CHECK(second.measured == 0);
    CHECK(second.cached == second.signatures);
    CHECK(second.signatures == first.signatures);
  }
  // The GPT repeats its blocks: fewer signatures than nodes.
  ImportedModel gpt = import_sample("gpt_tiny.onnx", 4, {{"seq", 16}});
  cost::ProfileDb fresh("cpu", 1);
  profile::ProfileStats stats = profile::profile_graph(gpt.graph, fresh, 1);
  CHECK(static_cast<std::size_t>(stats.signatures) < gpt.graph.live_nodes());
}

TEST_CASE("a node the backend cannot run is one error naming the node and the reason") {
  ir::Graph g = one_op_graph("NoSuchOp", {});
  cost::ProfileDb db("cpu", 1);
  std::string msg = error_of(ErrorKind::kUnsupported, [&] { profile::profile_graph(g, db, 1); });
  CHECK(msg.find("NoSuchOp_node") != std::string::npos);
  CHECK(msg.find("cannot be profiled on the cpu backend") != std::string::npos);
  CHECK(msg.find("cpu kernel") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(db.size() == 0);
}

TEST_CASE("the measured cost model: measured forward, backward in the roofline's proportions") {
  ImportedModel model = import_sample("gpt_tiny.onnx", 4, {{"seq", 16}});
  const ir::Graph& g = model.graph;
  cost::ProfileDb db("cpu", 1);
  profile::profile_graph(g, db, 1);
  cost::RooflineCostModel roofline(cost::device_spec_from_name_or_file("cpu"), Precision::kFp32);
  cost::MeasuredCostModel measured(db, roofline);
  CHECK(measured.name() == "measured(cpu, 1 thread) + roofline ratios for backward");
  int matmuls = 0;
  for (ir::NodeId id : g.topological_order()) {
    const ir::Node& n = g.node(id);
    cost::OpTime t = measured.op_time(g, n);
    cost::OpTime r = roofline.op_time(g, n);
    CHECK(t.forward_s == doctest::Approx(db.find(cost::signature_key(g, n))->fwd_ms * 1e-3));
    CHECK(t.backward_s == doctest::Approx(t.backward_input_s + t.backward_weight_s));
    if (r.backward_s > 0) {
      CHECK(t.backward_s / t.forward_s == doctest::Approx(r.backward_s / r.forward_s));
      CHECK(t.backward_weight_s / t.backward_s == doctest::Approx(r.backward_weight_s / r.backward_s));
    }
    if (n.op_type == "MatMul" && r.backward_weight_s > 0) {
      ++matmuls;
      CHECK(t.backward_weight_s > 0);
    }
  }
  CHECK(matmuls > 0);
  // Forward only (inference plans): the measured forward, no backward, and a name that says so.
  cost::MeasuredCostModel forward(db, roofline, cost::BackwardTimes::kNone);
  CHECK(forward.name() == "measured(cpu, 1 thread), forward");
  for (ir::NodeId id : g.topological_order()) {
    const ir::Node& n = g.node(id);
    cost::OpTime t = forward.op_time(g, n);
    CHECK(t.forward_s == doctest::Approx(db.find(cost::signature_key(g, n))->fwd_ms * 1e-3));
    CHECK(t.backward_s == 0);
    CHECK(t.backward_input_s == 0);
    CHECK(t.backward_weight_s == 0);
  }
  // A signature the database lacks is refused with the node named.
  cost::MeasuredCostModel empty(cost::ProfileDb("cpu", 1), roofline);
  const ir::Node& first = g.node(g.topological_order().front());
  std::string msg = error_of(ErrorKind::kPlan, [&] { empty.op_time(g, first); });
  CHECK(msg.find(first.name) != std::string::npos);
  CHECK(msg.find("profile database") != std::string::npos);
}

TEST_CASE("plans made with measured times record the measured model and positive stage times") {
  testing::TempDir dir;
  std::string path = dir.file("db.json");
  for (bool training : {false, true}) {
    CAPTURE(training);
    plan::PlanOptions o;
    o.model_path = sample("gpt_tiny.onnx");
    o.devices = 2;
    o.batch = 8;
    o.microbatches = 4;
    o.dims["seq"] = 16;
    o.training = training;
    o.device_spec = "cpu";
    std::string name;
    o.cost_model = [&](const ir::Graph& g, const cost::RooflineCostModel& roofline) {
      cost::ProfileDb db = cost::ProfileDb::open(path, "cpu", 1);
      profile::profile_graph(g, db, 1);
      db.save(path);
      auto model = std::make_unique<cost::MeasuredCostModel>(db, roofline);
      name = model->name();
      return model;
    };
    plan::Plan p = plan::make_plan(o).plan;
    CHECK(p.cost_model == name);
    CHECK(p.cost_model.rfind("measured(cpu", 0) == 0);
    REQUIRE(p.stages.size() == 2);
    for (const auto& st : p.stages) {
      CHECK(st.fwd_ms > 0);
      if (training) CHECK(st.bwd_ms > 0);
    }
    CHECK(p.predicted.step_ms > 0);
    CHECK_NOTHROW(plan::validate_plan(p, "plan.json"));
    // The per-op times in the plan are the database's.
    cost::ProfileDb db = cost::ProfileDb::load(path);
    CHECK(db.size() > 0);
  }
}

/// The training graph of a sample as the planner builds it (loss appended), handed to `check`
/// through the cost-model hook; returns the plan made with the model `check` returns.
template <typename Check>
plan::Plan plan_training(const std::string& model, int64_t batch, std::map<std::string, int64_t> dims, Check&& check) {
  plan::PlanOptions o;
  o.model_path = sample(model);
  o.devices = 2;
  o.batch = batch;
  o.microbatches = 2;
  o.dims = std::move(dims);
  o.training = true;
  o.loss.kind = "cross-entropy";
  o.device_spec = "cpu";
  o.cost_model = [&](const ir::Graph& g, const cost::RooflineCostModel& roofline) { return check(g, roofline); };
  return plan::make_plan(o).plan;
}

TEST_CASE("profiling a training plan measures every op's gradient ops, input and weight parts apart") {
  struct Case {
    std::string model;
    int64_t batch;
    std::map<std::string, int64_t> dims;
    std::set<std::string> weighted_ops;  // ops that must show a measured W part
  };
  for (const Case& c : {Case{"mnist_cnn.onnx", 4, {}, {"Conv", "Gemm"}},
                        Case{"gpt_tiny.onnx", 4, {{"seq", 8}}, {"MatMul", "LayerNormalization", "Gather"}}}) {
    CAPTURE(c.model);
    std::map<std::string, int> weighted_seen;
    int activation_only = 0;
    auto check = [&](const ir::Graph& g, const cost::RooflineCostModel& roofline) {
      cost::ProfileDb db("cpu", 1);
      profile::ProfileStats stats = profile::profile_graph(g, db, 1, profile::Direction::kForwardAndBackward);
      CHECK(stats.backward_signatures > 0);
      CHECK(stats.backward_measured == stats.backward_signatures);
      CHECK(stats.backward_cached == 0);
      CHECK(stats.backward_by_ratio.empty());
      cost::MeasuredCostModel measured(db, roofline, cost::BackwardTimes::kMeasured);
      for (ir::NodeId id : g.topological_order()) {
        const ir::Node& n = g.node(id);
        CAPTURE(n.describe(g));
        cost::OpTime t = measured.op_time(g, n);
        CHECK(t.backward_s == doctest::Approx(t.backward_input_s + t.backward_weight_s));
        if (!cost::may_have_backward(g, n)) {
          CHECK(t.backward_s == 0);
          continue;
        }
        const std::string kinds = cost::input_kinds(g, n);
        const cost::BackwardEntry* b = db.find_backward(cost::signature_key(g, n), kinds);
        REQUIRE(b != nullptr);
        // The cost model hands out exactly what was measured, but no input part for the first
        // layer: autodiff writes no gradient of the model's data.
        CHECK(t.backward_input_s ==
              doctest::Approx(cost::reads_only_graph_inputs(g, n, kinds) ? 0.0 : b->input_ms * 1e-3));
        if (n.op_type == "Conv" && kinds[0] == 'a' && g.value(n.inputs[0]).is_graph_input)
          CHECK(t.backward_input_s == 0);
        CHECK(t.backward_weight_s == doctest::Approx(b->weight_ms * 1e-3));
        if (c.weighted_ops.count(n.op_type) && kinds.find('w') != std::string::npos) {
          ++weighted_seen[n.op_type];
          CHECK(b->weight_ms > 0);
          CHECK(b->weight_runs >= 3);
          CHECK(t.backward_weight_s > 0);
          // An activation input (the first layer's graph input included) adds a measured B.
          if (kinds[0] == 'a') {
            CHECK(b->input_ms > 0);
            CHECK(b->input_runs >= 3);
          }
        }
        if (kinds.find('w') == std::string::npos && b->input_runs > 0) {
          ++activation_only;
          CHECK(b->weight_runs == 0);
          CHECK(t.backward_weight_s == 0);
          CHECK(t.backward_input_s > 0);
        }
      }
      // A second pass finds every backward cached.
      profile::ProfileStats again = profile::profile_graph(g, db, 1, profile::Direction::kForwardAndBackward);
      CHECK(again.measured == 0);
      CHECK(again.backward_measured == 0);
      CHECK(again.backward_cached == stats.backward_signatures);
      return std::make_unique<cost::MeasuredCostModel>(db, roofline, cost::BackwardTimes::kMeasured);
    };
    plan::Plan p = plan_training(c.model, c.batch, c.dims, check);
    for (const std::string& op : c.weighted_ops) CHECK_MESSAGE(weighted_seen[op] > 0, op);
    CHECK(activation_only > 0);  // Relu, the loss, attention's MatMul(q, k)
    CHECK(p.cost_model == "measured(cpu, 1 thread), forward and backward");
    for (const auto& st : p.stages) CHECK(st.bwd_ms > 0);
  }
}

TEST_CASE("an op without a gradient kernel falls back to the roofline ratio, reported with the node named") {
  ir::Graph g = one_op_graph("Relu", {}, {4, 4}, DType::kFloat64);  // ReluGrad is float32 only
  // As a stage's input from an earlier stage (a graph input has no gradient to cost).
  g.value(g.node(0).inputs[0]).is_graph_input = false;
  cost::ProfileDb db("cpu", 1);
  profile::ProfileStats stats = profile::profile_graph(g, db, 1, profile::Direction::kForwardAndBackward);
  CHECK(stats.measured == 1);
  CHECK(stats.backward_signatures == 1);
  CHECK(stats.backward_measured == 0);
  REQUIRE(stats.backward_by_ratio.size() == 1);
  const std::string& why = stats.backward_by_ratio[0];
  CHECK(why.find("Relu_node") != std::string::npos);
  CHECK(why.find("ReluGrad") != std::string::npos);
  CHECK(why.find("float64") != std::string::npos);
  CHECK(why.find('\n') == std::string::npos);
  const ir::Node& n = g.node(0);
  CHECK(db.find_backward(cost::signature_key(g, n), cost::input_kinds(g, n)) == nullptr);

  cost::RooflineCostModel roofline(cost::device_spec_from_name_or_file("cpu"), Precision::kFp32);
  cost::MeasuredCostModel measured(db, roofline, cost::BackwardTimes::kMeasured);
  cost::OpTime t = measured.op_time(g, n);
  cost::OpTime r = roofline.op_time(g, n);
  REQUIRE(r.backward_s > 0);
  CHECK(t.backward_s / t.forward_s == doctest::Approx(r.backward_s / r.forward_s));
  // Not recorded, so the next profile tries again.
  CHECK(profile::profile_graph(g, db, 1, profile::Direction::kForwardAndBackward).backward_by_ratio.size() == 1);
  // Ops without a float output or a differentiable input kind are never measured: 0 backward.
  ir::Graph shape = one_op_graph("Shape", {});
  shape.value(1).dtype = DType::kInt64;
  shape.value(1).shape = {2};
  CHECK_FALSE(cost::may_have_backward(shape, shape.node(0)));
  cost::ProfileDb shape_db("cpu", 1);
  CHECK(profile::profile_graph(shape, shape_db, 1, profile::Direction::kForwardAndBackward).backward_signatures == 0);
  cost::MeasuredCostModel shape_costs(shape_db, roofline, cost::BackwardTimes::kMeasured);
  CHECK(shape_costs.op_time(shape, shape.node(0)).backward_s == 0);
}

TEST_CASE("a version-1 database (forward only) still loads and gets its backward entries added") {
  testing::TempDir dir;
  std::string path = dir.file("old.json");
  ImportedModel toy = import_sample("toy.onnx", 4);
  const ir::Graph& g = toy.graph;
  {
    // What an older stagec wrote: forward entries only, version 1.
    cost::ProfileDb forward_only("cpu", 1);
    profile::profile_graph(g, forward_only, 1);
    forward_only.save(path);
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    j["version"] = 1;
    write_text(path, j.dump(1));
  }
  cost::ProfileDb db = cost::ProfileDb::load(path);
  CHECK(db.size() == 3);
  for (const auto& [key, e] : db.entries()) CHECK(e.backward.empty());
  profile::ProfileStats stats = profile::profile_graph(g, db, 1, profile::Direction::kForwardAndBackward);
  CHECK(stats.measured == 0);
  CHECK(stats.cached == stats.signatures);
  CHECK(stats.backward_signatures == 3);  // Gemm, Relu, Gemm: every node has a gradient
  CHECK(stats.backward_measured == 3);
  db.save(path);
  CHECK(nlohmann::json::parse(std::ifstream(path))["version"] == 2);
  cost::ProfileDb back = cost::ProfileDb::load(path);
  for (ir::NodeId id : g.topological_order()) {
    const ir::Node& n = g.node(id);
    const cost::BackwardEntry* b = back.find_backward(cost::signature_key(g, n), cost::input_kinds(g, n));
    REQUIRE(b != nullptr);
    CHECK(b->input_ms > 0);  // the graph input counts as an activation
    if (n.op_type == "Gemm") CHECK(b->weight_ms > 0);
  }
}

}  // namespace
}  // namespace stagecraft
