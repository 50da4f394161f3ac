// The token stream reader of stagerun --tokens (tools/token_stream.h): the three formats, the
// windows' order (file order; seeded shuffles, every window once per epoch, the same per seed)
// and every refusal, each one line naming the file and the number.
#include "tools/token_stream.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/core/tensor_io.h"
#include "tests/error_of.h"
#include "tests/test_util.h"

namespace stagecraft::tools {
namespace {

using testing::error_of;

void write_bytes(const std::string& path, const void* data, size_t n) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

// llm.c's .bin of `tokens`: magic, version, count (as given), then the tokens.
void write_llmc(const std::string& path, const std::vector<uint16_t>& tokens, int32_t magic,
                int32_t version, int32_t count) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  write_bytes(path, bytes.data(), bytes.size());
}

std::vector<int64_t> read_all(const TokenFile& f, int64_t vocab = 0) {
  TokenReader reader(f);
  std::vector<int64_t> out(static_cast<size_t>(f.count));
  reader.read(0, out, vocab);
  return out;
}

TEST_CASE("token files: raw uint16 and uint32, llm.c and .npy of every dtype read alike") {
  testing::TempDir dir;
  const std::vector<uint16_t> tokens{5, 0, 65535, 7, 300, 1};
  const std::vector<int64_t> want(tokens.begin(), tokens.end());

  write_bytes(dir.file("train.bin"), tokens.data(), tokens.size() * 2);
  TokenFile raw = open_token_file(dir.file("train.bin"));
  CHECK(raw.format == "raw");
  CHECK(raw.dtype == TokenDtype::kUint16);
  CHECK(raw.count == 6);
  CHECK(read_all(raw) == want);

  const std::vector<uint32_t> wide{70000, 1, 2, 3};
  write_bytes(dir.file("wide.bin"), wide.data(), wide.size() * 4);
  TokenFile raw32 = open_token_file(dir.file("wide.bin"), TokenDtype::kUint32);
  CHECK(raw32.count == 4);
  CHECK(read_all(raw32) == std::vector<int64_t>{70000, 1, 2, 3});
  // The same bytes read as uint16: twice the tokens.
  CHECK(open_token_file(dir.file("wide.bin")).count == 8);

  write_llmc(dir.file("llmc.bin"), tokens, kLlmcMagic, 1, 6);
  TokenFile llmc = open_token_file(dir.file("llmc.bin"));
  CHECK(llmc.format == "llm.c");
  CHECK(llmc.data_offset == 1024);
  CHECK(read_all(llmc) == want);

  for (DType dtype : {DType::kUInt16, DType::kUInt32, DType::kInt32, DType::kInt64}) {
    CAPTURE(dtype_name(dtype));
    rt::Tensor t = rt::Tensor::owned(dtype, {6});
    for (int64_t i = 0; i < 6; ++i) {
      switch (dtype) {
        case DType::kUInt16: t.as<uint16_t>()[i] = tokens[i]; break;
        case DType::kUInt32: t.as<uint32_t>()[i] = tokens[i]; break;
        case DType::kInt32: t.as<int32_t>()[i] = tokens[i]; break;
        default: t.as<int64_t>()[i] = tokens[i]; break;
      }
    }
    rt::write_npy(dir.file("t.npy"), t);
    TokenFile npy = open_token_file(dir.file("t.npy"));
    CHECK(npy.format == "npy");
    CHECK(read_all(npy) == want);
    // A part alone: tokens [2, 5).
    std::vector<int64_t> part(3);
    TokenReader(npy).read(2, part);
    CHECK(part == std::vector<int64_t>{65535, 7, 300});
  }
}

TEST_CASE("token files: every refusal is one line naming the file and the number") {
  testing::TempDir dir;
  const std::vector<uint16_t> tokens{1, 2, 3, 4};

  write_bytes(dir.file("odd.bin"), "\x01\x00\x02", 3);
  CHECK(error_of(ErrorKind::kFormat, [&] { open_token_file(dir.file("odd.bin")); })
            .find("odd.bin: 3 bytes is not a whole number of uint16 tokens") != std::string::npos);

  write_llmc(dir.file("version.bin"), tokens, kLlmcMagic, 2, 4);
  CHECK(error_of(ErrorKind::kFormat, [&] { open_token_file(dir.file("version.bin")); })
            .find("version.bin: llm.c header version 2 at byte 4") != std::string::npos);
  write_llmc(dir.file("count.bin"), tokens, kLlmcMagic, 1, 5);
  CHECK(error_of(ErrorKind::kFormat, [&] { open_token_file(dir.file("count.bin")); })
            .find("count.bin: llm.c header says 5 tokens (at byte 8): 1034 bytes with the "
                  "header, but the file has 1032") != std::string::npos);
  write_llmc(dir.file("negative.bin"), tokens, kLlmcMagic, 1, -1);
  CHECK(error_of(ErrorKind::kFormat, [&] { open_token_file(dir.file("negative.bin")); })
            .find("says -1 tokens") != std::string::npos);
  const int32_t magic = kLlmcMagic;
  write_bytes(dir.file("short.bin"), &magic, 4);
  CHECK(error_of(ErrorKind::kFormat, [&] { open_token_file(dir.file("short.bin")); })
            .find("short.bin: llm.c header (magic 20240520) of 4 bytes; it needs 1024") !=
        std::string::npos);
  // A header that says uint16 against --token-dtype uint32.
  write_llmc(dir.file("llmc.bin"), tokens, kLlmcMagic, 1, 4);
  CHECK(error_of(ErrorKind::kUsage,
                 [&] { open_token_file(dir.file("llmc.bin"), TokenDtype::kUint32); })
            .find("--token-dtype uint32: ") != std::string::npos);

  rt::write_npy(dir.file("rank2.npy"), rt::Tensor::owned(DType::kInt64, {2, 3}));
  CHECK(error_of(ErrorKind::kFormat, [&] { open_token_file(dir.file("rank2.npy")); })
            .find("rank2.npy: a token stream .npy must be 1-D, not int64[2, 3] (rank 2)") !=
        std::string::npos);
  rt::write_npy(dir.file("float.npy"), rt::Tensor::owned(DType::kFloat32, {6}));
  CHECK(error_of(ErrorKind::kFormat, [&] { open_token_file(dir.file("float.npy")); })
            .find("float.npy: a token stream .npy must be uint16, uint32, int32 or int64, not "
                  "float32") != std::string::npos);
  CHECK(error_of(ErrorKind::kIo, [&] { open_token_file(dir.file("missing.bin")); })
            .find("missing.bin: no such file") != std::string::npos);

  // Token ids: past the vocabulary, negative (a signed .npy), past the end.
  write_bytes(dir.file("train.bin"), tokens.data(), tokens.size() * 2);
  TokenFile raw = open_token_file(dir.file("train.bin"));
  CHECK(error_of(ErrorKind::kFormat, [&] { read_all(raw, 4); })
            .find("train.bin: token 4 at token offset 3 (byte 6) is past the model's vocabulary "
                  "of 4") != std::string::npos);
  CHECK(read_all(raw, 5).size() == 4);
  rt::Tensor negative = rt::Tensor::owned(DType::kInt32, {3});
  negative.as<int32_t>()[1] = -7;
  rt::write_npy(dir.file("negative.npy"), negative);
  CHECK(error_of(ErrorKind::kFormat, [&] { read_all(open_token_file(dir.file("negative.npy"))); })
            .find("token -7 at token offset 1") != std::string::npos);
  std::vector<int64_t> past(2);
  CHECK(error_of(ErrorKind::kFormat, [&] { TokenReader(raw).read(3, past); })
            .find("train.bin: tokens [3, 5) are past its end (4 tokens)") != std::string::npos);
  for (const std::string& message :
       {error_of(ErrorKind::kFormat, [&] { open_token_file(dir.file("count.bin")); }),
        error_of(ErrorKind::kFormat, [&] { read_all(raw, 4); })})
    CHECK(message.find('\n') == std::string::npos);
}

TEST_CASE("windows: file order without --shuffle, a seeded permutation per epoch with it") {
  WindowOrder in_order(10, false, 0);
  for (int64_t i = 0; i < 10; ++i) CHECK(in_order.window(3, i) == i);

  for (int64_t windows : {1, 2, 3, 7, 64, 1000, 4097}) {
    CAPTURE(windows);
    WindowOrder a(windows, true, 42), again(windows, true, 42), other(windows, true, 43);
    std::vector<int64_t> epoch0, epoch1, seed43;
    for (int64_t i = 0; i < windows; ++i) {
      epoch0.push_back(a.window(0, i));
      epoch1.push_back(a.window(1, i));
      seed43.push_back(other.window(0, i));
      CHECK(again.window(0, i) == epoch0.back());  // the same seed: the same order
    }
    // Every window once per epoch.
    for (const std::vector<int64_t>& order : {epoch0, epoch1, seed43}) {
      std::set<int64_t> seen(order.begin(), order.end());
      CHECK(std::ssize(seen) == windows);
      CHECK(*seen.begin() == 0);
      CHECK(*seen.rbegin() == windows - 1);
    }
    if (windows >= 64) {
      // Epochs and seeds draw other orders, and none is the file's.
      CHECK(epoch0 != epoch1);
      CHECK(epoch0 != seed43);
      std::vector<int64_t> sorted = epoch0;
      std::sort(sorted.begin(), sorted.end());
      CHECK(sorted != epoch0);
    }
  }
  StreamPosition p;
  p.advance(7, 3);
  CHECK(p.epoch == 2);
  CHECK(p.index == 1);
}

}  // namespace
}  // namespace stagecraft::tools
