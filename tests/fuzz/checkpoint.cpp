// Fuzz target: `stagerun PLAN --resume DIR`'s reading of a checkpoint. The pipeline is loaded
// once from STAGECRAFT_FUZZ_PLAN; each input edits a copy of the checkpoint named by
// STAGECRAFT_FUZZ_CHECKPOINT (saved from that plan): the first byte picks the file the rest
// replaces (modulo: manifest.json, then its .npy files in name order).
#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/exec/checkpoint.h"
#include "runtime/exec/pipeline.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

namespace fs = std::filesystem;

const std::vector<std::string>& replaceable(const std::string& checkpoint) {
  static const std::vector<std::string> names = [&] {
    std::vector<std::string> npy;
    for (const auto& entry : fs::recursive_directory_iterator(checkpoint))
      if (entry.path().extension() == ".npy")
        npy.push_back(fs::relative(entry.path(), checkpoint).string());
    std::sort(npy.begin(), npy.end());
    std::vector<std::string> all{"manifest.json"};
    all.insert(all.end(), npy.begin(), npy.end());
    return all;
  }();
  return names;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stagecraft;
  if (size == 0) return 0;
  static const std::string plan = fuzz::template_dir("STAGECRAFT_FUZZ_PLAN");
  static const std::string checkpoint = fuzz::template_dir("STAGECRAFT_FUZZ_CHECKPOINT");
  static const std::unique_ptr<rt::Pipeline> pipeline = [] {
    try {
      return rt::Pipeline::load(plan, rt::cpu_backend(), 1);
    } catch (const std::exception& e) {
      fuzz::finding(std::string("the template plan does not load: ") + e.what());
    }
  }();
  const std::vector<std::string>& names = replaceable(checkpoint);
  const std::string& name = names[data[0] % names.size()];
  const std::string dir = fuzz::fresh_copy(checkpoint, "checkpoint");
  fuzz::scratch_file("checkpoint/" + name, data + 1, size - 1);
  fuzz::expect_clean([&] { rt::load_checkpoint(*pipeline, dir); });
  return 0;
}
