// Issue 16, "one memory figure per device": stagec plans several samples (a zb-h1 and an
// interleaved plan among them) and every view of each plan shows each device's predicted peak as
// the one number plan.json records (device_memory[d].peak_bytes): stagec's summary, stagedump's
// text report, --json, --html, --trace (the memory counter) and --dot, and stagerun's
// "predicted peak" in text and --json. The views for people print it with format_bytes, the
// machine views exactly; the parts add up to it.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/format/bytes.h"
#include "tests/cli/run_command.h"
#include "tests/test_util.h"

namespace stagecraft {
namespace {

using testing::run_command;

/// The lines of `text`.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// The first match of `pattern` in `text` (group 1), or "" when there is none.
std::string find(const std::string& text, const std::string& pattern) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(pattern)) ? m[1].str() : "";
}

/// A bytes figure as the views print it: "4.06 MiB", "512 B".
constexpr const char* kBytes = R"(([0-9.]+ (?:B|KiB|MiB|GiB|TiB)))";

/// The device rows of stagedump's "memory per device" table: device -> its peak column.
std::vector<std::string> text_table_peaks(const std::string& text, int devices) {
  std::vector<std::string> peaks(devices);
  std::vector<std::string> lines = lines_of(text);
  auto at = std::find_if(lines.begin(), lines.end(),
                         [](const std::string& l) { return l.starts_with("memory per device"); });
  REQUIRE(at != lines.end());
  for (; at != lines.end() && !at->starts_with("parts per stage"); ++at) {
    std::smatch m;
    if (std::regex_search(*at, m, std::regex(std::string(R"(^ +([0-9]+) +)") + kBytes)))
      peaks.at(std::stoi(m[1].str())) = m[2].str();
  }
  return peaks;
}

/// stagerun --json's summary: the last record (JSON Lines: one record per step, then it).
nlohmann::json stagerun_summary(const std::string& out) {
  const std::vector<std::string> lines = lines_of(out);
  REQUIRE(!lines.empty());
  return nlohmann::json::parse(lines.back());
}

struct Sample {
  const char* name;
  const char* stagec_args;  ///< After the model and -o PLAN.
  int devices;
};

void check_one_figure(const Sample& sample) {
  INFO(sample.name);
  testing::TempDir dir;
  const std::string plan = dir.file("plan");
  const std::string stagec =
      run_command(dir, fmt::format("{} {} -o {}", STAGECRAFT_STAGEC, sample.stagec_args, plan));
  const nlohmann::json plan_json = nlohmann::json::parse(testing::read_bytes(plan + "/plan.json"));
  REQUIRE(plan_json["device_memory"].size() == static_cast<size_t>(sample.devices));
  std::vector<int64_t> peak(sample.devices);
  for (int d = 0; d < sample.devices; ++d) {
    peak[d] = plan_json["device_memory"][d]["peak_bytes"].get<int64_t>();
    CHECK(plan_json["predicted"]["device_peak_bytes"][d] == peak[d]);
  }
  const int64_t largest = *std::max_element(peak.begin(), peak.end());

  const std::string text = run_command(dir, fmt::format("{} {}", STAGECRAFT_STAGEDUMP, plan));
  const nlohmann::json json = nlohmann::json::parse(
      run_command(dir, fmt::format("{} {} --json", STAGECRAFT_STAGEDUMP, plan)));
  const std::string html =
      run_command(dir, fmt::format("{} {} --html -", STAGECRAFT_STAGEDUMP, plan));
  const nlohmann::json trace = nlohmann::json::parse(
      run_command(dir, fmt::format("{} {} --trace -", STAGECRAFT_STAGEDUMP, plan)));
  const std::string dot =
      run_command(dir, fmt::format("{} {} --dot -", STAGECRAFT_STAGEDUMP, plan));
  const std::string stagerun_text =
      run_command(dir, fmt::format("{} {} --steps 2 -q", STAGECRAFT_STAGERUN, plan));
  // --json: the device figures are in the summary, the record after the per-step ones.
  const nlohmann::json stagerun_json = stagerun_summary(
      run_command(dir, fmt::format("{} {} --steps 2 -q --json", STAGECRAFT_STAGERUN, plan)));

  const std::vector<std::string> table = text_table_peaks(text, sample.devices);
  std::vector<std::string> stagerun_rows = lines_of(stagerun_text);
  for (int d = 0; d < sample.devices; ++d) {
    CAPTURE(d);
    const std::string shown = format_bytes(static_cast<double>(peak[d]));
    CAPTURE(shown);
    // stagec's summary: "device D (stage ...) peaks at X, ...".
    CHECK(find(stagec, fmt::format(R"(\n  device {} \([^)]*\) peaks at {})", d, kBytes)) == shown);
    // stagedump's text report.
    CHECK(table[d] == shown);
    // --json: the device record, its parts, the prediction and the simulated figures.
    const nlohmann::json& device = json["devices"][d];
    CHECK(device["peak_bytes"] == peak[d]);
    int64_t parts = 0;
    for (const auto& part : device["parts"].items()) parts += part.value().get<int64_t>();
    CHECK(parts == peak[d]);
    CHECK(json["predicted"]["device_peak_bytes"][d] == peak[d]);
    CHECK(json["simulated"]["device_peak_bytes"][d] == peak[d]);
    // --html: the bar of the device, its exact figure and its label.
    CHECK(html.find(fmt::format("data-device=\"{}\" data-peak-bytes=\"{}\"", d, peak[d])) !=
          std::string::npos);
    CHECK(find(html, fmt::format(R"(data-device="{}"[\s\S]*?>peak {}</text>)", d, kBytes)) ==
          shown);
    // --trace: the device's memory counter peaks at it.
    int64_t counter = -1;
    for (const auto& event : trace["traceEvents"])
      if (event["ph"] == "C" && event["name"] == fmt::format("memory device {}", d))
        counter = std::max(counter, event["args"]["bytes"].get<int64_t>());
    CHECK(counter == peak[d]);
    // --dot: the label under the drawing.
    CHECK(find(dot, fmt::format(R"(\\n device {}: {})", d, kBytes)) == shown);
    // stagerun: the "predicted peak" column of its device table, and --json.
    CHECK(stagerun_json["device"][d]["predicted_peak_bytes"] == peak[d]);
    std::string predicted;
    for (const std::string& row : stagerun_rows) {
      std::smatch m;
      if (std::regex_search(
              row, m, std::regex(fmt::format(R"(^ +{} +[0-9.]+% +{} +{}$)", d, kBytes, kBytes))))
        predicted = m[2].str();
    }
    CHECK(predicted == shown);
  }
  // The largest of them wherever one figure stands for the plan.
  CHECK(find(stagec, std::string(R"(predicted: .* peak )") + kBytes) ==
        format_bytes(static_cast<double>(largest)));
  CHECK(json["predicted"]["peak_memory_bytes"] == largest);
}

TEST_CASE("every view shows each device's one predicted peak") {
  const std::string samples = STAGECRAFT_SAMPLES;
  const std::string gpt = samples +
                          "/gpt_tiny.onnx --train --loss cross-entropy --batch 8 "
                          "--dim seq=16 --device-spec cpu";
  const std::string zb = gpt + " --devices 3 --microbatches 4 --schedule zb-h1";
  const std::string interleaved = gpt + " --devices 2 --microbatches 4 --schedule interleaved";
  const std::string gpipe = samples +
                            "/mnist_cnn.onnx --train --loss cross-entropy --batch 8 --devices 2 "
                            "--microbatches 4 --schedule gpipe --recompute all --device-spec cpu";
  const std::string toy = samples +
                          "/toy.onnx --train --loss mse --batch 8 --devices 2 "
                          "--microbatches 4 --device-spec cpu";
  const std::string inference =
      samples + "/resnet_small.onnx --batch 8 --devices 2 --microbatches 2 --device-spec cpu";
  for (const Sample& sample :
       {Sample{"gpt_tiny zb-h1", zb.c_str(), 3},
        Sample{"gpt_tiny interleaved", interleaved.c_str(), 2},
        Sample{"mnist gpipe recompute", gpipe.c_str(), 2}, Sample{"toy 1f1b", toy.c_str(), 2},
        Sample{"resnet inference", inference.c_str(), 2}})
    check_one_figure(sample);
}

}  // namespace
}  // namespace stagecraft
