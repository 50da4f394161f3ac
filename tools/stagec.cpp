// stagec: the offline compiler's command line.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <chrono>

#include "compiler/import.h"
#include "compiler/model_info.h"
#include "compiler/plan/planner.h"
#include "runtime/format/error.h"

namespace {

int run(int argc, char** argv) {
  using namespace stagecraft;
  CLI::App app{
      "stagec - compile an ONNX model into a pipeline-parallel plan.\n\n"
      "  stagec MODEL --info [--batch B] [--dim NAME=V]...      what the model is\n"
      "  stagec MODEL -o PLAN_DIR --devices N [options]          plan it\n\n"
      "Import checks the model (ONNX checker, strict shape inference), binds symbolic input dims\n"
      "from --batch and --dim, and folds the shape arithmetic exporters emit into constants.\n"
      "Planning costs every op on the device (analytic roofline), splits the graph into\n"
      "devices x chunks stages (exact over cuts of a topological order, memory a hard limit),\n"
      "builds the schedule, simulates it, and writes PLAN_DIR/{plan.json,schedule.json,stage_K.onnx}.\n"
      "Inspect a plan with stagedump PLAN_DIR.",
      "stagec"};
  std::string model_path;
  bool info = false, json = false, dry_run = false;
  std::optional<int64_t> batch;
  std::vector<std::string> dims;
  std::string out_dir;
  plan::PlanOptions po;
  app.add_option("model", model_path, "ONNX model file (.onnx); external weight files must sit in its folder")
      ->required();
  app.add_flag("--info", info,
               "print what the model is: opset, inputs/outputs with bound shapes, node count by op, "
               "parameters, forward FLOPs, which dims were bound");
  app.add_flag("--json", json, "with --info: print the same facts as one JSON object");
  app.add_option("--batch", batch,
                 "global batch: binds the first dim of every input whose first dim is symbolic (when "
                 "planning, each microbatch gets batch/microbatches)");
  app.add_option("--dim", dims,
                 "bind a symbolic dim by name, NAME=VALUE (e.g. --dim seq=512), or an unnamed one "
                 "as INPUT:INDEX=VALUE; repeatable");
  app.add_option("-o,--output", out_dir, "plan directory to write (replaced atomically if it holds a plan)");
  app.add_option("--devices", po.devices, "pipeline devices P")->check(CLI::PositiveNumber);
  app.add_option("--objective", po.objective, "speed: shortest predicted step; memory: smallest peak per device")
      ->check(CLI::IsMember({"speed", "memory"}));
  app.add_option("--schedule", po.schedule,
                 "gpipe (SageMaker's 'simple') | 1f1b (SageMaker's 'interleaved') | interleaved (Megatron "
                 "virtual stages) | zb-h1 | inference; default 1f1b with --train, else inference");
  app.add_option("--chunks", po.chunks, "V model chunks per device for --schedule interleaved (default 2)");
  app.add_option("--microbatches", po.microbatches, "M microbatches per step (default: the device count)");
  app.add_flag("--train", po.training, "plan training: forward, backward and optimizer step");
  app.add_option("--optimizer", po.optimizer, "with --train: sgd | momentum | adam | adamw | adam8bit (default adamw)");
  app.add_option("--precision", po.precision, "fp32 | mixed (16-bit compute, fp32 master weights)");
  app.add_option("--device-spec", po.device_spec,
                 "h100 | h200 | a100-80g | a100-40g | v100-16g | cpu, or a JSON file with peak_flops_fp32, "
                 "peak_flops_fp16, memory_bandwidth, memory_bytes, launch_overhead_s, efficiency");
  app.add_option("--cluster", po.cluster,
                 "JSON file: devices_per_node and the intra/inter-node link bandwidth and latency "
                 "(default: the device kind's NVLink/InfiniBand figures)");
  app.add_option("--split-after", po.split_after, "manual split points: node names, comma separated")
      ->delimiter(',');
  app.add_flag("--dry-run", dry_run, "plan and print, writing nothing");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  ImportOptions options;
  options.batch = batch;
  for (const auto& d : dims) parse_dim_binding(d, options);
  if (json && !info) fail(ErrorKind::kUsage, "--json needs --info (stagedump PLAN_DIR --json shows a plan)");
  if (info) {
    ImportedModel model = import_model(model_path, options);
    ModelInfo facts = describe_model(model);
    fmt::print("{}", json ? to_json(facts).dump(2) + "\n" : render_text(facts));
    return 0;
  }
  if (out_dir.empty() && !dry_run) {
    fail(ErrorKind::kUsage, "nothing to do: give --info, -o PLAN_DIR to write a plan, or --dry-run");
  }
  po.model_path = model_path;
  po.batch = batch;
  po.dims = options.dims;
  auto start = std::chrono::steady_clock::now();
  plan::PlannedModel planned = plan::make_plan(po);
  double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("{}", plan::summarize(planned.plan));
  if (dry_run) {
    fmt::print("planned in {:.2f} s (dry run: nothing written)\n", plan_s);
    return 0;
  }
  plan::write_plan(planned, out_dir);
  fmt::print("planned in {:.2f} s; wrote {} (inspect with: stagedump {})\n", plan_s, out_dir, out_dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return stagecraft::run_main("stagec", [&] { return run(argc, argv); });
}
