// stagedump: inspect a plan directory, read the way the runtime reads it.
//
// Views (the text report goes to stdout unless a view is asked for: a view written to a FILE is
// named on stdout, "wrote FILE (...)", or on stderr with --json, whose stdout stays JSON Lines):
//   (default)    header, stage table, memory anatomy, why, cut tensors, shared weights per
//                stage, prediction beside the baselines, ASCII timeline of the predicted
//                schedule
//   --json       the JSON document below instead of the text, on one line (JSON Lines)
//   --dot FILE   Graphviz digraph of the ops in stage clusters ("-": stdout)
//   --trace FILE Chrome trace (Trace Event Format) of the predicted schedule ("-": stdout)
//   --html FILE  one self-contained HTML page ("-": stdout)
//   --torch-csv FILE  the schedule in torch.distributed.pipelining's action-list CSV ("-":
//                stdout), compute actions only or with --torch-csv-form compute_comms the
//                transfers too (compiler/schedule/torch_csv.h)
//   --measured RUN  with --html or --trace: a run of the plan, `stagerun --trace` (every
//                instruction timed) or `stagerun --json` (JSON Lines: step times and per-device
//                figures; HTML only), set beside the prediction; a run of another plan is
//                refused naming RUN and the field (tools/dump/measured.h); twice, a trace
//                and a --json output: both drawn, the trace's instructions with the --json
//                run's device peaks and bubble
//
// The timeline is the plan's own `timeline`: what the planner's simulation predicted, drawn as it
// is (stagedump simulates nothing, so the dump and the plan cannot disagree). See
// tools/dump/view.h.
//
// --json schema (docs/schemas/stagedump.schema.json; times in ms, memory in bytes; keys are
// added without a bump of format_version, tools/json_formats.h):
//   {
//     "format_version": 1,
//     "plan":      {dir, format_version, generator, model_path, objective, schedule, devices,
//                   chunks, microbatches, microbatch_size, batch, training, optimizer,
//                   precision, cost_model},
//     "stages":    [{index, device, chunk, nodes (count), first_node, last_node, params,
//                    fwd_ms, bwd_ms, send_ms, in_flight,
//                    memory_bytes {weights, gradients, optimizer, activations, temporary,
//                                  communication}  (the stage's anatomy: parts, no total),
//                    shared_weights [{name, dtype, shape, stages []}], shared_exchange_ms,
//                    why}],
//     "devices":   [{device, stages [], peak_bytes, peak_ms, in_flight,
//                    parts {weights, gradients, optimizer, activations, recomputed, deferred,
//                           arena, communication}}]  (the one memory figure per device; the
//                   parts, held at its peak, add up to it),
//     "cuts":      [{after_stage, bytes, tensors [{name, dtype, shape, from, to [], bytes}]}],
//     "predicted": {step_ms, bubble_fraction, samples_per_s, peak_memory_bytes,
//                   device_peak_bytes [], fits},
//     "simulated": {step_ms, bubble_fraction, samples_per_s, device_busy_ms [],
//                   device_peak_bytes []}  (the timeline's figures: the prediction's),
//     "timeline":  [{device, op (forward|backward|backward_input|backward_weight|optimizer),
//                    stage, microbatch, start_ms, end_ms}]  (compute events),
//     "baselines": {"parameters": {step_ms, bubble_fraction, samples_per_s, peak_memory_bytes,
//                                  fits, step_ratio (ours / baseline; null if baseline is 0)},
//                   "uniform":    {same}},
//     "ops":       [{name, op_type, stage, fwd_ms, bwd_ms, flops}]
//   }
// "cuts"[c] lists the tensors crossing between stage c and c + 1 (a skip connection appears
// under every cut it crosses); "predicted" is the compiler's figure.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>

#include "compiler/schedule/torch_csv.h"
#include "runtime/format/error.h"
#include "tools/cli_common.h"
#include "tools/dump/render.h"

namespace {

using stagecraft::ErrorKind;

/// Writes `text` to `path`, or to stdout for "-".
/// Writes a view to `path` ("-": stdout); a file is named with its size and what opens it, on
/// stdout in place of the text report (on stderr when stdout carries --json).
void write_output(const std::string& path, const std::string& text, std::string_view what,
                  bool json) {
  if (path == "-") {
    fmt::print("{}", text);
    return;
  }
  std::ofstream out(path, std::ios::binary);
  if (out) out << text;
  if (!out) {
    throw stagecraft::Error(ErrorKind::kIo, fmt::format("cannot write ({})", std::strerror(errno)))
        .in(path);
  }
  fmt::print(json ? stderr : stdout, "wrote {} ({}, {:.1f} KiB)\n", path, what,
             static_cast<double>(text.size()) / 1024);
}

int run(int argc, char** argv) {
  using namespace stagecraft;
  CLI::App app{
      "stagedump - inspect a pipeline plan written by stagec.\n\n"
      "Reads PLAN_DIR/plan.json and schedule.json as the runtime does: the plan is validated\n"
      "(versions, stage indices, devices, tensors crossing stages, node lists) and each stage\n"
      "file is checked against its recorded hash; a bad plan is refused with the file and the\n"
      "field. The timelines draw the plan's predicted timeline as the planner simulated it.\n"
      "Prints a text report on stdout unless another view is written to '-'.",
      "stagedump"};
  std::string plan_dir;
  bool json = false;
  std::optional<std::string> dot, trace, html, torch_csv;
  std::string torch_csv_form = "compute_only";
  std::vector<std::string> measured_paths;
  app.add_option("PLAN_DIR", plan_dir, "plan directory (plan.json, schedule.json, stage_K.onnx)")
      ->required();
  app.add_flag("--json", json,
               "print the plan as one JSON document on one line instead of the text report "
               "(devices, stages, cuts, predicted, simulated, timeline, baselines, ops; schema "
               "in docs/schemas/stagedump.schema.json)");
  app.add_option("--dot", dot,
                 "write a Graphviz digraph of the ops, one coloured cluster per stage with the "
                 "tensors crossing between stages, to FILE ('-': stdout)")
      ->type_name("FILE");
  app.add_option("--trace", trace,
                 "write the predicted timeline as a Chrome trace (Trace Event Format; open in "
                 "ui.perfetto.dev or chrome://tracing), with a --measured run beside it, to FILE "
                 "('-': stdout)")
      ->type_name("FILE");
  app.add_option("--html", html,
                 "write one self-contained HTML page (baselines, stages, cut tensors, memory per "
                 "device, timeline; a --measured run overlaid) to FILE ('-': stdout)")
      ->type_name("FILE");
  app.add_option("--torch-csv", torch_csv,
                 "write the schedule in torch.distributed.pipelining's action-list CSV (one row "
                 "per rank; actions such as 0F1, 1B0, 0I2, 0W2), which torch's "
                 "PipelineScheduleMulti._load_csv runs and stagec --schedule-csv plans, to FILE "
                 "('-': stdout)")
      ->type_name("FILE");
  app.add_option("--torch-csv-form", torch_csv_form,
                 "with --torch-csv: compute_only (F, B, I, W: what torch's _load_csv takes; the "
                 "default) or compute_comms (and SEND_F, RECV_F, SEND_B, RECV_B, REDUCE_GRAD, "
                 "for torch's _PipelineScheduleRuntime)")
      ->type_name("FORM");
  app.add_option("--measured", measured_paths,
                 "with --html or --trace: a run of this plan to set beside the prediction, as "
                 "written by stagerun --trace FILE (every instruction, every step) or stagerun "
                 "--json (step times and device figures; --html only). Give it twice, a trace "
                 "and a --json output, to draw both: the trace's instructions and memory with "
                 "the --json run's device peaks and bubble")
      ->type_name("RUN");
  cli::add_version_flag(app, "stagedump");
  if (std::optional<int> done = cli::parse(app, argc, argv)) return *done;

  std::vector<std::string> to_stdout;
  if (dot == "-") to_stdout.push_back("--dot -");
  if (trace == "-") to_stdout.push_back("--trace -");
  if (html == "-") to_stdout.push_back("--html -");
  if (torch_csv == "-") to_stdout.push_back("--torch-csv -");
  if (torch_csv_form != "compute_only" && torch_csv_form != "compute_comms")
    fail(ErrorKind::kUsage, "--torch-csv-form {}: give compute_only or compute_comms",
         torch_csv_form);
  if (json && !to_stdout.empty()) to_stdout.insert(to_stdout.begin(), "--json");
  if (to_stdout.size() > 1) {
    fail(ErrorKind::kUsage, "{} all write to stdout; give all but one of them a FILE",
         fmt::join(to_stdout, ", "));
  }

  if (!measured_paths.empty() && !trace && !html)
    fail(ErrorKind::kUsage, "--measured sets a run beside --html or --trace; give one of them");
  if (measured_paths.size() > 2)
    fail(ErrorKind::kUsage,
         "--measured is given {} times; it takes one run, or two (a stagerun --trace file and a "
         "stagerun --json output)",
         measured_paths.size());

  dump::PlanView view = dump::load_view(plan_dir);
  std::optional<dump::MeasuredRun> measured;
  if (!measured_paths.empty()) measured = dump::load_measured(measured_paths[0], view);
  if (measured_paths.size() == 2) {
    dump::MeasuredRun second = dump::load_measured(measured_paths[1], view);
    measured = measured->traced ? dump::with_summary(std::move(*measured), second)
                                : dump::with_summary(std::move(second), *measured);
  }
  if (measured && trace && !measured->traced)
    fail(ErrorKind::kUsage,
         "--measured {}: stagerun --json output has no instruction times; --trace needs a "
         "stagerun --trace file (--html takes either)",
         measured_paths[0]);
  const dump::MeasuredRun* run = measured ? &*measured : nullptr;
  if (dot) write_output(*dot, dump::render_dot(view), "Graphviz: dot -Tsvg", json);
  if (trace)
    write_output(*trace, dump::render_trace(view, run).dump(1) + "\n",
                 "Chrome trace: open in Perfetto or chrome://tracing", json);
  if (html) write_output(*html, dump::render_html(view, run), "open it in a browser", json);
  if (torch_csv)
    write_output(*torch_csv,
                 schedule::to_torch_csv(view.schedule, torch_csv_form == "compute_comms"
                                                           ? schedule::TorchCsvForm::kComputeComms
                                                           : schedule::TorchCsvForm::kComputeOnly),
                 "torch.distributed.pipelining schedule CSV: stagec --schedule-csv reads it",
                 json);
  // The text report when no view was asked for (a view to a file says where it went instead).
  if (to_stdout.empty() && (json || (!dot && !trace && !html && !torch_csv))) {
    fmt::print("{}", json ? dump::render_json(view).dump() + "\n" : dump::render_text(view));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return stagecraft::run_main("stagedump", [&] { return run(argc, argv); });
}
