// Loads a plan with stagecraft's embeddable runtime, runs one step on the CPU backend over the
// deterministic synthetic inputs, and writes every graph output as OUT_DIR/NAME.npy.
#include <cstdio>
#include <filesystem>
#include <string>

#include "runtime/core/backend.h"
#include "runtime/core/tensor_io.h"
#include "runtime/exec/pipeline.h"
#include "runtime/format/error.h"

int main(int argc, char** argv) {
  return stagecraft::run_main("run_plan", [&] {
    if (argc != 3) {
      std::fprintf(stderr, "usage: run_plan PLAN_DIR OUT_DIR\n");
      return 2;
    }
    using namespace stagecraft::rt;
    auto pipeline = Pipeline::load(argv[1], cpu_backend(), 1);
    RunOptions options;
    options.steps = 1;
    RunReport report = pipeline->run(pipeline->synthetic_inputs(), options);
    std::filesystem::create_directories(argv[2]);
    for (const auto& [name, tensor] : report.outputs)
      write_npy((std::filesystem::path(argv[2]) / (name + ".npy")).string(), tensor);
    std::printf("run_plan: %zu outputs of a %d-device plan in %.3f ms\n", report.outputs.size(),
                pipeline->plan().devices, report.step_s.front() * 1e3);
    return 0;
  });
}
