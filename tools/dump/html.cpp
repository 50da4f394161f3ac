// The --html view: one self-contained page (inline CSS and SVG, no external assets). The SVGs
// have viewBoxes and the tables scroll inside their own boxes, so the page fits any window
// width. A short script at the end writes a marker for headless checks (tests/cli/browser_test.sh).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <set>

#include "tools/dump/html_parts.h"
#include "tools/dump/render.h"

namespace stagecraft::dump {
namespace html {

std::string escaped(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace html

namespace {

using html::escaped;

std::string row(const std::vector<std::string>& cells, std::string_view tag = "td",
                std::string_view cls = "") {
  std::string out = cls.empty() ? "<tr>" : fmt::format("<tr class=\"{}\">", cls);
  for (const std::string& cell : cells) out += fmt::format("<{0}>{1}</{0}>", tag, cell);
  return out + "</tr>\n";
}

std::string bytes(int64_t value) { return format_bytes(static_cast<double>(value)); }

std::string facts(const PlanView& view, const MeasuredRun* measured) {
  const plan::Plan& plan = view.plan;
  std::string out = "<div class=\"scroll\"><table class=\"facts\">\n";
  auto fact = [&](std::string_view key, const std::string& value) {
    out += row({std::string(key), escaped(value)});
  };
  fact("model", plan.model_path);
  fact("schedule", fmt::format("{}: {} x {}", to_string(plan.schedule),
                               plural(plan.devices, "device"), plural(plan.chunks, "chunk")));
  if (plan.data_parallel > 1)
    fact("data parallel", fmt::format("{} replicas of the pipeline", plan.data_parallel));
  fact("batch",
       fmt::format("{} = {} x {}", plan.batch,
                   plural(plan.microbatches, "microbatch", "microbatches"), plan.microbatch_size));
  fact(plan.training ? "training" : "inference",
       fmt::format("optimizer {}{}, precision {}", to_string(plan.optimizer),
                   plan.training ? clip_words(plan) : "", to_string(plan.precision)));
  fact("objective", std::string(to_string(plan.objective)));
  fact("cost model", plan.cost_model);
  fact("device", fmt::format("{} ({}, {})", plan.device.name, to_string(plan.device.kind),
                             bytes(plan.device.memory_bytes)));
  if (measured != nullptr) {
    fact("measured run",
         fmt::format("{} ({}): {}, median step {:.3f} ms{}", measured->path,
                     measured->traced ? "stagerun --trace" : "stagerun --json",
                     plural(static_cast<int64_t>(measured->step_ms.size()), "step"),
                     measured->reported_step_ms(),
                     measured->step_ms.size() > 1 ? " without the warm-up step" : ""));
    if (!measured->summary_path.empty())
      fact("measured figures",
           fmt::format("{} (stagerun --json): median step {:.3f} ms; its device peaks and bubble "
                       "are drawn with the trace's instructions",
                       measured->summary_path, measured->summary_step_ms));
  }
  return out + "</table></div>\n";
}

/// The plan beside the baselines, the better of them marked (by the objective, among those that
/// fit: the faster step, or the smaller largest peak); a measured run's figures under them.
std::string comparison(const plan::Plan& plan, const MeasuredRun* measured) {
  struct Candidate {
    std::string name;
    const plan::Prediction* p;
  };
  const std::array<Candidate, 3> candidates = {
      Candidate{"this plan", &plan.predicted},
      Candidate{"baseline 'parameters' (balance parameter counts)", &plan.baseline_parameters},
      Candidate{"baseline 'uniform' (balance op counts)", &plan.baseline_uniform}};
  const bool by_memory = plan.objective == Objective::kMemory;
  auto better = [&](const plan::Prediction& a, const plan::Prediction& b) {
    if (a.fits != b.fits) return a.fits;
    return by_memory ? a.peak_memory_bytes < b.peak_memory_bytes : a.step_ms < b.step_ms;
  };
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i)
    if (better(*candidates[i].p, *candidates[best].p)) best = i;

  std::string out = "<div class=\"scroll\"><table class=\"comparison\">\n";
  out += row(
      {"", "step ms", "step / plan's", "bubble", "samples/s", "largest device peak", "fits", ""},
      "th");
  for (size_t i = 0; i < candidates.size(); ++i) {
    const plan::Prediction& p = *candidates[i].p;
    const double ratio = plan.predicted.step_ms > 0 ? p.step_ms / plan.predicted.step_ms : 0;
    out += row({escaped(candidates[i].name), fmt::format("{:.3f}", p.step_ms),
                fmt::format("{:.2f}", ratio), fmt::format("{:.1f}%", 100 * p.bubble_fraction),
                fmt::format("{:.0f}", p.samples_per_s), bytes(p.peak_memory_bytes),
                p.fits ? "yes" : "no", i == best ? "&#10003; best" : ""},
               "td", i == best ? "best" : "");
  }
  if (measured != nullptr) {
    const double ms = measured->reported_step_ms();
    int64_t peak = 0;
    for (const MeasuredDevice& d : measured->device) peak = std::max(peak, d.peak_bytes);
    out += row(
        {"measured (median step)", fmt::format("{:.3f}", ms),
         fmt::format("{:.2f}", plan.predicted.step_ms > 0 ? ms / plan.predicted.step_ms : 0),
         measured->bubble_fraction >= 0 ? fmt::format("{:.1f}%", 100 * measured->bubble_fraction)
                                        : "",
         fmt::format("{:.0f}", ms > 0 ? static_cast<double>(plan.batch) / (ms / 1e3) : 0),
         measured->device.empty() ? "" : bytes(peak), "", ""},
        "td", "measured");
  }
  out += "</table></div>\n";
  return out + fmt::format(
                   "<p>Best: the {} among those that fit (objective {}). The baselines are "
                   "DeepSpeed's partition methods, simulated under the same schedule.</p>\n",
                   by_memory ? "smallest largest peak" : "fastest step", to_string(plan.objective));
}

std::string stage_table(const plan::Plan& plan) {
  std::string out = "<div class=\"scroll\"><table class=\"stages\">\n";
  out += row({"stage", "device", "ops", "first op", "last op", "params", "fwd ms", "bwd ms",
              "in flight", "why"},
             "th");
  for (const plan::Stage& stage : plan.stages) {
    out +=
        row({fmt::format("<span class=\"swatch\" style=\"background:{}\"></span>{}",
                         stage_colour(stage.index), stage.index),
             std::to_string(stage.device), with_commas(stage.nodes.size()),
             escaped(stage.nodes.front()), escaped(stage.nodes.back()), with_commas(stage.params),
             fmt::format("{:.3f}", stage.fwd_ms), fmt::format("{:.3f}", stage.bwd_ms),
             std::to_string(stage.in_flight), escaped(stage.why)});
  }
  return out + "</table></div>\n";
}

/// The tensors crossing each cut (per microbatch), with each cut's total.
std::string cut_table(const plan::Plan& plan) {
  std::string out = "<div class=\"scroll\"><table class=\"cuts\">\n";
  out += row({"cut", "tensor", "dtype[shape]", "from", "to", "bytes"}, "th");
  for (int cut = 0; cut + 1 < static_cast<int>(plan.stages.size()); ++cut) {
    std::vector<CutTensor> crossing = tensors_crossing(plan, cut);
    int64_t total = 0;
    for (const CutTensor& c : crossing) total += c.tensor->bytes;
    out += row({fmt::format("stage {} | {}", cut, cut + 1), plural(crossing.size(), "tensor"), "",
                "", "", fmt::format("<b>{}</b>", bytes(total))},
               "td", "cut");
    for (const CutTensor& c : crossing) {
      out += row({"", escaped(c.tensor->name),
                  escaped(fmt::format("{}[{}]", c.tensor->dtype, fmt::join(c.tensor->shape, ","))),
                  fmt::format("stage {}", c.from),
                  fmt::format("stage {}", fmt::join(c.tensor->peer_stages, ", ")),
                  bytes(c.tensor->bytes)});
    }
  }
  return out + "</table></div>\n";
}

/// The measured peak of each pipeline device (the largest over its replicas); -1 when unknown.
std::vector<int64_t> measured_peaks(const plan::Plan& plan, const MeasuredRun* measured) {
  std::vector<int64_t> peaks(static_cast<size_t>(plan.devices), -1);
  if (measured == nullptr) return peaks;
  for (size_t g = 0; g < measured->device.size(); ++g) {
    int64_t& p = peaks[g % static_cast<size_t>(plan.devices)];
    p = std::max(p, measured->device[g].peak_bytes);
  }
  return peaks;
}

/// A byte scale under the memory bars: a line from 0 to `scale_max` bytes over `width` units from
/// `left`, with ticks at 1, 2 or 5 x 10^k of the unit that suits (B, KiB, MiB, GiB, TiB).
std::string byte_axis(double scale_max, int left, int width, int y) {
  constexpr std::array<std::string_view, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  double per_unit = 1;
  while (unit + 1 < kUnits.size() && scale_max / per_unit >= 1024 * 2) {
    per_unit *= 1024;
    ++unit;
  }
  const double raw = scale_max / per_unit / 6;  // about six ticks
  const double magnitude = std::pow(10.0, std::floor(std::log10(std::max(raw, 1e-9))));
  double tick = 10 * magnitude;
  for (double m : {1.0, 2.0, 5.0})
    if (m * magnitude >= raw) {
      tick = m * magnitude;
      break;
    }
  std::string svg = fmt::format(
      "<g class=\"byte-axis\"><line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" "
      "stroke=\"#333\"/>\n",
      left, y, left + width);
  for (int i = 0;; ++i) {
    const double value = i * tick;
    if (value * per_unit > scale_max * (1 + 1e-9)) break;
    const double x = left + value * per_unit / scale_max * width;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#333\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" class=\"tick-label\">{4:g} {5}</text>\n",
        x, y, y + 4, y + 16, value, kUnits[unit]);
  }
  return svg + "</g>\n";
}

/// One stacked bar per device: the parts it holds at its predicted peak, which add up to the
/// peak printed at its end; the capacity as a dashed line when it is in view (else said in
/// words); a measured peak as a red mark.
std::string memory_svg(const plan::Plan& plan, const MeasuredRun* measured) {
  constexpr std::array<std::string_view, 8> kParts = {"weights",     "gradients",    "optimizer",
                                                      "activations", "recomputed",   "deferred",
                                                      "arena",       "communication"};
  constexpr std::array<std::string_view, 8> kColours = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                        "#b07aa1", "#9c755f", "#59a14f", "#edc948"};
  const std::vector<int64_t> measured_peak = measured_peaks(plan, measured);
  double largest = 1;
  for (const plan::DevicePeak& d : plan.device_memory)
    largest = std::max(largest, static_cast<double>(d.peak_bytes));
  for (int64_t m : measured_peak) largest = std::max(largest, static_cast<double>(m));
  const auto capacity = static_cast<double>(plan.device.memory_bytes);
  // The capacity is drawn when it is within twice the largest peak (else the bars would vanish).
  const bool show_capacity = capacity > 0 && capacity <= 2 * largest;
  const double scale_max = show_capacity ? std::max(largest, capacity) : largest;
  constexpr int kLeft = 80, kWidth = 760, kRow = 28, kTop = 16;
  const int axis_y = kTop + kRow * plan.devices + 2;
  const int legend_y = axis_y + 34;
  std::string svg = fmt::format(
      "<svg class=\"memory\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {}\" "
      "preserveAspectRatio=\"xMinYMin meet\" role=\"img\" aria-label=\"memory per device\">\n",
      kLeft + kWidth + 200, legend_y + 26);
  for (const plan::DevicePeak& d : plan.device_memory) {
    const int y = kTop + d.device * kRow;
    const plan::PeakParts& p = d.parts;
    const std::array<int64_t, 8> part = {p.weights,    p.gradients, p.optimizer, p.activations,
                                         p.recomputed, p.deferred,  p.arena,     p.communication};
    svg += fmt::format("<g class=\"device-memory\" data-device=\"{}\" data-peak-bytes=\"{}\">\n",
                       d.device, d.peak_bytes);
    svg += fmt::format("<text x=\"0\" y=\"{}\">device {}</text>\n", y + 16, d.device);
    double x = kLeft;
    for (size_t i = 0; i < kParts.size(); ++i) {
      const double w = static_cast<double>(part[i]) / scale_max * kWidth;
      if (w <= 0) continue;
      svg += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"20\" fill=\"{}\">"
          "<title>part of the peak: {} {}</title></rect>\n",
          x, y + 2, w, kColours[i], kParts[i], bytes(part[i]));
      x += w;
    }
    const int64_t m = measured_peak[static_cast<size_t>(d.device)];
    double text_x = std::max(x, m >= 0 ? kLeft + static_cast<double>(m) / scale_max * kWidth : 0);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\">peak {}</text>\n</g>\n", text_x + 6, y + 16,
                       bytes(d.peak_bytes));
    if (m >= 0) {
      const double mx = kLeft + static_cast<double>(m) / scale_max * kWidth;
      svg += fmt::format(
          "<line class=\"measured-peak\" data-device=\"{0}\" data-measured-peak-bytes=\"{1}\" "
          "x1=\"{2:.1f}\" y1=\"{3}\" x2=\"{2:.1f}\" y2=\"{4}\" stroke=\"#b22222\" "
          "stroke-width=\"2.5\"><title>measured peak {5}</title></line>\n",
          d.device, m, mx, y, y + 24, bytes(m));
    }
  }
  if (show_capacity) {
    const double x = kLeft + capacity / scale_max * kWidth;
    svg += fmt::format(
        "<line class=\"capacity\" x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" "
        "stroke=\"#333\" stroke-dasharray=\"4 3\"><title>capacity {3}</title></line>"
        "<text x=\"{0:.1f}\" y=\"{4}\" class=\"capacity-label\">capacity {3}</text>\n",
        x, kTop - 4, axis_y, bytes(plan.device.memory_bytes), kTop - 6);
  }
  svg += byte_axis(scale_max, kLeft, kWidth, axis_y);
  // The legend names only the parts some device holds at its peak.
  std::array<bool, 8> held{};
  for (const plan::DevicePeak& d : plan.device_memory) {
    const plan::PeakParts& p = d.parts;
    const std::array<int64_t, 8> part = {p.weights,    p.gradients, p.optimizer, p.activations,
                                         p.recomputed, p.deferred,  p.arena,     p.communication};
    for (size_t i = 0; i < part.size(); ++i) held[i] = held[i] || part[i] > 0;
  }
  for (size_t i = 0, shown = 0; i < kParts.size(); ++i) {
    if (!held[i]) continue;
    const int x = kLeft + static_cast<int>(shown++) * 105;
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/>"
        "<text x=\"{}\" y=\"{}\">{}</text>\n",
        x, legend_y + 5, kColours[i], x + 14, legend_y + 14, kParts[i]);
  }
  return svg + "</svg>\n";
}

std::string memory_section(const plan::Plan& plan, const MeasuredRun* measured) {
  double largest = 1;
  for (const plan::DevicePeak& d : plan.device_memory)
    largest = std::max(largest, static_cast<double>(d.peak_bytes));
  const auto capacity = static_cast<double>(plan.device.memory_bytes);
  std::string capacity_text =
      capacity > 2 * largest
          ? fmt::format(
                "The capacity of one {} ({}) is {:.0f} times the largest peak, off this "
                "scale.",
                escaped(plan.device.name), bytes(plan.device.memory_bytes), capacity / largest)
          : fmt::format("The dashed line is the capacity of one {} ({}).",
                        escaped(plan.device.name), bytes(plan.device.memory_bytes));
  std::string measured_text;
  if (measured != nullptr && !measured->device.empty())
    measured_text = " The red mark is the measured peak of the device (stagerun).";
  return fmt::format(
             "<h2>Memory per device</h2>\n<p>The predicted peak of each device: the simulated "
             "step's highest point, with the working arena and the communication buffers. The "
             "bar's parts are what the device holds at that instant; they add up to the peak. "
             "{}{}</p>\n",
             capacity_text, measured_text) +
         memory_svg(plan, measured);
}

std::string timeline_section(const PlanView& view, const MeasuredRun* measured) {
  const plan::Plan& plan = view.plan;
  // The legend names only the kinds the plan's timeline (or the measured run) holds.
  std::set<char> held;
  for (const schedule::TimelineEvent& e : plan.timeline) held.insert(html::kind_of(e.op));
  if (measured != nullptr)
    for (const MeasuredStep& step : measured->steps)
      for (const MeasuredEvent& e : step.events) held.insert(html::kind_of(e.event.op));
  std::string legend = "<p class=\"legend\">";
  for (const html::KindColour& k : html::kKindColours)
    if (held.count(k.kind[0]))
      legend += fmt::format("<span class=\"swatch\" style=\"background:{}\"></span>{} &nbsp; ",
                            k.colour, escaped(k.label));
  legend += "</p>\n";
  std::string measured_text;
  if (measured != nullptr && measured->traced)
    measured_text =
        " Under each device, its measured median step (from the step's first instruction); the "
        "runtime times compute, all-reduces, receives' waits and sends (the thin lane); its "
        "measured memory is the red line in the memory lane.";
  else if (measured != nullptr)
    measured_text =
        " The red line is the measured median step; stagerun --json has no instruction times "
        "(stagerun --trace FILE has).";
  return fmt::format(
             "<h2>Timeline</h2>\n<p>{} as the planner predicted it: step {:.3f} ms, bubble "
             "{:.1f}%, one box per instruction. F forward, B backward (input gradient under "
             "zb-h1 and zb-v, and where dualpipev splits it), W weight gradient, with the "
             "microbatch; lower case for later chunks. "
             "Receives are the wait for their data; sends run on the link, in the thin lane. "
             "Under each device's rows, its predicted memory over the step (one scale for every "
             "device; the lane's title gives the peak).{}"
             "</p>\n",
             escaped(std::string(to_string(plan.schedule))), plan.predicted.step_ms,
             100 * plan.predicted.bubble_fraction, measured_text) +
         legend + html::timeline_svg(view, measured);
}

constexpr std::string_view kStyle =
    "<style>\n"
    "body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 100%; }\n"
    "h1 { font-size: 1.4em; overflow-wrap: anywhere; }\n"
    ".scroll { overflow-x: auto; max-width: 100%; }\n"
    "table { border-collapse: collapse; margin-bottom: 1.2em; }\n"
    "td, th { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; }\n"
    "table.facts td:first-child { font-weight: bold; }\n"
    "tr.best { background: #e3f4e1; font-weight: bold; }\n"
    "tr.measured { color: #b22222; }\n"
    "tr.cut td { background: #f3f3f3; }\n"
    // Long op names and the reasons wrap, so the stage table fits the page, not a scroll box.
    "table.stages td { white-space: nowrap; }\n"
    "table.stages td:nth-child(4), table.stages td:nth-child(5), table.stages td:last-child "
    "{ white-space: normal; overflow-wrap: anywhere; }\n"
    "table.stages td:last-child { min-width: 14em; }\n"
    "#stagedump-drawn { color: #999; font-size: 0.8em; }\n"
    ".swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }\n"
    "svg { display: block; width: 100%; height: auto; margin-bottom: 1.5em; }\n"
    "svg text { font-size: 12px; }\n"
    "svg text.label { font-size: 10px; text-anchor: middle; fill: #fff; pointer-events: none; }\n"
    "svg text.tick-label { font-size: 11px; text-anchor: middle; }\n"
    "svg text.marker { font-size: 11px; text-anchor: end; }\n"
    "svg text.capacity-label { font-size: 10px; }\n"
    "svg text.memory-peak { font-size: 10px; text-anchor: end; fill: #3182bd; }\n"
    "svg rect.instr { stroke: #fff; stroke-width: 0.6; }\n"  // adjacent boxes stay apart
    "svg rect.measured { stroke: #b22222; stroke-width: 0.6; }\n"
    "svg rect.recompute { fill-opacity: 0.5; }\n"
    "</style>\n";

/// Counts what was drawn and writes it into the page: the boxes (one per instruction), the
/// measured boxes, and whether the page is wider than the window.
constexpr std::string_view kMarkerScript =
    "<script>\n"
    "(function () {\n"
    "  var marker = document.createElement('p');\n"
    "  marker.id = 'stagedump-drawn';\n"
    "  var boxes = document.querySelectorAll('svg.timeline rect.instr').length;\n"
    "  var measured = document.querySelectorAll('svg.timeline rect.measured').length;\n"
    "  var overflow = document.documentElement.scrollWidth > window.innerWidth;\n"
    "  marker.setAttribute('data-instructions', String(boxes));\n"
    "  marker.setAttribute('data-measured', String(measured));\n"
    "  marker.setAttribute('data-overflow', overflow ? 'yes' : 'no');\n"
    "  marker.textContent = 'drawn: ' + boxes + ' instruction boxes, ' + measured + ' measured';\n"
    "  document.body.appendChild(marker);\n"
    "})();\n"
    "</script>\n";

}  // namespace

std::string render_html(const PlanView& view, const MeasuredRun* measured) {
  // The model's name first: a page among several open is found by it.
  const plan::Plan& p = view.plan;
  std::string title = escaped(fmt::format(
      "{}: {} on {} device{} ({})", std::filesystem::path(p.model_path).stem().string(),
      to_string(p.schedule), p.devices * p.data_parallel, p.devices * p.data_parallel == 1 ? "" : "s",
      view.plan_dir));
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  page += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  page += fmt::format("<title>{}</title>\n", title);
  page += kStyle;
  page += "</head>\n<body>\n";
  page += fmt::format("<h1>{}</h1>\n", title);
  page += facts(view, measured);
  page += "<h2>The plan beside the baselines</h2>\n" + comparison(view.plan, measured);
  page += "<h2>Stages</h2>\n" + stage_table(view.plan);
  page += "<h2>Tensors crossing each cut (per microbatch)</h2>\n" + cut_table(view.plan);
  page += memory_section(view.plan, measured);
  page += timeline_section(view, measured);
  page += kMarkerScript;
  return page + "</body>\n</html>\n";
}

}  // namespace stagecraft::dump
