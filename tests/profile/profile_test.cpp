// Measured profiling: the profile database file, signature keys, the profiler over the samples,
// and plans made with the measured cost model.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "compiler/import.h"
#include "compiler/plan/planner.h"
#include "cost_models/device_spec.h"
#include "cost_models/profile_db.h"
#include "runtime/format/error.h"
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

/// The message of the Error `body` throws, with its kind checked.
template <typename Body>
std::string error_of(ErrorKind kind, Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    CHECK(e.kind() == kind);
    return e.what();
  }
  FAIL("no error thrown");
  return "";
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

/// x float32[4,4] -> OP(attributes) -> y, built directly in the IR.
ir::Graph one_op_graph(const std::string& op, std::vector<onnx::AttributeProto> attributes,
                       std::vector<int64_t> shape = {4, 4}) {
  ir::Graph g;
  g.name = "one_op";
  ir::Value x;
  x.name = "x";
  x.dtype = DType::kFloat32;
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
  db.put("MatMul(float32[4,8],float32[8,8])->(float32[4,8])#0", {"MatMul", 0.125, 100});
  db.put("Relu(float32[4,8])->(float32[4,8])#1", {"Relu", 0.0005, 7});
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

  // Saving again replaces the file; open() of a missing file is an empty database.
  back.put("Add(x)#2", {"Add", 1.5, 3});
  back.save(path);
  CHECK(cost::ProfileDb::load(path).size() == 3);
  cost::ProfileDb fresh = cost::ProfileDb::open(dir.file("missing.json"), "cpu", 4);
  CHECK(fresh.size() == 0);
  CHECK(fresh.threads() == 4);
}

TEST_CASE("a corrupt or foreign profile database is refused with the file and the field named") {
  testing::TempDir dir;
  std::string path = dir.file("db.json");

  write_text(path, "{\"format\": \"stagecraft-profile\", \"version\": 1, \"backend\": \"cpu\", \"threads\": 1,");
  std::string msg = error_of(ErrorKind::kFormat, [&] { cost::ProfileDb::load(path); });
  CHECK(msg.find(path) == 0);
  CHECK(msg.find("not valid JSON") != std::string::npos);

  write_text(path, R"({"format": "stagecraft-profile", "version": 2, "backend": "cpu", "threads": 1, "entries": {}})");
  msg = error_of(ErrorKind::kFormat, [&] { cost::ProfileDb::load(path); });
  CHECK(msg.find(path) == 0);
  CHECK(msg.find("field 'version' is 2") != std::string::npos);

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
    profile::ProfileStats first = profile::profile_graph(g, db, 1, [&](int done, int total) {
      ++calls;
      CHECK(done <= total);
    });
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
  cost::RooflineCostModel roofline(cost::device_spec_from_name_or_file("cpu"), cost::Precision::kFp32);
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

}  // namespace
}  // namespace stagecraft
