// Fuzz target: a schedule in torch.distributed.pipelining's CSV (stagec --schedule-csv), read
// and, when it reads, lowered and validated against the shape it implies (as the planner does).
#include "compiler/schedule/torch_csv.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stagecraft;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean([&] {
    const schedule::TorchCsvSchedule csv = schedule::read_torch_csv(text, "fuzz.csv");
    const schedule::PipelineShape shape{csv.devices, csv.chunks, csv.microbatches, csv.training};
    schedule::check_torch_csv(csv, shape, "fuzz.csv");
  });
  return 0;
}
