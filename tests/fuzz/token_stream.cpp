// Fuzz target: the token streams stagerun --tokens reads (tools/token_stream.h). The first byte
// picks what a raw file is said to hold (--token-dtype: none, uint16 or uint32) and the vocabulary
// the tokens are checked against; the rest is the file. An accepted file is read whole (at most
// 4096 tokens) and its windows' shuffled order drawn.
#include "tests/fuzz/fuzz_target.h"
#include "tools/token_stream.h"

#include <algorithm>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stagecraft;
  if (size == 0) return 0;
  const uint8_t pick = data[0];
  const std::string path = fuzz::scratch_file("tokens.bin", data + 1, size - 1);
  std::optional<tools::TokenDtype> raw;
  if (pick % 3 == 1) raw = tools::TokenDtype::kUint16;
  if (pick % 3 == 2) raw = tools::TokenDtype::kUint32;
  const int64_t vocab = pick / 3 % 2 == 0 ? 0 : 256;
  fuzz::expect_clean([&] {
    tools::TokenFile file = tools::open_token_file(path, raw);
    tools::TokenReader reader(file);
    std::vector<int64_t> tokens(static_cast<size_t>(std::min<int64_t>(file.count, 4096)));
    reader.read(0, tokens, vocab);
    if (file.count > 1) {
      tools::WindowOrder order(std::min<int64_t>(file.count - 1, 4096), true, pick);
      for (int64_t i = 0; i < order.windows(); ++i) order.window(1, i);
    }
  });
  return 0;
}
