// Fuzz target: everything `stagerun PLAN` reads before it runs (plan.json, schedule.json, the
// stage files), through Pipeline::load on the CPU backend. The plan is a copy of the one named
// by STAGECRAFT_FUZZ_PLAN (a small training plan of 2 devices); the first byte picks which of
// its files the rest of the input replaces (modulo: plan.json, schedule.json, then its .onnx
// files in name order).
#include <algorithm>
#include <filesystem>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/exec/pipeline.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

namespace fs = std::filesystem;

// The template's files an input may replace, as names inside the plan folder.
const std::vector<std::string>& replaceable(const std::string& plan) {
  static const std::vector<std::string> names = [&] {
    std::vector<std::string> onnx;
    for (const auto& entry : fs::directory_iterator(plan))
      if (entry.path().extension() == ".onnx") onnx.push_back(entry.path().filename().string());
    std::sort(onnx.begin(), onnx.end());
    std::vector<std::string> all{"plan.json", "schedule.json"};
    all.insert(all.end(), onnx.begin(), onnx.end());
    return all;
  }();
  return names;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stagecraft;
  if (size == 0) return 0;
  static const std::string plan = fuzz::template_dir("STAGECRAFT_FUZZ_PLAN");
  const std::vector<std::string>& names = replaceable(plan);
  const std::string& name = names[data[0] % names.size()];
  const std::string dir = fuzz::fresh_copy(plan, "plan");
  fuzz::scratch_file("plan/" + name, data + 1, size - 1);
  fuzz::expect_clean([&] { rt::Pipeline::load(dir, rt::cpu_backend(), 1); });
  return 0;
}
