// stagerun --tokens as a user meets it (tools/stagerun_tokens.cpp): gpt_tiny trains on windows
// of a token stream to the losses of the same batches given through --data DIR; --shuffle draws
// its windows per seed; a run stopped at a checkpoint goes on with the data where it stopped, bit
// for bit; bad streams and plans are refused with one line; stagecraft-lm-data --tokens-out
// writes a stream it trains on.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>

#include "runtime/core/tensor.h"
#include "runtime/core/tensor_io.h"
#include "tests/test_util.h"

namespace stagecraft::rt {
namespace {

namespace fs = std::filesystem;

using Result = testing::CommandResult;

Result run(const testing::TempDir& dir, const std::string& command_line) {
  return testing::run_captured(dir, command_line);
}

Result stagerun(const testing::TempDir& dir, const std::string& args) {
  return run(dir, fmt::format("{} {}", STAGECRAFT_STAGERUN, args));
}

void check_one_line_error(const Result& r, const std::string& regex) {
  CAPTURE(r.err);
  CHECK(r.code != 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(std::regex_search(r.err, std::regex(regex)));
}

// Each step record's `key` (loss, epoch) in a --json run's output.
std::vector<double> json_field(const std::string& out, const char* key) {
  std::vector<double> values;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == "step" && j.contains(key))
      values.push_back(j[key].get<double>());
  }
  return values;
}

// gpt_tiny (vocabulary 256) on 2 devices: batch 4 in 2 microbatches of 8 tokens.
std::string gpt_plan(const testing::TempDir& dir) {
  const std::string plan = dir.file("plan");
  Result r = run(dir, fmt::format("{} {}/gpt_tiny.onnx -o {} --devices 2 --train --loss "
                                  "cross-entropy --batch 4 --microbatches 2 --dim seq=8 "
                                  "--device-spec cpu",
                                  STAGECRAFT_STAGEC, STAGECRAFT_SAMPLES, plan));
  REQUIRE(r.code == 0);
  return plan;
}

// `count` seeded tokens in [0, 256).
std::vector<uint16_t> some_tokens(int64_t count) {
  std::mt19937 rng(7);
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng() % 256);
  return tokens;
}

void write_raw(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * 2));
}

constexpr int64_t kSeq = 8, kBatch = 4;

TEST_CASE("stagerun --tokens trains gpt_tiny to the losses of the same windows through --data") {
  testing::TempDir dir;
  const std::string plan = gpt_plan(dir);
  // 10 windows of 8 + 1 tokens: 81 tokens (one more left over). Four steps of 4 windows take
  // windows 0-3, 4-7, 8 9 0 1 (epoch 0 ends within step 3), 2-5 (epoch 1).
  const std::vector<uint16_t> tokens = some_tokens(82);
  write_raw(dir.file("train.bin"), tokens);
  const std::vector<int64_t> windows{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5};
  Tensor ids = Tensor::owned(DType::kInt64, {16, kSeq});
  Tensor labels = Tensor::owned(DType::kInt64, {16, kSeq});
  for (size_t r = 0; r < windows.size(); ++r)
    for (int64_t t = 0; t < kSeq; ++t) {
      ids.as<int64_t>()[r * kSeq + t] = tokens[windows[r] * kSeq + t];
      labels.as<int64_t>()[r * kSeq + t] = tokens[windows[r] * kSeq + t + 1];
    }
  fs::create_directories(dir.file("data"));
  write_npy(dir.file("data/input_ids.npy"), ids);
  write_npy(dir.file("data/labels.npy"), labels);

  Result with_tokens = stagerun(
      dir, fmt::format("{} --steps 4 --json -q --tokens {} --seq 8", plan, dir.file("train.bin")));
  REQUIRE(with_tokens.code == 0);
  Result with_data =
      stagerun(dir, fmt::format("{} --steps 4 --json -q --data {}", plan, dir.file("data")));
  REQUIRE(with_data.code == 0);
  const std::vector<double> losses = json_field(with_tokens.out, "loss");
  REQUIRE(losses.size() == 4);
  CHECK(losses == json_field(with_data.out, "loss"));
  CHECK(json_field(with_tokens.out, "epoch") == std::vector<double>{0, 0, 0, 1});
  CHECK(json_field(with_data.out, "epoch").empty());

  // The same stream as llm.c's .bin and as a .npy of int32: the same losses.
  {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = static_cast<int32_t>(tokens.size());
    std::ofstream out(dir.file("train_llmc.bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * 2));
  }
  Tensor npy = Tensor::owned(DType::kInt32, {static_cast<int64_t>(tokens.size())});
  for (size_t i = 0; i < tokens.size(); ++i) npy.as<int32_t>()[i] = tokens[i];
  write_npy(dir.file("train.npy"), npy);
  for (const char* file : {"train_llmc.bin", "train.npy"}) {
    CAPTURE(file);
    Result r = stagerun(dir, fmt::format("{} --steps 4 --json -q --tokens {}", plan, dir.file(file)));
    REQUIRE(r.code == 0);
    CHECK(json_field(r.out, "loss") == losses);
  }

  // --shuffle: another order of the windows (other losses), the same for the same seed.
  const std::string shuffled =
      fmt::format("{} --steps 4 --json -q --tokens {} --shuffle --seed 5", plan,
                  dir.file("train.bin"));
  Result s1 = stagerun(dir, shuffled), s2 = stagerun(dir, shuffled);
  REQUIRE(s1.code == 0);
  REQUIRE(s2.code == 0);
  CHECK(json_field(s1.out, "loss") == json_field(s2.out, "loss"));
  CHECK(json_field(s1.out, "loss") != losses);
  CHECK(json_field(s1.out, "epoch") == std::vector<double>{0, 0, 0, 1});

  // The text report names the epoch on each step's line.
  Result text = stagerun(dir, fmt::format("{} --steps 4 -q --tokens {}", plan, dir.file("train.bin")));
  REQUIRE(text.code == 0);
  CHECK(std::regex_search(text.out, std::regex("step +4  loss [0-9.]+  [0-9.]+ ms  epoch 1\n")));
}

TEST_CASE("stagerun --tokens --resume goes on with the data where it stopped, bit for bit") {
  testing::TempDir dir;
  const std::string plan = gpt_plan(dir);
  write_raw(dir.file("train.bin"), some_tokens(82));
  for (const char* order : {"", " --shuffle --seed 9"}) {
    CAPTURE(order);
    const std::string tokens = fmt::format("--tokens {}{}", dir.file("train.bin"), order);
    Result straight = stagerun(dir, fmt::format("{} --steps 6 --json -q {}", plan, tokens));
    REQUIRE(straight.code == 0);
    fs::remove_all(dir.file("ck"));
    Result first = stagerun(dir, fmt::format("{} --steps 3 --json -q {} --checkpoint {}", plan,
                                             tokens, dir.file("ck")));
    REQUIRE(first.code == 0);
    Result rest = stagerun(dir, fmt::format("{} --steps 3 --json -q {} --resume {}", plan, tokens,
                                            dir.file("ck")));
    REQUIRE(rest.code == 0);
    std::vector<double> both = json_field(first.out, "loss"), tail = json_field(rest.out, "loss");
    both.insert(both.end(), tail.begin(), tail.end());
    REQUIRE(both.size() == 6);
    CHECK(both == json_field(straight.out, "loss"));
    std::vector<double> epochs = json_field(first.out, "epoch"), more = json_field(rest.out, "epoch");
    epochs.insert(epochs.end(), more.begin(), more.end());
    CHECK(epochs == json_field(straight.out, "epoch"));
    // Resuming with another draw of the windows is refused, naming both.
    if (*order != '\0')
      check_one_line_error(
          stagerun(dir, fmt::format("{} --steps 1 --tokens {} --shuffle --seed 10 --resume {}",
                                    plan, dir.file("train.bin"), dir.file("ck"))),
          "--resume .*ck: its data was drawn --shuffle --seed 9; this run asks for --shuffle "
          "--seed 10");
  }
}

TEST_CASE("stagerun --data --resume goes on with the batch after the checkpoint's") {
  testing::TempDir dir;
  const std::string plan = gpt_plan(dir);
  const std::vector<uint16_t> tokens = some_tokens(3 * kBatch * kSeq);
  Tensor ids = Tensor::owned(DType::kInt64, {3 * kBatch, kSeq});
  for (size_t i = 0; i < tokens.size(); ++i) ids.as<int64_t>()[i] = tokens[i];
  fs::create_directories(dir.file("data"));
  write_npy(dir.file("data/input_ids.npy"), ids);
  write_npy(dir.file("data/labels.npy"), ids);
  const std::string data = "--data " + dir.file("data");
  Result straight = stagerun(dir, fmt::format("{} --steps 5 --json -q {}", plan, data));
  Result first = stagerun(
      dir, fmt::format("{} --steps 2 --json -q {} --checkpoint {}", plan, data, dir.file("ck")));
  Result rest = stagerun(
      dir, fmt::format("{} --steps 3 --json -q {} --resume {}", plan, data, dir.file("ck")));
  REQUIRE(straight.code == 0);
  REQUIRE(first.code == 0);
  REQUIRE(rest.code == 0);
  std::vector<double> both = json_field(first.out, "loss"), tail = json_field(rest.out, "loss");
  both.insert(both.end(), tail.begin(), tail.end());
  CHECK(both == json_field(straight.out, "loss"));
}

TEST_CASE("stagerun --tokens refuses bad streams and plans with one line naming the numbers") {
  testing::TempDir dir;
  const std::string plan = gpt_plan(dir);
  std::vector<uint16_t> tokens = some_tokens(82);
  write_raw(dir.file("train.bin"), tokens);
  check_one_line_error(
      stagerun(dir, fmt::format("{} --tokens {} --seq 16", plan, dir.file("train.bin"))),
      "^stagerun: usage error: --seq 16: the plan's sequence length is 8 \\(input 'input_ids' "
      "is int64\\[2, 8\\] per microbatch\\); give --seq 8, or re-plan for rows of 16 tokens");
  // Token 300 (window 3, step 1) is past gpt_tiny's 256 rows of embedding.
  tokens[3 * kSeq + 2] = 300;
  write_raw(dir.file("big_id.bin"), tokens);
  check_one_line_error(
      stagerun(dir, fmt::format("{} --steps 2 --tokens {}", plan, dir.file("big_id.bin"))),
      "big_id.bin: token 300 at token offset 26 \\(byte 52\\) is past the model's vocabulary of "
      "256");
  write_raw(dir.file("short.bin"), some_tokens(8));
  check_one_line_error(
      stagerun(dir, fmt::format("{} --tokens {}", plan, dir.file("short.bin"))),
      "short.bin: 8 tokens, fewer than one window of --seq 8 \\+ 1 = 9");
  {
    std::ofstream odd(dir.file("odd.bin"), std::ios::binary);
    odd << "abc";
  }
  check_one_line_error(stagerun(dir, fmt::format("{} --tokens {}", plan, dir.file("odd.bin"))),
                       "odd.bin: 3 bytes is not a whole number of uint16 tokens");
  check_one_line_error(
      stagerun(dir, fmt::format("{} --tokens {} --data {}", plan, dir.file("train.bin"),
                                dir.path().string())),
      "--tokens excludes --data, --inputs and --synthetic");
  check_one_line_error(stagerun(dir, fmt::format("{} --shuffle", plan)),
                       "--seq, --token-dtype and --shuffle need --tokens FILE");

  // toy.onnx's plan has a float input: no token input to feed.
  const std::string toy = dir.file("toy");
  REQUIRE(run(dir, fmt::format("{} {}/toy.onnx -o {} --devices 2 --train --loss mse --batch 8 "
                               "--device-spec cpu",
                               STAGECRAFT_STAGEC, STAGECRAFT_SAMPLES, toy))
              .code == 0);
  check_one_line_error(
      stagerun(dir, fmt::format("{} --tokens {}", toy, dir.file("train.bin"))),
      "^stagerun: usage error: --tokens: cannot tell the tokens from the labels: the plan's "
      "inputs are 'labels' float32\\[4, 5\\], 'x' float32\\[4, 10\\] and its loss's labels input is "
      "'labels'");
}

TEST_CASE("stagecraft-lm-data --tokens-out writes a stream stagerun --tokens trains on") {
  testing::TempDir dir;
  const std::string plan = gpt_plan(dir);
  std::string text;
  for (int i = 0; text.size() < 400; ++i) text += fmt::format("line {} of the text. ", i);
  {
    std::ofstream out(dir.file("text.txt"), std::ios::binary);
    out << text;
  }
  for (const char* name : {"text.bin", "text.npy"}) {
    CAPTURE(name);
    Result w = run(dir, fmt::format("{} --tokens-out {} --text {}", STAGECRAFT_LM_DATA,
                                    dir.file(name), dir.file("text.txt")));
    REQUIRE(w.code == 0);
    CHECK(w.out.find(fmt::format("{} uint16 tokens", text.size())) != std::string::npos);
    Result r = stagerun(dir, fmt::format("{} --steps 2 --json -q --tokens {}", plan, dir.file(name)));
    REQUIRE(r.code == 0);
    CHECK(json_field(r.out, "loss").size() == 2);
  }
  CHECK(fs::file_size(dir.file("text.bin")) == 1024 + 2 * text.size());
  Tensor npy = read_npy(dir.file("text.npy"));
  CHECK(npy.dtype == DType::kUInt16);
  CHECK(npy.as<uint16_t>()[5] == static_cast<unsigned char>(text[5]));
}

}  // namespace
}  // namespace stagecraft::rt
