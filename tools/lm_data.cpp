// stagecraft-lm-data: next-token training data for a language model, as `stagerun --data DIR`
// reads it.
//
//   stagecraft-lm-data --out DIR [--text FILE] [--batches K] [--batch B] [--seq T] [--vocab V]
//                      [--ignore-index N] [--seed S]
//   stagecraft-lm-data --tokens-out FILE.bin|FILE.npy --text FILE
//
// Writes DIR/input_ids.npy and DIR/labels.npy, int64 [K x B, T] each: K whole batches of B rows
// of T tokens. labels[r, t] = input_ids[r, t + 1] (the next token) and the last position of each
// row, whose next token the row does not hold, is N (default -100: `stagec --loss
// cross-entropy` leaves it out). Rows are windows of FILE's bytes at seeded offsets (byte-level
// tokens, V >= 256), or without --text arithmetic sequences (x[t] = (start + step * t) mod V,
// start in [0, V) and step in [1, 3] drawn per row: the next token follows from the two before it).
//
// --tokens-out writes FILE's bytes instead as a token stream for `stagerun --tokens` (one uint16
// token per byte): llm.c's .bin (a header of 256 int32: magic 20240520, version 1, the token
// count; then the tokens), or a 1-D uint16 .npy when the name ends in .npy.
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/core/tensor_io.h"
#include "runtime/format/error.h"
#include "tools/cli_common.h"

namespace {

using namespace stagecraft;

// --tokens-out: `text`'s bytes as uint16 tokens, llm.c's .bin or (by the name) a 1-D .npy.
void write_tokens(const std::string& path, const std::string& text) {
  const auto count = static_cast<int64_t>(text.size());
  if (path.ends_with(".npy")) {
    rt::Tensor t = rt::Tensor::owned(DType::kUInt16, {count});
    for (int64_t i = 0; i < count; ++i) t.as<uint16_t>()[i] = static_cast<unsigned char>(text[i]);
    rt::write_npy(path, t);
    return;
  }
  if (count > INT32_MAX)
    fail(ErrorKind::kUsage, "--tokens-out {}: {} tokens do not fit llm.c's int32 count; write a "
         ".npy", path, count);
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;  // llm.c's magic
  header[1] = 1;         // version 1: uint16 tokens
  header[2] = static_cast<int32_t>(count);
  std::vector<uint16_t> tokens(text.begin(), text.end());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(header.data()), 256 * 4);
  out.write(reinterpret_cast<const char*>(tokens.data()), count * 2);
  if (!out.flush()) fail(ErrorKind::kIo, "--tokens-out {}: cannot write", path);
}

int run(int argc, char** argv) {
  CLI::App app{
      "stagecraft-lm-data - next-token data for language-model training: DIR/input_ids.npy and\n"
      "DIR/labels.npy (the input shifted by one; the last position of each row is the ignore\n"
      "index), int64 [batches x batch, seq], for stagerun PLAN --data DIR.",
      "stagecraft-lm-data"};
  std::string out_dir, text_path, tokens_out;
  int64_t batches = 4, batch = 8, seq = 32, vocab = 256, ignore_index = -100;
  uint64_t seed = 1;
  app.add_option("--out", out_dir, "directory to write (created if missing)");
  app.add_option("--tokens-out", tokens_out,
                 "write --text FILE's bytes as a uint16 token stream for stagerun --tokens "
                 "instead: llm.c's .bin with its header, or a 1-D .npy by the name's extension");
  app.add_option("--text", text_path,
                 "rows are windows of this file's bytes (byte tokens: --vocab >= 256)");
  app.add_option("--batches", batches, "K whole batches; stagerun step s trains on batch s mod K")
      ->capture_default_str()
      ->check(cli::at_least<int64_t>(1));
  app.add_option("--batch", batch, "rows per batch (stagec --batch)")
      ->capture_default_str()
      ->check(cli::at_least<int64_t>(1));
  app.add_option("--seq", seq, "tokens per row (stagec --dim seq=T)")
      ->capture_default_str()
      ->check(cli::at_least<int64_t>(1));
  app.add_option("--vocab", vocab, "vocabulary size: tokens are in [0, V)")
      ->capture_default_str()
      ->check(cli::at_least<int64_t>(1));
  app.add_option("--ignore-index", ignore_index,
                 "label of the last position of each row (stagec --ignore-index)")
      ->capture_default_str();
  app.add_option("--seed", seed, "seed of the row offsets or sequences")->capture_default_str();
  cli::add_version_flag(app, "stagecraft-lm-data");
  if (std::optional<int> done = cli::parse(app, argc, argv)) return *done;
  if (out_dir.empty() == tokens_out.empty())
    fail(ErrorKind::kUsage, "give one of --out DIR and --tokens-out FILE");
  if (!tokens_out.empty() && text_path.empty())
    fail(ErrorKind::kUsage, "--tokens-out {} needs --text FILE (its bytes are the tokens)",
         tokens_out);
  if (ignore_index >= 0 && ignore_index < vocab)
    fail(ErrorKind::kUsage, "--ignore-index {} is a token of the vocabulary [0, {})", ignore_index,
         vocab);
  std::string text;
  if (!text_path.empty()) {
    std::ifstream in(text_path, std::ios::binary);
    if (!in) fail(ErrorKind::kIo, "--text {}: cannot open", text_path);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (vocab < 256)
      fail(ErrorKind::kUsage, "--text {}: byte tokens need --vocab 256 or more (got {})", text_path,
           vocab);
    if (static_cast<int64_t>(text.size()) < seq)
      fail(ErrorKind::kUsage, "--text {}: {} bytes, fewer than --seq {}", text_path, text.size(),
           seq);
  }
  if (!tokens_out.empty()) {
    write_tokens(tokens_out, text);
    fmt::print("wrote {}: {} uint16 tokens (the bytes of {})\n", tokens_out, text.size(),
               text_path);
    return 0;
  }
  const int64_t rows = batches * batch;
  rt::Tensor ids = rt::Tensor::owned(DType::kInt64, {rows, seq});
  rt::Tensor labels = rt::Tensor::owned(DType::kInt64, {rows, seq});
  std::mt19937_64 rng(seed);
  std::vector<int64_t> row(static_cast<size_t>(seq));
  for (int64_t r = 0; r < rows; ++r) {
    if (!text.empty()) {
      std::uniform_int_distribution<size_t> offset(0, text.size() - static_cast<size_t>(seq));
      const size_t at = offset(rng);
      for (int64_t t = 0; t < seq; ++t) row[t] = static_cast<unsigned char>(text[at + t]);
    } else {
      std::uniform_int_distribution<int64_t> start(0, vocab - 1), step(1, 3);
      const int64_t s = start(rng), d = step(rng);
      for (int64_t t = 0; t < seq; ++t) row[t] = (s + d * t) % vocab;
    }
    for (int64_t t = 0; t < seq; ++t) {
      ids.as<int64_t>()[r * seq + t] = row[t];
      labels.as<int64_t>()[r * seq + t] = t + 1 < seq ? row[t + 1] : ignore_index;
    }
  }
  std::filesystem::create_directories(out_dir);
  rt::write_npy((std::filesystem::path(out_dir) / "input_ids.npy").string(), ids);
  rt::write_npy((std::filesystem::path(out_dir) / "labels.npy").string(), labels);
  fmt::print(
      "wrote {}/input_ids.npy and labels.npy: int64 [{},{}] ({} batches of {}; {}), last position "
      "of each row "
      "labelled {}\n",
      out_dir, rows, seq, batches, batch,
      text.empty() ? "arithmetic sequences" : "bytes of " + text_path, ignore_index);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return stagecraft::run_main("stagecraft-lm-data", [&] { return run(argc, argv); });
}
