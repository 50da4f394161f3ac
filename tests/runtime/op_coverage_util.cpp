// Shared by the op coverage tests (op_coverage*_test.cpp, einsum_test.cpp): a model
// planned on N devices against the unpartitioned run, pipelined training against one device,
// the CUDA backend's acceptance of an op, and the import's refusals.
#include "tests/runtime/op_coverage_util.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "compiler/import.h"
#include "compiler/ir/onnx_bridge.h"
#include "compiler/plan/planner.h"
#include "runtime/core/backend.h"
#include "runtime/core/program.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"
#include "tests/runtime/training_options.h"
#include "tests/test_util.h"

namespace stagecraft::testing {

using rt::Attrs;
using rt::Backend;
using rt::cpu_backend;
using rt::cuda_backend;
using rt::Pipeline;
using rt::Program;
using rt::RunOptions;
using rt::RunReport;
using rt::Tensor;
using rt::ValueInfo;

namespace {

plan::PlanOptions options_for(const std::string& model, int devices, bool training) {
  return training ? training_options(model, devices, "1f1b", "mse")
                  : inference_options(model, devices);
}

double max_difference(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape == b.shape);
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(a.as<float>()[i] - b.as<float>()[i])));
  return worst;
}

}  // namespace

// Plans `model` on `devices`, runs it, and compares every microbatch's outputs with the whole
// model run as one program. Returns how many nodes of `op` the planned model keeps.
int run_against_unpartitioned(const std::string& model, int devices, const std::string& op) {
  testing::TempDir dir;
  plan::PlannedModel planned = plan::make_plan(options_for(model, devices, false));
  REQUIRE(planned.plan.stages.size() == static_cast<size_t>(devices));
  plan::write_plan(planned, dir.file("plan"));
  auto pipeline = Pipeline::load(dir.file("plan"), cpu_backend(), 1);
  std::map<std::string, Tensor> inputs = pipeline->synthetic_inputs();
  RunReport report = pipeline->run(inputs, RunOptions{});

  Program whole =
      Program::from_model(ir::model_from_graph(planned.model.graph), cpu_backend(), model);
  auto device = cpu_backend().make_device(0, 1);
  std::vector<std::byte> arena(static_cast<size_t>(whole.arena_bytes()) + 64);
  for (int mb = 0; mb < planned.plan.microbatches; ++mb) {
    std::vector<Tensor> args;
    for (const ValueInfo& in : whole.inputs())
      args.push_back(slice_rows(inputs.at(in.name), mb * in.shape[0], (mb + 1) * in.shape[0]));
    std::vector<Tensor> want = whole.run(*device, args, arena.data());
    for (size_t k = 0; k < want.size(); ++k) {
      const Tensor& got = report.outputs.at(whole.outputs()[k].name);
      const int64_t rows = want[k].shape[0];
      CHECK(max_difference(slice_rows(got, mb * rows, (mb + 1) * rows), want[k]) <= 1e-5);
      CHECK(max_difference(want[k], Tensor::owned(DType::kFloat32, want[k].shape)) > 0);
    }
  }
  int kept = 0;
  for (ir::NodeId id : planned.model.graph.topological_order())
    kept += planned.model.graph.node(id).op_type == op ? 1 : 0;
  return kept;
}

namespace {

std::vector<double> train(const std::string& model, int devices, int steps) {
  testing::TempDir dir;
  return train_losses(options_for(model, devices, true), steps, dir.file("plan"));
}

}  // namespace

void check_training(const std::string& model) {
  const int steps = 8;
  std::vector<double> reference = train(model, 1, steps);
  REQUIRE(reference.size() == static_cast<size_t>(steps));
  CHECK(reference.back() < reference.front());  // it learns
  std::vector<double> losses = train(model, 2, steps);
  REQUIRE(losses.size() == reference.size());
  for (size_t k = 0; k < losses.size(); ++k) {
    CAPTURE(k);
    CHECK(std::fabs(losses[k] - reference[k]) <= 1e-5 * std::max(1.0, std::fabs(reference[k])));
  }
}

// The CUDA backend takes `op` as the CPU backend does (its kernels: runtime/cuda/), so a plan
// using it runs on either.
void check_cuda_accepts(const std::string& op, std::span<const DType> inputs) {
  const Backend* cuda = cuda_backend();
  if (cuda == nullptr) return;  // a build without the CUDA plugin
  const Attrs none;
  const DType f32[] = {DType::kFloat32};
  CHECK(cuda->check({op, inputs, f32, none}).empty());
  CHECK(cpu_backend().check({op, inputs, f32, none}).empty());
}

void check_plans_and_training(const std::string& model, const std::string& op, int64_t kept) {
  CAPTURE(op);
  CHECK(run_against_unpartitioned(model, 1, op) == kept);
  CHECK(run_against_unpartitioned(model, 2, op) == kept);
  check_training(model);
}

std::string import_message(const samples::ModelBuilder& b, const std::string& path) {
  b.write(path);
  try {
    import_model(path, {});
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);
    return what;
  }
  return std::string("imported");
}

std::string import_message(samples::ModelBuilder& b, const std::string& out,
                           const samples::Shape& y_shape, const std::string& path) {
  b.add_node("Relu", "/out", {out}, {"y"});
  b.add_output("y", onnx::TensorProto::FLOAT, y_shape);
  return import_message(b, path);
}

void check_contains(const std::string& what, const std::string& needle) {
  CAPTURE(what);
  CHECK(what.find(needle) != std::string::npos);
}

}  // namespace stagecraft::testing
