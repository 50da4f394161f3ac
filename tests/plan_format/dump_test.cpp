// stagedump's views on plans built in code: the predicted timeline, the text report, the
// JSON schema, the Graphviz and Chrome-trace outputs and the HTML page.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "runtime/format/error.h"
#include "tests/plan_format/sample_plan.h"
#include "tests/test_util.h"
#include "tools/dump/render.h"

namespace stagecraft::dump {
namespace {

/// Writes `plan` to a fresh folder and loads it as stagedump does.
struct LoadedPlan {
  testing::TempDir dir;
  PlanView view;
  explicit LoadedPlan(const plan::Plan& plan) {
    testing::write_plan_dir(plan, dir.file("plan"));
    view = load_view(dir.file("plan"));
  }
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// The row of `device` in the ASCII timeline, between the bars.
std::string timeline_row(const std::string& text, int device) {
  std::string label = "device " + std::to_string(device);
  size_t at = text.find(label);
  REQUIRE(at != std::string::npos);
  size_t begin = text.find('|', at) + 1;
  return text.substr(begin, text.find('|', begin) - begin);
}

TEST_CASE("the timelines draw the plan's predicted timeline, not a replay") {
  plan::Plan plan = testing::sample_plan("1f1b", 2, 1, 4);
  // Forward 1 ms, backward 2 ms, P = 2, M = 4: (M + P - 1) * 3 ms, bubble (P-1)/(M+P-1).
  CHECK(plan.predicted.step_ms == doctest::Approx(15));
  CHECK(plan.predicted.bubble_fraction == doctest::Approx(0.2));
  {
    LoadedPlan loaded(plan);
    CHECK(compute_events(loaded.view.plan.timeline).size() == 2 * 4 * 2);
    CHECK(timeline_row(render_ascii_timeline(loaded.view, 30), 1) ==
          "..F0B0--F1B1--F2B2--F3B3--....");
  }
  // A plan whose planner predicted an optimizer step after the last backward: the view draws it
  // where the plan puts it (a replay would not know of it).
  for (schedule::TimelineEvent& event : plan.timeline) {
    if (event.op == schedule::Op::kOptimizerStep && event.device == 1) {
      event.start_s = 0.013;
      event.end_s = 0.015;
    }
  }
  LoadedPlan edited(plan);
  CHECK(timeline_row(render_ascii_timeline(edited.view, 30), 1) ==
        "..F0B0--F1B1--F2B2--F3B3--O---");
  nlohmann::json json = nlohmann::json::parse(render_json(edited.view).dump());
  CHECK(json["timeline"].back()["op"] == "optimizer");
  CHECK(json["timeline"].back()["end_ms"] == doctest::Approx(15));
  CHECK(json["simulated"]["step_ms"] == doctest::Approx(15));
}

TEST_CASE("the text view says which devices share a processor and what it costs") {
  plan::Plan plan = testing::sample_plan("1f1b", 2, 1, 4);
  CHECK(render_text(LoadedPlan(plan).view).find("processors  ") == std::string::npos);
  plan.cluster.devices_per_processor = 2;
  plan.processors.processor_of = {0, 0};
  plan.processors.separate_step_ms = 10;
  CHECK(contains(render_text(LoadedPlan(plan).view),
                 "\nprocessors  devices 0 and 1 share processor 0 (2 per processor, overlap 0): "
                 "predicted step 15.000 ms, 10.000 ms if each had its own (+50.0%)\n"));
}

TEST_CASE("the ASCII timeline draws F B W with microbatches and idle dots") {
  LoadedPlan loaded(testing::sample_plan("1f1b", 2, 1, 4));
  std::string text = render_ascii_timeline(loaded.view, 30);
  // 15 ms over 30 columns: a forward takes 2 columns, a backward 4.
  // Device 0 waits for the first gradient from 2 ms to 4 ms; device 1 for the first
  // activation until 1 ms, and is done at 13 ms.
  CHECK(timeline_row(text, 0) == "F0F1....B0--F2B1--F3B2--..B3--");
  CHECK(timeline_row(text, 1) == "..F0B0--F1B1--F2B2--F3B3--....");

  LoadedPlan zb(testing::sample_plan("zb-h1", 2, 1, 4));
  std::string zb_text = render_ascii_timeline(zb.view, 60);
  CHECK(contains(timeline_row(zb_text, 0), "W0"));
  CHECK(zb.view.plan.predicted.step_ms < loaded.view.plan.predicted.step_ms);

  LoadedPlan interleaved(testing::sample_plan("interleaved", 2, 2, 4));
  std::string row = timeline_row(render_ascii_timeline(interleaved.view, 100), 0);
  CHECK(contains(row, "f0"));  // Chunk 1 of device 0 (stage 2) in lower case.
  CHECK(row.size() == 100);
}

TEST_CASE("the text report has the header, the tables, the cuts, the baselines and the timeline") {
  LoadedPlan loaded(testing::sample_plan());
  std::string text = render_text(loaded.view);
  INFO(text);
  for (const char* part :
       {"schedule    1f1b: 2 devices x 1 chunk = 2 stages", "batch       8 = 4 microbatches x 2",
        "training    optimizer adamw, precision fp32", "cost model  roofline(test, fp32)",
        "stage  device  first op  last op  ops", "s0_a      s0_b", "weights",
        "stage 0: balances predicted time", "stage 0 | 1: 2 tensors, 256 B",
        "act0 float32[2,16] 128 B (stage 0 -> 1)", "skip float32[2,16] 128 B",
        "predicted   step 15.000 ms, 533 samples/s, bubble 20.0%", "parameters", "0.80", "uniform",
        "no", "device 0  |F0", "device 1  |"}) {
    CHECK_MESSAGE(contains(text, part), std::string(part));
  }
}

TEST_CASE("the JSON view has the fixed keys") {
  LoadedPlan loaded(testing::sample_plan());
  nlohmann::json json = nlohmann::json::parse(render_json(loaded.view).dump());
  for (const char* key :
       {"stages", "predicted", "baselines", "ops", "cuts", "plan", "simulated", "timeline"}) {
    CHECK_MESSAGE(json.contains(key), std::string(key));
  }
  const auto& stage = json["stages"][1];
  for (const char* key :
       {"index", "device", "nodes", "params", "memory_bytes", "fwd_ms", "bwd_ms"}) {
    CHECK_MESSAGE(stage.contains(key), std::string(key));
  }
  CHECK(stage["nodes"] == 2);
  for (const char* key : {"weights", "gradients", "optimizer", "activations", "temporary"}) {
    CHECK_MESSAGE(stage["memory_bytes"].contains(key), std::string(key));
  }
  CHECK_FALSE(stage["memory_bytes"].contains("total"));  // a device has a peak, not a stage
  REQUIRE(json["devices"].size() == 2);
  for (int d = 0; d < 2; ++d) {
    CHECK(json["devices"][d]["peak_bytes"] == loaded.view.plan.device_memory[d].peak_bytes);
    CHECK(json["devices"][d]["peak_bytes"] == json["predicted"]["device_peak_bytes"][d]);
    CHECK(json["devices"][d]["stages"] == std::vector<int>{d});
  }
  for (const char* key : {"step_ms", "bubble_fraction", "samples_per_s"}) {
    CHECK(json["predicted"].contains(key));
    CHECK(json["baselines"]["parameters"].contains(key));
    CHECK(json["baselines"]["uniform"].contains(key));
  }
  CHECK(json["baselines"]["parameters"]["step_ratio"].get<double>() == doctest::Approx(0.8));
  for (const char* key : {"name", "stage", "fwd_ms", "bwd_ms"}) CHECK(json["ops"][0].contains(key));
  CHECK(json["ops"].size() == 4);
  CHECK(json["cuts"][0]["bytes"] == 256);
}

TEST_CASE("the DOT view clusters ops by stage with edges for the cut tensors") {
  // The sample's stage files are placeholders, not ONNX: the ops are chained in execution order
  // and the cut tensors go from each stage's last op to the reading stage's first.
  LoadedPlan loaded(testing::sample_plan());
  std::string dot = render_dot(loaded.view);
  CHECK(dot.starts_with("digraph plan {"));
  CHECK(contains(dot, "subgraph cluster_stage0"));
  CHECK(contains(dot, "subgraph cluster_stage1"));
  CHECK(contains(dot, "no ONNX in its file"));
  CHECK(contains(dot, "s0_0 -> s0_1;"));
  CHECK(contains(dot, "s0_1 -> s1_0 [label=\"act0\\n128 B (128 B)\", class=\"cut\""));
  CHECK(contains(dot, "s0_1 -> s1_0 [label=\"skip\\n128 B (128 B)\", class=\"cut\""));
  CHECK(contains(dot, "label=\"labels\", shape=ellipse"));
  CHECK(std::count(dot.begin(), dot.end(), '{') == std::count(dot.begin(), dot.end(), '}'));
}

/// The instructions of schedule.json, every device's.
size_t instruction_count(const PlanView& view) {
  size_t count = 0;
  for (const auto& list : view.schedule) count += list.size();
  return count;
}

TEST_CASE("the trace view has a process per device, a slice per instruction and memory") {
  LoadedPlan loaded(testing::sample_plan("zb-h1", 2, 1, 4));
  nlohmann::json trace = nlohmann::json::parse(render_trace(loaded.view).dump());
  CHECK(trace["displayTimeUnit"] == "ms");
  CHECK(trace["otherData"]["format_version"] == 2);
  size_t slices = 0, steps = 0, counters = 0, compute = 0;
  std::set<std::string> processes;
  for (const auto& event : trace["traceEvents"]) {
    for (const char* field : {"ph", "pid"}) CHECK(event.contains(field));
    if (event["ph"] == "M" && event["name"] == "process_name")
      processes.insert(event["args"]["name"].get<std::string>());
    if (event["ph"] == "C") ++counters;
    if (event["ph"] != "X") continue;
    for (const char* field : {"ts", "dur", "tid", "name", "cat", "args"})
      CHECK(event.contains(field));
    CHECK(event["dur"].get<double>() >= 0);
    if (event["cat"] == "step") {
      ++steps;
      continue;
    }
    ++slices;
    CHECK(event["args"]["device"] == event["pid"].get<int>() - 1);
    if (event["tid"] == 1 && event["args"]["microbatch"] >= 0) ++compute;
  }
  CHECK(processes == std::set<std::string>{"predicted / device 0", "predicted / device 1"});
  CHECK(slices == instruction_count(loaded.view));  // sends and receives too
  CHECK(compute == 2 * 4 * 3);                      // stages x microbatches x (F, B, W)
  CHECK(steps == 2);
  CHECK(counters > 0);
  const auto& events = trace["traceEvents"];
  const auto first = std::find_if(events.begin(), events.end(), [](const auto& event) {
    return event["ph"] == "X" && event["cat"] == "forward";
  });
  REQUIRE(first != events.end());
  CHECK((*first)["name"] == "F0");
  CHECK((*first)["ts"] == 0);
  CHECK((*first)["dur"].get<double>() == doctest::Approx(1000));

  LoadedPlan interleaved(testing::sample_plan("interleaved", 2, 2, 4));
  std::string text = render_trace(interleaved.view).dump();
  CHECK(contains(text, "\"F0 chunk 1\""));
  CHECK(contains(text, "\"F0 chunk 0\""));
}

/// A traced run of the plan made of its predicted step played `steps` times: what stagerun
/// --trace would write if the prediction were exact.
std::string fake_trace(const PlanView& view, int steps, const std::string& path) {
  std::vector<schedule::TimelineEvent> events;
  const double step_s = view.plan.predicted.step_ms / 1e3;
  for (int s = 0; s < steps; ++s)
    for (schedule::TimelineEvent e : view.plan.timeline) {
      if (!is_timed(e.op)) continue;
      e.start_s += s * step_s;
      e.end_s += s * step_s;
      events.push_back(e);
    }
  auto where = [](size_t i) { return "event " + std::to_string(i); };
  std::vector<MeasuredStep> split = split_steps(events, view.plan, view.schedule, path, where);
  testing::write_bytes(path, measured_trace(view.plan, split).dump(1));
  return path;
}

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_CASE("a measured trace of the plan is read back, step by step, and drawn") {
  LoadedPlan loaded(testing::sample_plan("zb-h1", 2, 1, 4));
  const std::string path = fake_trace(loaded.view, 3, loaded.dir.file("run.trace.json"));
  MeasuredRun run = load_measured(path, loaded.view);
  CHECK(run.traced);
  REQUIRE(run.steps.size() == 3);
  CHECK(run.step_ms[1] == doctest::Approx(loaded.view.plan.predicted.step_ms).epsilon(0.05));
  CHECK(run.steps[2].events.size() == 2 * (4 * 3 + 1));  // F, B, W per microbatch, O per stage

  std::string html = render_html(loaded.view, &run);
  size_t measured = 0;
  for (size_t at = html.find("<rect class=\"measured"); at != std::string::npos;
       at = html.find("<rect class=\"measured", at + 1))
    ++measured;
  CHECK(measured == 2 * (4 * 3 + 1));
  CHECK(contains(html, "measured step"));

  // Both runs in one trace: predicted and measured processes, one slice per timed instruction
  // per step in the measured ones.
  nlohmann::json trace = nlohmann::json::parse(render_trace(loaded.view, &run).dump());
  std::set<std::string> processes;
  std::map<int, int> per_step;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "process_name")
      processes.insert(event["args"]["name"].get<std::string>());
    if (event["ph"] == "X" && event["cat"] != "step" && event["pid"].get<int>() > 1000)
      ++per_step[event["args"]["step"].get<int>()];
  }
  CHECK(processes == std::set<std::string>{"predicted / device 0", "predicted / device 1",
                                           "measured / device 0", "measured / device 1"});
  CHECK(per_step == std::map<int, int>{{1, 26}, {2, 26}, {3, 26}});
  // The file stagedump wrote, read back as a measured run: its predicted processes are left out.
  testing::write_bytes(loaded.dir.file("both.json"), trace.dump());
  CHECK(load_measured(loaded.dir.file("both.json"), loaded.view).steps.size() == 3);
}

TEST_CASE("a trace's runtime step lengths are the measured steps, and a wrong list is refused") {
  LoadedPlan loaded(testing::sample_plan("zb-h1", 2, 1, 4));
  const std::string path = fake_trace(loaded.view, 3, loaded.dir.file("run.trace.json"));
  // Without otherData.step_ms (an older trace), the events' spans.
  const MeasuredRun spans = load_measured(path, loaded.view);
  CHECK(spans.steps[1].runtime_ms == -1);
  nlohmann::json doc = nlohmann::json::parse(testing::read_bytes(path));
  doc["otherData"]["step_ms"] = {9.0, 7.5, 8.0};
  testing::write_bytes(path, doc.dump());
  const MeasuredRun run = load_measured(path, loaded.view);
  CHECK(run.steps[1].runtime_ms == 7.5);
  CHECK(run.step_ms == std::vector<double>{9.0, 7.5, 8.0});
  CHECK(run.reported_step_ms() == 7.5);
  // Written back (stagerun --trace), it keeps them.
  const nlohmann::json again =
      nlohmann::json::parse(measured_trace(loaded.view.plan, run.steps).dump());
  CHECK(again["otherData"]["step_ms"] == doc["otherData"]["step_ms"]);
  doc["otherData"]["step_ms"] = {9.0, 7.5};
  testing::write_bytes(path, doc.dump());
  CHECK(contains(error_of([&] { load_measured(path, loaded.view); }),
                 "field 'otherData.step_ms' must list the 3 traced steps' lengths"));
  doc["otherData"]["step_ms"] = {9.0, -1.0, 8.0};
  testing::write_bytes(path, doc.dump());
  CHECK(contains(error_of([&] { load_measured(path, loaded.view); }),
                 "field 'otherData.step_ms[1]' must be a number >= 0"));
}

TEST_CASE("a measured run of another plan is refused naming the file and the field") {
  LoadedPlan zb(testing::sample_plan("zb-h1", 2, 1, 4));
  LoadedPlan onef1b(testing::sample_plan("1f1b", 2, 1, 4));
  LoadedPlan three(testing::sample_plan("zb-h1", 3, 1, 3));
  const std::string zb_trace = fake_trace(zb.view, 2, zb.dir.file("zb.trace.json"));
  const std::string three_trace = fake_trace(three.view, 1, three.dir.file("three.trace.json"));

  std::string schedule = error_of([&] { load_measured(zb_trace, onef1b.view); });
  CHECK_MESSAGE(contains(schedule, zb_trace + ": traceEvents["), schedule);
  CHECK_MESSAGE(contains(schedule, "but the plan's schedule.json has"), schedule);
  CHECK_MESSAGE(contains(schedule, "a run of another plan"), schedule);

  std::string devices = error_of([&] { load_measured(three_trace, zb.view); });
  CHECK_MESSAGE(contains(devices, "is on device 2, but the plan has 2 devices"), devices);

  // A run cut off inside a step.
  nlohmann::json cut = nlohmann::json::parse(testing::read_bytes(zb_trace));
  cut["traceEvents"].erase(cut["traceEvents"].end() - 1);
  testing::write_bytes(zb.dir.file("cut.json"), cut.dump());
  std::string stops = error_of([&] { load_measured(zb.dir.file("cut.json"), zb.view); });
  CHECK_MESSAGE(contains(stops, "stops after 12 of the 13 timed instructions of step 2"), stops);

  // stagerun --json: the summary's devices, then its predicted step.
  auto summary = [&](int devices, double predicted_ms) {
    nlohmann::json step = {{"type", "step"}, {"format_version", 1}, {"step", 1}, {"step_ms", 9}};
    nlohmann::json s = {{"type", "summary"},
                        {"format_version", 1},
                        {"devices", devices},
                        {"microbatches", 4},
                        {"schedule", "zb-h1"},
                        {"predicted_step_ms", predicted_ms},
                        {"step_ms", {9.0, 8.0}},
                        {"bubble", {{"measured", 0.3}}},
                        {"device", nlohmann::json::array()}};
    for (int d = 0; d < devices; ++d)
      s["device"].push_back({{"busy_fraction", 0.7}, {"peak_bytes", 1000 + d}});
    testing::write_bytes(zb.dir.file("run.jsonl"), step.dump() + "\n" + s.dump() + "\n");
    return zb.dir.file("run.jsonl");
  };
  const double predicted = zb.view.plan.predicted.step_ms;
  MeasuredRun json_run = load_measured(summary(2, predicted), zb.view);
  CHECK_FALSE(json_run.traced);
  CHECK(json_run.reported_step_ms() == 8.0);
  CHECK(json_run.device[1].peak_bytes == 1001);
  CHECK(contains(render_html(zb.view, &json_run), "data-measured-peak-bytes=\"1001\""));
  std::string json_devices = error_of([&] { load_measured(summary(3, predicted), zb.view); });
  CHECK_MESSAGE(contains(json_devices, "run.jsonl: field 'devices' is 3, but the plan"),
                json_devices);
  std::string json_step = error_of([&] { load_measured(summary(2, predicted + 1), zb.view); });
  CHECK_MESSAGE(contains(json_step, "field 'predicted_step_ms' is"), json_step);
  testing::write_bytes(zb.dir.file("text.txt"), "hello\n");
  std::string text = error_of([&] { load_measured(zb.dir.file("text.txt"), zb.view); });
  CHECK_MESSAGE(contains(text, "text.txt: line 1 is not a JSON object"), text);
}

TEST_CASE("the HTML page is self-contained, with one box per instruction") {
  LoadedPlan loaded(testing::sample_plan("interleaved", 2, 2, 4));
  std::string html = render_html(loaded.view);
  CHECK(html.starts_with("<!DOCTYPE html>"));
  CHECK(contains(html, "<svg class=\"timeline\""));
  CHECK(contains(html, "viewBox="));
  CHECK(!contains(html, "src="));
  CHECK(!contains(html, "href="));
  // One inline script: the marker for headless checks.
  size_t scripts = 0;
  for (size_t at = html.find("<script"); at != std::string::npos; at = html.find("<script", at + 1))
    ++scripts;
  CHECK(scripts == 1);
  size_t boxes = 0;
  for (size_t at = html.find("<rect class=\"instr\""); at != std::string::npos;
       at = html.find("<rect class=\"instr\"", at + 1))
    ++boxes;
  CHECK(boxes == instruction_count(loaded.view));
  CHECK(contains(html, "class=\"tick\""));
  CHECK(contains(html, ">f0</text>"));  // chunk 1 in lower case
  // The plan beside the baselines, the better one marked.
  CHECK(contains(html, "<tr class=\"best\"><td>this plan</td>"));
  CHECK(contains(html, "stage 0 | 1"));
}

TEST_CASE("load_view names schedule.json when it is wrong") {
  testing::TempDir dir;
  testing::write_plan_dir(testing::sample_plan(), dir.file("plan"));
  testing::edit_file(dir.file("plan/schedule.json"), "\"FWD\"", "\"FORWARD\"");
  try {
    load_view(dir.file("plan"));
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kFormat);
    CHECK(contains(e.what(),
                   "plan: schedule.json: field 'devices[0].instructions[0].op' is not a known op"));
  }
}

}  // namespace
}  // namespace stagecraft::dump

namespace stagecraft::dump {
namespace {

TEST_CASE("the HTML page is titled by the model and its legends name only what the plan holds") {
  LoadedPlan inference(testing::sample_plan("inference", 2, 1, 4));
  const std::string page = render_html(inference.view);
  CHECK(contains(page, "<title>model: inference on 2 devices ("));
  // Forwards, receives and sends; no backward, weight gradient or optimizer step to show.
  auto legend = [](const std::string& html) {
    const size_t at = html.find("<p class=\"legend\">");
    REQUIRE(at != std::string::npos);
    return html.substr(at, html.find("</p>", at) - at);
  };
  CHECK(contains(legend(page), ">forward &nbsp;"));
  CHECK(!contains(legend(page), "optimizer step"));
  CHECK(!contains(legend(page), "weight gradient"));
  LoadedPlan training(testing::sample_plan("zb-h1", 2, 1, 4));
  const std::string trained = render_html(training.view);
  CHECK(contains(trained, "<title>model: zb-h1 on 2 devices ("));
  CHECK(contains(legend(trained), "weight gradient"));
  CHECK(contains(legend(trained), "optimizer step"));
}

}  // namespace
}  // namespace stagecraft::dump
