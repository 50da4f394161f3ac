// stagerun's held-out evaluation as a user meets it (tools/stagerun_eval.h): --eval-every 1
// leaves the training's losses and checkpoint bit for bit; an evaluation whose data is the
// next training batch gives that step's loss (its forward before the update); the text line and
// the JSON record; --save-every with --data/--tokens saves every K steps and after the last, not
// every step; the refusals that need a plan.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
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
using nlohmann::json;

Result run(const testing::TempDir& dir, const std::string& command_line) {
  return testing::run_captured(dir, command_line);
}

Result stagerun(const testing::TempDir& dir, const std::string& args) {
  return run(dir, fmt::format("{} {}", STAGECRAFT_STAGERUN, args));
}

// Every JSON Lines record of `type` in `out`.
std::vector<json> records(const std::string& out, const std::string& type) {
  std::vector<json> found;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("type", "") == type) found.push_back(j);
  }
  return found;
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> values;
  for (const json& j : records(out, "step")) values.push_back(j.at("loss").get<double>());
  return values;
}

constexpr int64_t kSeq = 8, kBatch = 4;

// gpt_tiny (vocabulary 256, no Dropout) on `devices` devices: batch 4 in 2 microbatches of 8
// tokens.
std::string gpt_plan(const testing::TempDir& dir, int devices, const std::string& name) {
  const std::string plan = dir.file(name);
  Result r = run(dir, fmt::format("{} {}/gpt_tiny.onnx -o {} --devices {} --train --loss "
                                  "cross-entropy --batch {} --microbatches 2 --dim seq={} "
                                  "--device-spec cpu",
                                  STAGECRAFT_STAGEC, STAGECRAFT_SAMPLES, plan, devices, kBatch,
                                  kSeq));
  REQUIRE(r.code == 0);
  return plan;
}

std::vector<uint16_t> some_tokens(int64_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng() % 256);
  return tokens;
}

void write_raw(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * 2));
}

// --data DIR of the batches `which` of `tokens` (each kBatch rows of kSeq + 1 tokens: the ids
// and, one on, the labels).
void write_batches(const std::string& dir, const std::vector<uint16_t>& tokens,
                   const std::vector<int64_t>& which) {
  const auto rows = static_cast<int64_t>(which.size()) * kBatch;
  Tensor ids = Tensor::owned(DType::kInt64, {rows, kSeq});
  Tensor labels = Tensor::owned(DType::kInt64, {rows, kSeq});
  for (size_t b = 0; b < which.size(); ++b)
    for (int64_t r = 0; r < kBatch; ++r)
      for (int64_t t = 0; t < kSeq; ++t) {
        const int64_t row = static_cast<int64_t>(b) * kBatch + r;
        const int64_t at = (which[b] * kBatch + r) * kSeq + t;
        ids.as<int64_t>()[row * kSeq + t] = tokens[static_cast<size_t>(at)];
        labels.as<int64_t>()[row * kSeq + t] = tokens[static_cast<size_t>(at + 1)];
      }
  fs::create_directories(dir);
  write_npy(dir + "/input_ids.npy", ids);
  write_npy(dir + "/labels.npy", labels);
}

// Every file under `dir`, by relative path, with its bytes.
std::map<std::string, std::string> tree(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file())
      files[fs::relative(entry.path(), dir).string()] = testing::read_bytes(entry.path().string());
  return files;
}

TEST_CASE("stagerun --eval-every 1 leaves the training's losses and checkpoint bit for bit") {
  testing::TempDir dir;
  const std::string plan = gpt_plan(dir, 2, "plan");
  write_raw(dir.file("train.bin"), some_tokens(200, 7));
  write_raw(dir.file("eval.bin"), some_tokens(3 * kBatch * kSeq + 1, 8));  // 3 batches
  const std::string train = fmt::format("{} --steps 4 --json -q --tokens {}", plan,
                                        dir.file("train.bin"));
  Result plain = stagerun(dir, fmt::format("{} --checkpoint {}", train, dir.file("ck_plain")));
  Result evaluated = stagerun(dir, fmt::format("{} --checkpoint {} --eval-tokens {} --eval-every 1",
                                               train, dir.file("ck_eval"), dir.file("eval.bin")));
  REQUIRE(plain.code == 0);
  REQUIRE(evaluated.code == 0);
  CAPTURE(evaluated.out);
  const std::vector<double> trained = losses(plain.out);
  REQUIRE(trained.size() == 4);
  CHECK(losses(evaluated.out) == trained);
  // The weights, optimizer state, step count and data position saved are the same bytes.
  CHECK(tree(dir.file("ck_eval")) == tree(dir.file("ck_plain")));
  const std::vector<json> evals = records(evaluated.out, "eval");
  REQUIRE(evals.size() == 4);
  for (int k = 0; k < 4; ++k) {
    CHECK(evals[k]["step"] == k + 1);
    CHECK(evals[k]["batches"] == 3);  // all the file's batches (fewer than the default cap)
    CHECK(std::isfinite(evals[k]["loss"].get<double>()));
  }
  // The same weights evaluated twice give the same loss; the training moves it.
  CHECK(evals[0]["loss"] != evals[3]["loss"]);
  CHECK(records(plain.out, "eval").empty());

  // --eval-every 3 of 4 steps: after step 3 and after the last; --eval-batches 2 of the 3.
  Result some = stagerun(dir, fmt::format("{} --eval-tokens {} --eval-every 3 --eval-batches 2",
                                          train, dir.file("eval.bin")));
  REQUIRE(some.code == 0);
  const std::vector<json> two = records(some.out, "eval");
  REQUIRE(two.size() == 2);
  CHECK(two[0]["step"] == 3);
  CHECK(two[1]["step"] == 4);
  CHECK(two[1]["batches"] == 2);
  CHECK(losses(some.out) == trained);

  // The text line, one per evaluation (only after the last step without --eval-every).
  Result text = stagerun(dir, fmt::format("{} --steps 2 -q --tokens {} --eval-tokens {}", plan,
                                          dir.file("train.bin"), dir.file("eval.bin")));
  REQUIRE(text.code == 0);
  CAPTURE(text.out);
  CHECK(std::regex_search(
      text.out, std::regex("(^|\n)eval after step 2: loss [0-9]+\\.[0-9]{6} over 3 batches "
                           "\\([0-9.]+ s\\)\n")));
  CHECK(text.out.find("eval after step 1") == std::string::npos);
}

TEST_CASE("stagerun's evaluation of the next training batch is that step's loss") {
  testing::TempDir dir;
  const std::vector<uint16_t> tokens = some_tokens(3 * kBatch * kSeq + 1, 11);
  write_batches(dir.file("train"), tokens, {0, 1, 2});
  write_batches(dir.file("held"), tokens, {1});  // the second training batch
  for (int devices : {1, 2}) {
    CAPTURE(devices);
    const std::string plan = gpt_plan(dir, devices, fmt::format("plan{}", devices));
    Result r = stagerun(dir, fmt::format("{} --steps 3 --json -q --data {} --eval-data {} "
                                         "--eval-every 1",
                                         plan, dir.file("train"), dir.file("held")));
    REQUIRE(r.code == 0);
    const std::vector<double> trained = losses(r.out);
    const std::vector<json> evals = records(r.out, "eval");
    REQUIRE(trained.size() == 3);
    REQUIRE(evals.size() == 3);
    // Step 2 trains on batch 1 with the weights after step 1: its forward is the evaluation's.
    CHECK(std::fabs(evals[0]["loss"].get<double>() - trained[1]) <= 1e-6);
    CHECK(evals[0]["batches"] == 1);
    // After step 2 the weights have moved on: another loss.
    CHECK(std::fabs(evals[1]["loss"].get<double>() - trained[1]) > 1e-6);
  }
}

TEST_CASE("stagerun --data and --tokens save a checkpoint every --save-every steps, not every step") {
  testing::TempDir dir;
  const std::string plan = gpt_plan(dir, 2, "plan");
  write_raw(dir.file("train.bin"), some_tokens(200, 7));
  Result r = stagerun(dir, fmt::format("{} --steps 5 --json --tokens {} --checkpoint {} "
                                       "--save-every 2",
                                       plan, dir.file("train.bin"), dir.file("ck")));
  REQUIRE(r.code == 0);
  CAPTURE(r.err);
  std::vector<int> saved;
  const std::regex line("stagerun: saved [^\n]* at step ([0-9]+):");
  for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), line);
       it != std::sregex_iterator(); ++it)
    saved.push_back(std::stoi((*it)[1]));
  CHECK(saved == std::vector<int>{2, 4, 5});
  const json manifest = json::parse(testing::read_bytes(dir.file("ck/manifest.json")));
  CHECK(manifest["step"] == 5);
  // Without --save-every: only after the last step.
  Result last = stagerun(dir, fmt::format("{} --steps 3 --json --tokens {} --checkpoint {}", plan,
                                          dir.file("train.bin"), dir.file("ck2")));
  REQUIRE(last.code == 0);
  CHECK(std::regex_search(last.err, std::regex("saved [^\n]* at step 3:")));
  CHECK(!std::regex_search(last.err, std::regex("saved [^\n]* at step [12]:")));
}

void check_one_line_error(const Result& r, const std::string& regex) {
  CAPTURE(r.err);
  CHECK(r.code == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(std::regex_search(r.err, std::regex(regex)));
}

TEST_CASE("stagerun refuses evaluations that cannot run with one line") {
  testing::TempDir dir;
  const std::string plan = gpt_plan(dir, 2, "plan");
  write_raw(dir.file("train.bin"), some_tokens(200, 7));
  write_raw(dir.file("eval.bin"), some_tokens(3 * kBatch * kSeq + 1, 8));
  check_one_line_error(
      stagerun(dir, fmt::format("{} --tokens {} --eval-tokens {} --eval-batches 4", plan,
                                dir.file("train.bin"), dir.file("eval.bin"))),
      "^stagerun: usage error: --eval-batches 4: --eval-tokens .*eval.bin holds 3 batches of "
      "the plan's batch\n$");
  const std::vector<uint16_t> tokens = some_tokens(3 * kBatch * kSeq + 1, 11);
  write_batches(dir.file("held"), tokens, {0, 1});
  check_one_line_error(
      stagerun(dir, fmt::format("{} --tokens {} --eval-data {} --eval-batches 3", plan,
                                dir.file("train.bin"), dir.file("held"))),
      "--eval-batches 3: --eval-data .*held holds 2 batches");
  // An inference plan has no loss to evaluate.
  const std::string inference = dir.file("inference");
  REQUIRE(run(dir, fmt::format("{} {}/gpt_tiny.onnx -o {} --devices 2 --batch 4 --dim seq=8 "
                               "--device-spec cpu",
                               STAGECRAFT_STAGEC, STAGECRAFT_SAMPLES, inference))
              .code == 0);
  write_batches(dir.file("ids_only"), tokens, {0});
  fs::remove(dir.file("ids_only/labels.npy"));
  check_one_line_error(stagerun(dir, fmt::format("{} --data {} --eval-data {}", inference,
                                                 dir.file("ids_only"), dir.file("ids_only"))),
                       "^stagerun: usage error: --eval-data evaluates a training plan's loss; .*"
                       "inference is an inference plan\n$");
}

}  // namespace
}  // namespace stagecraft::rt
