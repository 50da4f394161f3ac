// Planner edge cases on hostile or broken models (issue 17, finding 8): each is refused with one
// line before a plan the runtime would refuse is written, and a stage's graph outputs count in
// its memory.
#include <doctest/doctest.h>

#include "compiler/plan/planner.h"
#include "runtime/format/error.h"
#include "tests/test_util.h"

namespace stagecraft::plan {
namespace {

/// Plans the model at `path` (inference, one device) expecting an Error of `kind` with `needle`.
void expect_refused(PlanOptions o, ErrorKind kind, const std::string& needle) {
  try {
    make_plan(o);
    FAIL("planned; expected: " << needle);
  } catch (const Error& e) {
    std::string what = e.what();
    INFO(what);
    CHECK(e.kind() == kind);
    CHECK(what.find(needle) != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
}

PlanOptions options_for(const std::string& path) {
  PlanOptions o;
  o.model_path = path;
  o.devices = 1;
  o.microbatches = 1;
  return o;
}

TEST_CASE("a model without graph inputs is refused with one line") {
  // Issue 17: exited 70 with "internal error: vector::_M_range_check".
  onnx::ModelProto m = testing::relu_model(13);
  auto* g = m.mutable_graph();
  g->clear_input();
  g->clear_node();
  g->clear_output();
  testing::add_float_initializer(g, "w", {2, 4});
  testing::add_node(g, "Relu", {"w"}, {"y"}, "relu");
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {2, 4});
  testing::TempDir dir;
  testing::write_model(m, dir.file("m.onnx"));
  expect_refused(options_for(dir.file("m.onnx")), ErrorKind::kModel,
                 "m.onnx: the model has no graph inputs (every value is a constant)");
}

TEST_CASE("a model whose fixed batch is 0 is refused before a plan is written") {
  // Issue 17: planned with microbatch_size 0, a plan the runtime refuses.
  onnx::ModelProto m = testing::relu_model(13);
  auto* dims = m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type();
  dims->mutable_shape()->mutable_dim(0)->set_dim_value(0);
  auto* out = m.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type();
  out->mutable_shape()->mutable_dim(0)->set_dim_value(0);
  testing::TempDir dir;
  testing::write_model(m, dir.file("m.onnx"));
  expect_refused(options_for(dir.file("m.onnx")), ErrorKind::kModel,
                 "input 'x' has the fixed shape [0,4], a batch of 0");
}

TEST_CASE("a stage's graph outputs count in its memory: a 32 TiB output does not fit") {
  // Issue 17: x [batch, 1] -> Expand to [batch, 2^42] was planned as a few hundred bytes, the
  // graph output counted nowhere; stagerun then died allocating it.
  onnx::ModelProto m = testing::relu_model(13);
  auto* g = m.mutable_graph();
  g->clear_node();
  g->clear_output();
  g->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)
      ->set_dim_value(1);
  testing::add_int64_initializer(g, "wide", {2, int64_t{1} << 42});
  testing::add_node(g, "Expand", {"x", "wide"}, {"y"}, "expand");
  testing::add_tensor_info(g->add_output(), "y", onnx::TensorProto::FLOAT, {-1, -1});
  testing::TempDir dir;
  testing::write_model(m, dir.file("m.onnx"));
  PlanOptions o = options_for(dir.file("m.onnx"));
  o.batch = 2;
  // The weights are the Expand's shape operand, which the stage holds.
  expect_refused(o, ErrorKind::kPlan,
                 "device 0 (stage 0) peaks at 32.0 TiB, 0.000 ms into the step: weights 16 B, "
                 "communication 32.0 TiB; device has");
  // A small output still plans, and its bytes are in the stage's communication.
  g->mutable_initializer(0)->set_int64_data(1, 1024);
  testing::write_model(m, dir.file("small.onnx"));
  o.model_path = dir.file("small.onnx");
  PlannedModel planned = make_plan(o);
  REQUIRE(planned.plan.stages.size() == 1);
  CHECK(planned.plan.stages[0].memory.communication == 2 * 1024 * 4);
}

}  // namespace
}  // namespace stagecraft::plan
