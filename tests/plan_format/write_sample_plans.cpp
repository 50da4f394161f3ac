// write_sample_plans DIR: writes the plan directories the stagedump command-line tests read.
//   DIR/good         1f1b, 2 devices, 4 microbatches (consistent)
//   DIR/zb           zb-h1, 3 devices, 6 microbatches
//   DIR/interleaved  interleaved, 2 devices x 2 chunks, 4 microbatches
//   DIR/bad_device   good, with plan.json's stages[1].device edited to 5
//   DIR/bad_hash     good, with stage_1.onnx changed after the plan recorded its hash
#include <filesystem>
#include <iostream>

#include "runtime/format/error.h"
#include "tests/plan_format/sample_plan.h"

int main(int argc, char** argv) {
  using namespace stagecraft;
  if (argc != 2) {
    std::cerr << "usage: write_sample_plans DIR\n";
    return 2;
  }
  return run_main("write_sample_plans", [&] {
    std::filesystem::path dir = argv[1];
    std::filesystem::remove_all(dir);
    testing::write_plan_dir(testing::sample_plan("1f1b", 2, 1, 4), (dir / "good").string());
    testing::write_plan_dir(testing::sample_plan("zb-h1", 3, 1, 6), (dir / "zb").string());
    testing::write_plan_dir(testing::sample_plan("interleaved", 2, 2, 4),
                            (dir / "interleaved").string());
    std::string bad_device = (dir / "bad_device").string();
    testing::write_plan_dir(testing::sample_plan(), bad_device);
    testing::edit_file(bad_device + "/plan.json", "\"device\": 1", "\"device\": 5");
    std::string bad_hash = (dir / "bad_hash").string();
    testing::write_plan_dir(testing::sample_plan(), bad_hash);
    testing::edit_file(bad_hash + "/stage_1.onnx", "stage 1", "stage one");
    return 0;
  });
}
