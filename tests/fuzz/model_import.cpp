// Fuzz target: model import with folding (what `stagec MODEL --info --batch 2` does) of one
// ONNX file. Seeds: the bundled samples, ONNX's conformance models, and the hostile models of
// issue 17 (tests/fuzz/make_seeds.cpp).
#include "compiler/import.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stagecraft;
  const std::string path = fuzz::scratch_file("model.onnx", data, size);
  fuzz::expect_clean([&] {
    ImportOptions options;
    options.batch = 2;
    import_model(path, options);
  });
  return 0;
}
