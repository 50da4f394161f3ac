// stagedump's views on plans built in code: the predicted timeline, the text report, the
// JSON schema, the Graphviz and Chrome-trace outputs and the HTML page.
#include <doctest/doctest.h>

#include <algorithm>
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
  LoadedPlan loaded(testing::sample_plan());
  std::string dot = render_dot(loaded.view);
  CHECK(dot.starts_with("digraph plan {"));
  CHECK(contains(dot, "subgraph cluster_stage0"));
  CHECK(contains(dot, "subgraph cluster_stage1"));
  CHECK(contains(dot, "s0_0 -> s0_1;"));
  CHECK(contains(
      dot,
      "s0_1 -> s1_0 [ltail=cluster_stage0, lhead=cluster_stage1, label=\"act0\\nskip\\n256 B\""));
  CHECK(contains(dot, "label=\"labels\", shape=ellipse"));
  CHECK(std::count(dot.begin(), dot.end(), '{') == std::count(dot.begin(), dot.end(), '}'));
}

TEST_CASE("the trace view is Chrome trace JSON with one thread per device") {
  LoadedPlan loaded(testing::sample_plan("zb-h1", 2, 1, 4));
  nlohmann::json trace = nlohmann::json::parse(render_trace(loaded.view).dump());
  CHECK(trace["displayTimeUnit"] == "ms");
  int complete = 0, threads = 0;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "X") {
      ++complete;
      CHECK(event["dur"].get<double>() > 0);
      CHECK(event["args"].contains("stage"));
      CHECK(event["args"].contains("microbatch"));
    }
    if (event["ph"] == "M" && event["name"] == "thread_name") ++threads;
  }
  CHECK(complete == 2 * 4 * 3);  // Stages x microbatches x (F, B, W).
  CHECK(threads == 2);
  const auto& events = trace["traceEvents"];
  const auto& first = *std::find_if(events.begin(), events.end(),
                                    [](const auto& event) { return event["ph"] == "X"; });
  CHECK(first["name"] == "F0");
  CHECK(first["cat"] == "forward");
  CHECK(first["ts"] == 0);
  CHECK(first["dur"].get<double>() == doctest::Approx(1000));
}

TEST_CASE("the HTML page is self-contained") {
  LoadedPlan loaded(testing::sample_plan("interleaved", 2, 2, 4));
  std::string html = render_html(loaded.view);
  CHECK(html.starts_with("<!DOCTYPE html>"));
  CHECK(std::count(html.begin(), html.end(), '\n') > 20);
  CHECK(contains(html, "<svg"));
  CHECK(!contains(html, "src="));
  CHECK(!contains(html, "href="));
  CHECK(!contains(html, "<script"));
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
