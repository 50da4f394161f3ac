// Fuzz target: the tensor files stagerun reads (`--inputs`, `--data`, checkpoints). The first
// byte picks the reader (even: .npy, odd: ONNX TensorProto .pb); the rest is the file.
#include "runtime/core/tensor_io.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stagecraft;
  if (size == 0) return 0;
  const bool npy = data[0] % 2 == 0;
  const std::string path =
      fuzz::scratch_file(npy ? "tensor.npy" : "tensor.pb", data + 1, size - 1);
  fuzz::expect_clean([&] {
    if (npy)
      rt::read_npy(path);
    else
      rt::read_tensor_pb(path);
  });
  return 0;
}
