// The --html view: one self-contained page (inline CSS and SVG, no scripts, no external assets).
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "tools/dump/render.h"

namespace stagecraft::dump {
namespace {

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

std::string row(const std::vector<std::string>& cells, std::string_view tag = "td") {
  std::string html = "<tr>";
  for (const std::string& cell : cells) html += fmt::format("<{0}>{1}</{0}>", tag, cell);
  return html + "</tr>\n";
}

std::string facts(const PlanView& view) {
  const plan::Plan& plan = view.plan;
  const plan::Prediction& p = plan.predicted;
  std::string html = "<table class=\"facts\">\n";
  auto fact = [&](std::string_view key, const std::string& value) {
    html += row({std::string(key), escaped(value)});
  };
  fact("model", plan.model_path);
  fact("schedule", fmt::format("{}: {} x {}", to_string(plan.schedule),
                               plural(plan.devices, "device"), plural(plan.chunks, "chunk")));
  fact("batch",
       fmt::format("{} = {} x {}", plan.batch,
                   plural(plan.microbatches, "microbatch", "microbatches"), plan.microbatch_size));
  fact(plan.training ? "training" : "inference",
       fmt::format("optimizer {}, precision {}", to_string(plan.optimizer),
                   to_string(plan.precision)));
  fact("objective", std::string(to_string(plan.objective)));
  fact("cost model", plan.cost_model);
  fact("predicted", fmt::format("step {:.3f} ms, {:.0f} samples/s, bubble {:.1f}%, largest "
                                "device peak {}",
                                p.step_ms, p.samples_per_s, 100 * p.bubble_fraction,
                                format_bytes(static_cast<double>(p.peak_memory_bytes))));
  auto baseline = [&](std::string_view name, const plan::Prediction& b) {
    fact(
        fmt::format("baseline {}", name),
        fmt::format("step {:.3f} ms, bubble {:.1f}%, largest device peak {}, {}", b.step_ms,
                    100 * b.bubble_fraction, format_bytes(static_cast<double>(b.peak_memory_bytes)),
                    b.fits ? "fits" : "does not fit"));
  };
  baseline("parameters", plan.baseline_parameters);
  baseline("uniform", plan.baseline_uniform);
  return html + "</table>\n";
}

std::string stage_table(const plan::Plan& plan) {
  std::string html = "<table>\n";
  html += row({"stage", "device", "ops", "first op", "last op", "params", "fwd ms", "bwd ms",
               "in flight", "why"},
              "th");
  for (const plan::Stage& stage : plan.stages) {
    html +=
        row({fmt::format("<span class=\"swatch\" style=\"background:{}\"></span>{}",
                         stage_colour(stage.index), stage.index),
             std::to_string(stage.device), with_commas(stage.nodes.size()),
             escaped(stage.nodes.front()), escaped(stage.nodes.back()), with_commas(stage.params),
             fmt::format("{:.3f}", stage.fwd_ms), fmt::format("{:.3f}", stage.bwd_ms),
             std::to_string(stage.in_flight), escaped(stage.why)});
  }
  return html + "</table>\n";
}

/// One stacked horizontal bar per device: the parts it holds at its predicted peak, which add up
/// to the peak printed at its end; a dashed line marks the device's capacity when it is in view.
std::string memory_svg(const plan::Plan& plan) {
  constexpr std::array<std::string_view, 8> kParts = {"weights",     "gradients",    "optimizer",
                                                      "activations", "recomputed",   "deferred",
                                                      "arena",       "communication"};
  constexpr std::array<std::string_view, 8> kColours = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                        "#b07aa1", "#9c755f", "#59a14f", "#edc948"};
  double largest = 1;
  for (const plan::DevicePeak& d : plan.device_memory)
    largest = std::max(largest, static_cast<double>(d.peak_bytes));
  const auto capacity = static_cast<double>(plan.device.memory_bytes);
  // The capacity is drawn when it is within twice the largest peak (else the bars would vanish).
  const bool show_capacity = capacity > 0 && capacity <= 2 * largest;
  const double scale_max = show_capacity ? std::max(largest, capacity) : largest;
  constexpr int kLeft = 80, kWidth = 600, kRow = 26;
  int height = kRow * plan.devices + 30;
  std::string svg =
      fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\n",
                  kLeft + kWidth + 120, height);
  for (const plan::DevicePeak& d : plan.device_memory) {
    int y = d.device * kRow;
    const plan::PeakParts& p = d.parts;
    const std::array<int64_t, 8> bytes = {p.weights,    p.gradients, p.optimizer, p.activations,
                                          p.recomputed, p.deferred,  p.arena,     p.communication};
    svg += fmt::format("<g class=\"device-memory\" data-device=\"{}\" data-peak-bytes=\"{}\">\n",
                       d.device, d.peak_bytes);
    svg += fmt::format("<text x=\"0\" y=\"{}\">device {}</text>\n", y + 16, d.device);
    double x = kLeft;
    for (size_t i = 0; i < kParts.size(); ++i) {
      double w = static_cast<double>(bytes[i]) / scale_max * kWidth;
      if (w <= 0) continue;
      svg += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"20\" fill=\"{}\">"
          "<title>part of the peak: {} {}</title></rect>\n",
          x, y + 2, w, kColours[i], kParts[i], format_bytes(static_cast<double>(bytes[i])));
      x += w;
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\">peak {}</text>\n</g>\n", x + 6, y + 16,
                       format_bytes(static_cast<double>(d.peak_bytes)));
  }
  if (show_capacity) {
    double x = kLeft + capacity / scale_max * kWidth;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"0\" x2=\"{0:.1f}\" y2=\"{1}\" stroke=\"#333\" "
        "stroke-dasharray=\"4 3\"><title>capacity {2}</title></line>\n",
        x, plan.devices * kRow, format_bytes(capacity));
  }
  int y = plan.devices * kRow + 16;
  for (size_t i = 0; i < kParts.size(); ++i) {
    int x = kLeft + static_cast<int>(i) * 90;
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/>"
        "<text x=\"{}\" y=\"{}\">{}</text>\n",
        x, y - 9, kColours[i], x + 14, y, kParts[i]);
  }
  return svg + "</svg>\n";
}

/// One row per device; each compute event a rectangle in its stage's colour, W events faded.
std::string timeline_svg(const PlanView& view) {
  constexpr int kLeft = 80, kWidth = 1000, kRow = 28;
  const double step_s = view.plan.predicted.step_ms / 1e3;
  int devices = view.plan.devices;
  double scale = step_s > 0 ? kWidth / step_s : 0;
  std::string svg =
      fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\n",
                  kLeft + kWidth + 10, devices * kRow + 24);
  for (int device = 0; device < devices; ++device) {
    svg += fmt::format("<text x=\"0\" y=\"{}\">device {}</text>\n", device * kRow + 18, device);
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"22\" fill=\"#f4f4f4\"/>\n",
                       kLeft, device * kRow + 2, kWidth);
  }
  for (const schedule::TimelineEvent& event : compute_events(view.plan.timeline)) {
    double x = kLeft + event.start_s * scale;
    double w = std::max(0.5, (event.end_s - event.start_s) * scale);
    int y = event.device * kRow + 2;
    std::string label(1, event_letter(event, devices));
    if (event.microbatch >= 0) label += std::to_string(event.microbatch);
    svg += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{}\" width=\"{:.2f}\" height=\"22\" fill=\"{}\" "
        "stroke=\"#555\" stroke-width=\"0.5\"{}><title>{} stage {} microbatch {}: "
        "{:.3f}-{:.3f} ms</title></rect>\n",
        x, y, w, stage_colour(event.stage),
        event.op == schedule::Op::kBackwardWeight ? " fill-opacity=\"0.5\"" : "",
        event_category(event.op), event.stage, event.microbatch, event.start_s * 1e3,
        event.end_s * 1e3);
    if (w >= 7.0 * label.size()) {
      svg += fmt::format("<text x=\"{:.2f}\" y=\"{}\" class=\"label\">{}</text>\n", x + w / 2,
                         y + 15, label);
    }
  }
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\">0</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.3f} "
      "ms</text>\n",
      kLeft, devices * kRow + 18, kLeft + kWidth, devices * kRow + 18, step_s * 1e3);
  return svg + "</svg>\n";
}

}  // namespace

std::string render_html(const PlanView& view) {
  std::string title = "stagedump: " + escaped(view.plan_dir);
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += fmt::format("<title>{}</title>\n", title);
  html +=
      "<style>\n"
      "body { font-family: sans-serif; margin: 2em; color: #222; }\n"
      "table { border-collapse: collapse; margin-bottom: 1.5em; }\n"
      "td, th { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: left; }\n"
      "table.facts td:first-child { font-weight: bold; }\n"
      ".swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }\n"
      "svg text { font-size: 12px; }\n"
      "svg text.label { font-size: 10px; text-anchor: middle; }\n"
      "</style>\n</head>\n<body>\n";
  html += fmt::format("<h1>{}</h1>\n", title);
  html += facts(view);
  html += "<h2>Stages</h2>\n" + stage_table(view.plan);
  html += fmt::format(
      "<h2>Memory per device</h2>\n<p>The predicted peak of each device: the simulated step's "
      "highest point, with the working arena and the communication buffers. The bar's parts are "
      "what the device holds at that instant; they add up to the peak. The dashed line is the "
      "capacity of one {} ({}).</p>\n",
      escaped(view.plan.device.name),
      format_bytes(static_cast<double>(view.plan.device.memory_bytes)));
  html += memory_svg(view.plan);
  html += fmt::format(
      "<h2>Timeline</h2>\n<p>{} as the planner predicted it: step {:.3f} ms, "
      "bubble {:.1f}%. F forward, B backward (input gradient under zb-h1), W "
      "weight gradient (faded), with the microbatch; lower case for later chunks.</p>\n",
      escaped(std::string(to_string(view.plan.schedule))), view.plan.predicted.step_ms,
      100 * view.plan.predicted.bubble_fraction);
  html += timeline_svg(view);
  return html + "</body>\n</html>\n";
}

}  // namespace stagecraft::dump
