// Fuzz target: the small JSON files stagec reads. The first byte picks the reader (modulo 3:
// profile database, device spec, cluster spec); the rest is the file.
#include "cost_models/cluster.h"
#include "cost_models/device_spec.h"
#include "cost_models/profile_db.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stagecraft;
  if (size == 0) return 0;
  const int reader = data[0] % 3;
  const std::string path = fuzz::scratch_file("spec.json", data + 1, size - 1);
  fuzz::expect_clean([&] {
    if (reader == 0)
      cost::ProfileDb::load(path);
    else if (reader == 1)
      cost::device_spec_from_name_or_file(path);
    else
      cost::cluster_spec_from_name_or_file(path);
  });
  return 0;
}
