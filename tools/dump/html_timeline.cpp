// The --html view's timeline: one inline SVG with a viewBox, so it takes the page's width.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <cmath>

#include "tools/dump/html_parts.h"

namespace stagecraft::dump::html {
namespace {

constexpr double kLeft = 92, kWidth = 1000, kRight = 12;  // viewBox units
constexpr double kBox = 20, kSendLane = 5, kGap = 12, kAxis = 34, kMemLane = 22;


std::string_view colour_of(char kind) {
  for (const KindColour& k : kKindColours)
    if (k.kind[0] == kind) return k.colour;
  return "#000";
}

/// A tick spacing of 1, 2 or 5 x 10^k ms giving at most about 10 ticks over `span_ms`.
double tick_ms(double span_ms) {
  if (span_ms <= 0) return 1;
  const double raw = span_ms / 10;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) return m * magnitude;
  return 10 * magnitude;
}

/// The tick label: as many decimals as the spacing needs.
std::string tick_label(double ms, double tick) {
  int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(tick) + 1e-9)));
  return fmt::format("{:.{}f}", ms, decimals);
}

struct Rows {
  double per_device;  ///< Height of one device's rows.
  bool measured;      ///< A measured row under each predicted one.
  double top(int device) const { return kAxis + device * per_device; }
  /// The top of the device's memory lane, under its instruction rows.
  double memory_top(int device) const {
    return top(device) + kBox + 1 + kSendLane + (measured ? 4 + kBox + 1 + kSendLane : 0) + 4;
  }
};

/// The time axis: ticks, their labels in ms and light grid lines over the rows.
std::string axis(double span_ms, double scale, double bottom) {
  const double tick = tick_ms(span_ms);
  std::string svg = "<g class=\"axis\">\n";
  svg += fmt::format(
      "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333\"/>\n"
      "<text x=\"{}\" y=\"12\" class=\"unit\">time (ms)</text>\n",
      kLeft, kAxis - 6, kLeft + kWidth, kAxis - 6, kLeft - 86);
  for (int i = 0;; ++i) {
    const double ms = i * tick;
    if (ms > span_ms * (1 + 1e-9)) break;
    const double x = kLeft + ms * scale;
    svg += fmt::format(
        "<line class=\"tick\" x1=\"{0:.2f}\" y1=\"{1}\" x2=\"{0:.2f}\" y2=\"{2}\" stroke=\"#333\"/>"
        "<line x1=\"{0:.2f}\" y1=\"{3}\" x2=\"{0:.2f}\" y2=\"{4:.1f}\" stroke=\"#e6e6e6\"/>"
        "<text x=\"{0:.2f}\" y=\"{5}\" class=\"tick-label\">{6}</text>\n",
        x, kAxis - 10, kAxis - 6, kAxis - 6, bottom, kAxis - 13, tick_label(ms, tick));
  }
  return svg + "</g>\n";
}

/// One box: `cls` "instr" (predicted) or "measured".
std::string box(const schedule::TimelineEvent& e, double x, double y, double w, double h,
                std::string_view cls, int devices, bool recompute, std::string_view when,
                const std::string& note = "") {
  const char kind = kind_of(e.op);
  std::string label;
  if (kind == 'F' || kind == 'B' || kind == 'W' || kind == 'O') {
    label = std::string(1, event_letter(e, devices));
    if (e.microbatch >= 0) label += std::to_string(e.microbatch);
  }
  std::string svg = fmt::format(
      "<rect class=\"{}{}\" data-device=\"{}\" data-op=\"{}\" data-stage=\"{}\" "
      "data-microbatch=\"{}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" "
      "fill=\"{}\"><title>{} {}{}: {:.3f}-{:.3f} ms{}</title></rect>\n",
      cls, recompute ? " recompute" : "", e.device, schedule::to_string(e.op), e.stage,
      e.microbatch, x, y, w, h, colour_of(kind), when,
      schedule::to_string(schedule::Instruction{e.op, e.stage, e.microbatch}),
      recompute ? " (recompute)" : "", e.start_s * 1e3, e.end_s * 1e3, escaped(note));
  if (!label.empty() && w >= 6.5 * static_cast<double>(label.size()) + 2)
    svg += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" class=\"label\">{}</text>\n", x + w / 2,
                       y + h / 2 + 3.5, label);
  return svg;
}

/// The predicted step's instructions of every device: one box each (sends in their lane).
std::string predicted_boxes(const PlanView& view, const Rows& rows, double scale) {
  std::string svg;
  for (const schedule::TimelineEvent& e : view.plan.timeline) {
    const double x = kLeft + e.start_s * 1e3 * scale;
    const double w = std::max(0.0, (e.end_s - e.start_s) * 1e3 * scale);
    double y = rows.top(e.device), h = kBox;
    if (kind_of(e.op) == 'S') {
      y += kBox + 1;
      h = kSendLane;
    }
    svg += box(e, x, y, w, h, "instr", view.plan.devices, false, "predicted");
  }
  return svg;
}

/// The measured median step's timed instructions under each device's row, from its start; its
/// sends in a thin lane under them.
std::string measured_boxes(const PlanView& view, const MeasuredRun& run, const Rows& rows,
                           double scale) {
  const MeasuredStep& step = run.steps.at(static_cast<size_t>(run.reported_step));
  // Each instruction's predicted duration, to say how far the measured one is from it.
  std::map<std::tuple<int, schedule::Op, int, int>, double> predicted;
  for (const schedule::TimelineEvent& e : view.plan.timeline)
    predicted[{e.device, e.op, e.stage, e.microbatch}] = e.end_s - e.start_s;
  std::string svg;
  for (const MeasuredEvent& m : step.events) {
    if (m.event.device >= view.plan.devices) continue;  // other replicas: the same pipeline
    schedule::TimelineEvent e = m.event;
    e.start_s -= step.start_s;
    e.end_s -= step.start_s;
    const double x = kLeft + e.start_s * 1e3 * scale;
    const double w = std::max(0.0, (e.end_s - e.start_s) * 1e3 * scale);
    double y = rows.top(e.device) + kBox + kSendLane + 4, h = kBox;
    if (is_send(e.op)) {  // in a thin lane under the row, as the predicted sends
      y += kBox + 1;
      h = kSendLane;
    }
    std::string note;
    auto it = predicted.find({e.device, e.op, e.stage, e.microbatch});
    if (it != predicted.end() && it->second > 0 && !m.recompute && kind_of(e.op) != 'R')
      note = fmt::format(" ({:.2f}x the predicted {:.3f} ms)", (e.end_s - e.start_s) / it->second,
                         it->second * 1e3);
    svg += box(e, x, y, w, h, "measured", view.plan.devices, m.recompute, "measured", note);
  }
  return svg;
}

/// A step curve of (time ms, bytes) points held until `end_ms`, as SVG points in a lane from
/// `bottom` up `kMemLane - 2` for `largest` bytes.
std::string curve_points(const std::vector<std::pair<double, double>>& points, double end_ms,
                         double scale, double bottom, double largest) {
  std::string out;
  double y_prev = bottom;
  auto y_of = [&](double b) { return bottom - b / largest * (kMemLane - 2); };
  out += fmt::format("{:.2f},{:.1f} ", kLeft + std::max(0.0, points.front().first) * scale, bottom);
  for (const auto& [ms, b] : points) {
    const double x = kLeft + std::max(0.0, ms) * scale;
    out += fmt::format("{:.2f},{:.1f} {:.2f},{:.1f} ", x, y_prev, x, y_of(b));
    y_prev = y_of(b);
  }
  out += fmt::format("{:.2f},{:.1f}", kLeft + end_ms * scale, y_prev);
  return out;
}

/// Each device's memory over the step in a lane under its rows, on the timeline's time axis: the
/// predicted curve (plan.json's device_memory) filled, a traced run's measured counter over its
/// median step as a red line; one scale for every device (the largest value drawn), so lanes
/// compare; the peak in the lane's title.
std::string memory_lanes(const PlanView& view, const MeasuredRun* measured, const Rows& rows,
                         double scale) {
  const plan::Plan& plan = view.plan;
  // The measured counter of each pipeline device over the reported step, from the step's start
  // (the value held when it starts first).
  std::vector<std::vector<std::pair<double, double>>> metered(static_cast<size_t>(plan.devices));
  double measured_end_ms = 0;
  if (measured != nullptr && measured->traced && !measured->memory.empty()) {
    const MeasuredStep& step = measured->steps.at(static_cast<size_t>(measured->reported_step));
    measured_end_ms = (step.end_s - step.start_s) * 1e3;
    for (const MeasuredMemory& m : measured->memory) {
      if (m.device >= plan.devices || m.time_s > step.end_s) continue;
      auto& points = metered[static_cast<size_t>(m.device)];
      const double ms = (m.time_s - step.start_s) * 1e3;
      if (ms < 0 && !points.empty()) points.clear();  // only the last value before the start
      points.emplace_back(std::max(0.0, ms), static_cast<double>(m.bytes));
    }
  }
  double largest = 1;
  for (const plan::DevicePeak& d : plan.device_memory)
    largest = std::max(largest, static_cast<double>(d.peak_bytes));
  for (const auto& points : metered)
    for (const auto& [ms, b] : points) largest = std::max(largest, b);
  std::string svg;
  for (const plan::DevicePeak& d : plan.device_memory) {
    if (d.time_ms.empty() || d.time_ms.size() != d.bytes.size()) continue;
    const double top = rows.memory_top(d.device), bottom = top + kMemLane;
    std::vector<std::pair<double, double>> predicted;
    for (size_t i = 0; i < d.time_ms.size(); ++i)
      predicted.emplace_back(d.time_ms[i], static_cast<double>(d.bytes[i]));
    std::string title = fmt::format("device {} memory: predicted peak {} at {:.3f} ms", d.device,
                                    format_bytes(static_cast<double>(d.peak_bytes)), d.peak_ms);
    const auto& points = metered[static_cast<size_t>(d.device)];
    double measured_peak = 0;
    for (const auto& [ms, b] : points) measured_peak = std::max(measured_peak, b);
    if (!points.empty())
      title += fmt::format("; measured peak {} in the median step", format_bytes(measured_peak));
    svg += fmt::format(
        "<g class=\"memory-lane\" data-device=\"{}\"><title>{}</title>"
        "<text x=\"0\" y=\"{:.1f}\" class=\"row memory-row\">memory</text>"
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#bbb\"/>"
        "<polyline class=\"memory-predicted\" points=\"{}\" fill=\"#c6dbef\" stroke=\"#3182bd\" "
        "stroke-width=\"1\"/>",
        d.device, escaped(title), top + 15, kLeft, bottom, kLeft + kWidth, bottom,
        curve_points(predicted, plan.predicted.step_ms, scale, bottom, largest));
    if (!points.empty())
      svg += fmt::format(
          "<polyline class=\"memory-measured\" points=\"{}\" fill=\"none\" stroke=\"#b22222\" "
          "stroke-width=\"1.2\"/>",
          curve_points(points, measured_end_ms, scale, bottom, largest));
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"memory-peak\">{}</text></g>\n",
                       kLeft + kWidth - 2, top + 8,
                       escaped(fmt::format("peak {}",
                                           format_bytes(static_cast<double>(d.peak_bytes)))));
  }
  return svg;
}

/// A dashed vertical line at `ms` across the rows with its label above the axis' right end.
std::string step_marker(double ms, double scale, double bottom, std::string_view cls,
                        std::string_view colour, const std::string& label, double label_y) {
  const double x = kLeft + ms * scale;
  return fmt::format(
      "<line class=\"{0}\" x1=\"{1:.2f}\" y1=\"{2}\" x2=\"{1:.2f}\" y2=\"{3:.1f}\" stroke=\"{4}\" "
      "stroke-width=\"1.5\" stroke-dasharray=\"5 3\"/>"
      "<text x=\"{1:.2f}\" y=\"{5:.1f}\" class=\"marker\" fill=\"{4}\">{6}</text>\n",
      cls, x, kAxis - 6, bottom, colour, label_y, escaped(label));
}

}  // namespace

char kind_of(schedule::Op op) {
  using schedule::Op;
  switch (op) {
    case Op::kForward:
      return 'F';
    case Op::kBackward:
    case Op::kBackwardInput:
      return 'B';
    case Op::kBackwardWeight:
      return 'W';
    case Op::kOptimizerStep:
      return 'O';
    case Op::kAllReduce:
    case Op::kAllReduceShared:
      return 'A';
    case Op::kRecvAct:
    case Op::kRecvGrad:
      return 'R';
    default:
      return 'S';
  }
}

std::string timeline_svg(const PlanView& view, const MeasuredRun* measured) {
  const plan::Plan& plan = view.plan;
  const bool traced = measured != nullptr && measured->traced;
  Rows rows{kBox + 1 + kSendLane + kGap + (traced ? kBox + 4 + 1 + kSendLane : 0), traced};
  const bool memory = std::any_of(plan.device_memory.begin(), plan.device_memory.end(),
                                  [](const plan::DevicePeak& d) { return !d.time_ms.empty(); });
  if (memory) rows.per_device += kMemLane + 4;
  const double predicted_ms = plan.predicted.step_ms;
  const double measured_ms = measured != nullptr ? measured->reported_step_ms() : 0;
  const double span_ms = std::max({predicted_ms, measured_ms, 1e-6});
  const double scale = kWidth / span_ms;
  const double bottom = rows.top(plan.devices) - kGap + 4;
  const double height = bottom + 36;

  std::string svg = fmt::format(
      "<svg class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {:.0f}\" "
      "preserveAspectRatio=\"xMinYMin meet\" role=\"img\" aria-label=\"timeline\">\n",
      kLeft + kWidth + kRight, height);
  for (int d = 0; d < plan.devices; ++d) {
    const double y = rows.top(d);
    svg += fmt::format(
        "<text x=\"0\" y=\"{:.1f}\" class=\"row\">device {}</text>"
        "<rect x=\"{}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"#f6f6f6\"/>\n",
        y + 14, d, kLeft, y, predicted_ms * scale, kBox);
    if (traced)
      svg += fmt::format("<text x=\"0\" y=\"{:.1f}\" class=\"row measured-row\">measured</text>\n",
                         y + kBox + kSendLane + 18);
  }
  svg += axis(span_ms, scale, bottom);
  svg += predicted_boxes(view, rows, scale);
  if (traced) svg += measured_boxes(view, *measured, rows, scale);
  if (memory) svg += memory_lanes(view, measured, rows, scale);
  svg += step_marker(predicted_ms, scale, bottom, "predicted-step", "#1f4e79",
                     fmt::format("predicted step {:.3f} ms", predicted_ms), bottom + 14);
  if (measured != nullptr)
    svg += step_marker(measured_ms, scale, bottom, "measured-step", "#b22222",
                       fmt::format("measured step {:.3f} ms (median)", measured_ms), bottom + 30);
  return svg + "</svg>\n";
}

}  // namespace stagecraft::dump::html
