// The default text report of stagedump.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "tools/dump/render.h"

namespace stagecraft::dump {
namespace {

/// A plain text table: a header row, then rows; the first `left` columns align left, the rest
/// (numbers) right. Columns are separated by two spaces, every line indented by two.
class Table {
 public:
  Table(std::vector<std::string> header, size_t left) : left_(left) {
    rows_.push_back(std::move(header));
  }

  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  std::string render() const {
    std::vector<size_t> widths;
    for (const auto& row : rows_) {
      widths.resize(std::max(widths.size(), row.size()), 0);
      for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
    }
    std::string text;
    for (const auto& row : rows_) {
      std::string line = " ";
      for (size_t c = 0; c < row.size(); ++c) {
        line += c < left_ ? fmt::format(" {:<{}}", row[c], widths[c])
                          : fmt::format(" {:>{}}", row[c], widths[c]);
        line += " ";
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      text += line + "\n";
    }
    return text;
  }

 private:
  size_t left_;
  std::vector<std::vector<std::string>> rows_;
};

std::string ms(double value) { return fmt::format("{:.3f}", value); }

std::string percent(double fraction) { return fmt::format("{:.1f}%", 100 * fraction); }

std::string shape_text(const plan::StageTensor& tensor) {
  return fmt::format("{}[{}]", tensor.dtype, fmt::join(tensor.shape, ","));
}

// Where the replicas run, in words: "replica r on ranks r x 2 .. r x 2 + 1" for the identity,
// "device d of replica r on rank d x 2 + r" for replica-major, else the ranks listed.
std::string placement_words(const plan::Plan& plan) {
  const int R = plan.data_parallel, P = plan.devices;
  if (plan.placement == plan::pipeline_major_placement(R, P))
    return fmt::format("replica r on ranks r x {} .. r x {} + {}", P, P, P - 1);
  if (plan.placement == plan::replica_major_placement(R, P))
    return fmt::format("device d of replica r on rank d x {} + r", R);
  return fmt::format("ranks per replica's devices: {}", fmt::join(plan.placement, ", "));
}

std::string header(const PlanView& view) {
  const plan::Plan& plan = view.plan;
  std::string text;
  auto line = [&](std::string_view key, const std::string& value) {
    text += fmt::format("{:<12}{}\n", key, value);
  };
  line("plan", fmt::format("{} (format {}, written by {})", view.plan_dir, plan.format_version,
                           plan.generator));
  line("model", plan.model_hash.empty() ? plan.model_path
                                        : fmt::format("{} ({})", plan.model_path, plan.model_hash));
  line("schedule",
       fmt::format("{}: {} x {} = {}", to_string(plan.schedule), plural(plan.devices, "device"),
                   plural(plan.chunks, "chunk"), plural(plan.stages.size(), "stage")));
  line("batch",
       plan.data_parallel > 1
           ? fmt::format("{} = {} x {} x {} ({})", plan.batch,
                         plural(plan.data_parallel, "replica"),
                         plural(plan.microbatches, "microbatch", "microbatches"),
                         plan.microbatch_size, placement_words(plan))
           : fmt::format("{} = {} x {}", plan.batch,
                         plural(plan.microbatches, "microbatch", "microbatches"),
                         plan.microbatch_size));
  line(plan.training ? "training" : "inference",
       plan.training ? fmt::format("optimizer {}{}, precision {}{}", to_string(plan.optimizer),
                                   clip_words(plan), to_string(plan.precision),
                                   plan.shard_optimizer
                                       ? fmt::format("; optimizer state sharded over {} (ZeRO-1: "
                                                     "each device keeps 1/{} of its stages')",
                                                     plural(plan.data_parallel, "replica"),
                                                     plan.data_parallel)
                                       : "")
                     : fmt::format("precision {}", to_string(plan.precision)));
  line("objective", std::string(to_string(plan.objective)));
  line("cost model", plan.cost_model);
  return text;
}

std::string stage_table(const plan::Plan& plan) {
  // Data-parallel training adds the replicas' exchange: the all-reduce, or with ZeRO-1 the
  // reduce-scatter, the all-gather and the shard of the parameters whose state a replica keeps.
  const bool replicas = plan.training && plan.data_parallel > 1, zero = plan.shard_optimizer;
  std::vector<std::string> header = {"stage",  "device", "first op", "last op", "ops",
                                     "params", "fwd ms", "bwd ms",   "send ms"};
  if (replicas) header.push_back(zero ? "reduce-scatter ms" : "all-reduce ms");
  if (zero) {
    header.push_back("all-gather ms");
    header.push_back("optimizer shard");
  }
  Table table(header, 4);
  for (const plan::Stage& stage : plan.stages) {
    std::vector<std::string> row = {std::to_string(stage.index), std::to_string(stage.device),
                                    stage.nodes.front(),         stage.nodes.back(),
                                    with_commas(stage.nodes.size()), with_commas(stage.params),
                                    ms(stage.fwd_ms),            ms(stage.bwd_ms),
                                    ms(stage.send_ms)};
    if (replicas) row.push_back(ms(stage.allreduce_ms));
    if (zero) {
      row.push_back(ms(stage.allgather_ms));
      const auto& b = stage.optimizer_shards;
      row.push_back(b.size() > 1 ? fmt::format("{} of {}", with_commas(b[1] - b[0]),
                                               with_commas(b.back()))
                                 : "-");
    }
    table.add(row);
  }
  return "\nstages\n" + table.render();
}

/// The one memory figure per device, then the parts it holds at that instant, then what each
/// stage brings to its device's parts.
std::string memory_table(const plan::Plan& plan) {
  Table devices({"device", "peak", "at ms", "weights", "gradients", "optimizer", "activations",
                 "in flight", "recomputed", "deferred", "arena", "comm"},
                1);
  for (const plan::DevicePeak& d : plan.device_memory) {
    const plan::PeakParts& p = d.parts;
    auto bytes = [](int64_t b) { return format_bytes(static_cast<double>(b)); };
    devices.add({std::to_string(d.device), bytes(d.peak_bytes), ms(d.peak_ms), bytes(p.weights),
                 bytes(p.gradients), bytes(p.optimizer), bytes(p.activations),
                 with_commas(d.in_flight), bytes(p.recomputed), bytes(p.deferred), bytes(p.arena),
                 bytes(p.communication)});
  }
  std::string text =
      "\nmemory per device: the predicted peak (the simulated step, with the arena and the\n"
      "communication buffers) and, as parts of it, what the device holds at that instant; the\n"
      "parts add up to the peak\n";
  text += devices.render();
  Table stages(
      {"stage", "device", "weights", "gradients", "optimizer", "comm", "temporary", "in flight"},
      1);
  for (const plan::Stage& stage : plan.stages) {
    const plan::MemoryBytes& m = stage.memory;
    stages.add({std::to_string(stage.index), std::to_string(stage.device), format_bytes(m.weights),
                format_bytes(m.gradients), format_bytes(m.optimizer), format_bytes(m.communication),
                format_bytes(m.temporary), with_commas(stage.in_flight)});
  }
  text +=
      "\nparts per stage: a device's weights, gradients, optimizer and comm are its stages' added\n"
      "up; its arena is the largest of their temporaries (they take turns); in flight is the\n"
      "most microbatches whose activations the stage holds at once\n";
  text += stages.render();
  text += "\nwhy each stage ends where it does\n";
  for (const plan::Stage& stage : plan.stages) {
    text += fmt::format("  stage {}: {}\n", stage.index, stage.why.empty() ? "-" : stage.why);
  }
  return text;
}

std::string cut_list(const plan::Plan& plan) {
  if (plan.stages.size() < 2) return "";
  std::string text = "\ntensors crossing each cut (per microbatch)\n";
  for (int cut = 0; cut + 1 < static_cast<int>(plan.stages.size()); ++cut) {
    std::vector<CutTensor> crossing = tensors_crossing(plan, cut);
    int64_t total = 0;
    for (const CutTensor& c : crossing) total += c.tensor->bytes;
    text +=
        fmt::format("  stage {} | {}: {}, {}\n", cut, cut + 1, plural(crossing.size(), "tensor"),
                    format_bytes(static_cast<double>(total)));
    for (const CutTensor& c : crossing) {
      text += fmt::format("    {} {} {} (stage {} -> {})\n", c.tensor->name, shape_text(*c.tensor),
                          format_bytes(static_cast<double>(c.tensor->bytes)), c.from,
                          fmt::join(c.tensor->peer_stages, ", "));
    }
  }
  return text;
}

/// The weights several stages hold, per stage: each copy is counted in that stage's memory,
/// and training sums their gradients across the holders before the optimizer step.
std::string shared_list(const plan::Plan& plan) {
  bool any = std::any_of(plan.stages.begin(), plan.stages.end(),
                         [](const plan::Stage& stage) { return !stage.shared_weights.empty(); });
  if (!any) return "";
  std::string text = plan.training
                         ? "\nshared weights per stage (a copy in each holder; gradients summed "
                           "across the holders before the optimizer step)\n"
                         : "\nshared weights per stage (a copy in each holder)\n";
  for (const plan::Stage& stage : plan.stages) {
    if (stage.shared_weights.empty()) continue;
    text += fmt::format("  stage {}:", stage.index);
    if (plan.training) text += fmt::format(" exchange {} ms", ms(stage.shared_exchange_ms));
    text += "\n";
    for (const plan::SharedWeight& w : stage.shared_weights) {
      int64_t elements = 1;
      for (int64_t d : w.shape) elements *= d;
      text +=
          fmt::format("    {} {}[{}] {} params (held by stages {})\n", w.name, w.dtype,
                      fmt::join(w.shape, ","), with_commas(elements), fmt::join(w.stages, ", "));
    }
  }
  return text;
}

/// How the split was chosen: candidates simulated and the gain over the slowest-stage optimum.
std::string search_text(const plan::Plan& plan) {
  const plan::SplitSearch& search = plan.search;
  if (search.candidates == 0) return "";  // a plan written before the search was recorded
  std::string simulated = plural(search.candidates, "candidate split") + " simulated";
  if (search.pruned > 0)
    simulated += fmt::format(" ({} more ruled out by a lower bound)", search.pruned);
  if (search.bottleneck_step_ms <= 0)
    return fmt::format("search      {} (a manual split, checked and simulated)\n", simulated);
  const double gain = 1 - plan.predicted.step_ms / search.bottleneck_step_ms;
  return fmt::format(
      "search      {}; step {} ms is {} {} than the {}-stage optimum's {} ms{}\n", simulated,
      ms(plan.predicted.step_ms), percent(std::abs(gain)), gain >= 0 ? "shorter" : "longer",
      plan.objective == Objective::kMemory ? "largest" : "slowest", ms(search.bottleneck_step_ms),
      search.bottleneck_fits ? "" : " (which does not fit)");
}

/// stagec --auto's search: how many configurations, and the chosen one with the next five.
std::string auto_search_text(const plan::Plan& plan) {
  const std::vector<plan::AutoCandidate>& search = plan.auto_search;
  if (search.empty()) return "";
  int64_t planned = 0;
  for (const plan::AutoCandidate& c : search)
    planned += c.status == "chosen" || c.status == "fits" || c.status == "over_memory";
  std::string text =
      fmt::format("\nauto search {} (stagec --auto), {} planned and simulated; the best {}:\n",
                  plural(static_cast<int64_t>(search.size()), "configuration"), planned,
                  plan.objective == Objective::kMemory ? "by peak" : "by step");
  Table table({"#", "schedule", "chunks", "microbatches", "replicas", "recompute", "step ms",
               "bubble", "largest peak", "status"},
              2);
  // Recompute auto predicting what recompute none does is that plan (auto recomputes no stage):
  // left out.
  std::size_t rank = 0;
  for (std::size_t i = 0; i < search.size() && rank < 6; ++i) {
    const plan::AutoCandidate& c = search[i];
    if (c.status != "chosen" && c.status != "fits" && c.status != "over_memory") break;
    if (i > 0 && c.recompute == "auto" &&
        std::any_of(search.begin(), search.end(), [&](const plan::AutoCandidate& n) {
          return n.recompute == "none" && n.schedule == c.schedule && n.chunks == c.chunks &&
                 n.microbatches == c.microbatches && n.data_parallel == c.data_parallel &&
                 n.step_ms == c.step_ms && n.peak_memory_bytes == c.peak_memory_bytes;
        }))
      continue;
    table.add({std::to_string(++rank), c.schedule, std::to_string(c.chunks),
               fmt::format("{} x {}", c.microbatches, c.microbatch_size),
               std::to_string(c.data_parallel), c.recompute, ms(c.step_ms),
               percent(c.bubble_fraction), format_bytes(static_cast<double>(c.peak_memory_bytes)),
               c.status});
  }
  return text + table.render();
}

std::string predictions(const PlanView& view) {
  const plan::Plan& plan = view.plan;
  const plan::Prediction& ours = plan.predicted;
  std::string text = fmt::format(
      "\npredicted   step {} ms, {} samples/s, bubble {}, largest device peak {}{}\n",
      ms(ours.step_ms), with_commas(std::llround(ours.samples_per_s)),
      percent(ours.bubble_fraction), format_bytes(static_cast<double>(ours.peak_memory_bytes)),
      ours.fits ? "" : " (does NOT fit)");
  if (const std::string shared = plan::describe_sharing(plan); !shared.empty())
    text += "processors  " + shared + "\n";
  text += plan::describe_instruction_costs(view.instruction_costs, ours.step_ms);
  Table table({"split", "step ms", "bubble", "largest peak", "fits", "ours / baseline step"}, 1);
  auto row = [&](const std::string& name, const plan::Prediction& p) {
    std::string ratio = p.step_ms > 0 ? fmt::format("{:.2f}", ours.step_ms / p.step_ms) : "-";
    table.add({name, ms(p.step_ms), percent(p.bubble_fraction),
               format_bytes(static_cast<double>(p.peak_memory_bytes)), p.fits ? "yes" : "no",
               ratio});
  };
  row(fmt::format("ours ({})", to_string(plan.objective)), ours);
  row("parameters", plan.baseline_parameters);
  row("uniform", plan.baseline_uniform);
  text +=
      "baselines   DeepSpeed's partition methods (balance parameters / op counts), same schedule\n";
  text += table.render();
  return text + search_text(plan) + auto_search_text(plan);
}

}  // namespace

std::string render_ascii_timeline(const PlanView& view, int columns) {
  const double step_s = view.plan.predicted.step_ms / 1e3;
  int devices = view.plan.devices;
  std::vector<std::string> rows(devices, std::string(columns, '.'));
  double scale = step_s > 0 ? step_s / columns : 1;
  for (const schedule::TimelineEvent& event : compute_events(view.plan.timeline)) {
    std::string& row = rows[event.device];
    int begin = std::clamp(static_cast<int>(std::lround(event.start_s / scale)), 0, columns);
    int end = std::clamp(static_cast<int>(std::lround(event.end_s / scale)), 0, columns);
    if (end <= begin) {
      if (begin < columns && row[begin] == '.') end = begin + 1;
      if (begin == columns && row[columns - 1] == '.') begin = columns - 1, end = columns;
    }
    if (end <= begin) continue;
    std::string label = event_letter(event, devices) +
                        (event.microbatch >= 0 ? std::to_string(event.microbatch) : "");
    if (static_cast<int>(label.size()) > end - begin) label.resize(1);
    for (int c = begin; c < end; ++c) {
      size_t offset = c - begin;
      row[c] = offset < label.size() ? label[offset] : '-';
    }
  }
  std::string text = fmt::format(
      "\ntimeline    {} as the planner predicted it: step {} ms, bubble {}; one column = "
      "{:.3g} us\n",
      to_string(view.plan.schedule), ms(view.plan.predicted.step_ms),
      percent(view.plan.predicted.bubble_fraction), scale * 1e6);
  for (int device = 0; device < devices; ++device) {
    text += fmt::format("  device {:<3}|{}|\n", device, rows[device]);
  }
  std::string end_label = fmt::format("{} ms", ms(view.plan.predicted.step_ms));
  text +=
      fmt::format("  {:<11}0{:>{}}\n", "", end_label, std::max<int>(columns - 1, end_label.size()));
  text +=
      "  F forward, B backward (its input-gradient half under zb-h1 and zb-v, and where "
      "dualpipev splits it), W weight gradient, O optimizer\n"
      "  step, digits the microbatch, '-' its duration, '.' idle; lower case for a device's later "
      "chunks\n";
  return text;
}

std::string render_text(const PlanView& view) {
  return header(view) + stage_table(view.plan) + memory_table(view.plan) + cut_list(view.plan) +
         shared_list(view.plan) + predictions(view) + render_ascii_timeline(view);
}

}  // namespace stagecraft::dump
