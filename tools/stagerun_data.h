#pragma once
/// \file
/// stagerun's training data read step by step: --data DIR (each step's batch read from the
/// .npy files with bounded reads) and --tokens FILE (windows of a token stream, token_stream.h),
/// read on a background thread a batch ahead of the step that runs (Prefetcher).
///
/// Each batch says where the data stands after it (`Batch::position`, a JSON object), which
/// stagerun keeps in its checkpoints ("data") so that --resume goes on with the next batch:
///   --data:   {kind: "data", batches: K, next: k}
///   --tokens: {kind: "tokens", windows: W, seq: T, shuffle, seed, epoch, index}

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "runtime/core/tensor.h"
#include "runtime/exec/pipeline.h"
#include "tools/stagerun_args.h"

namespace stagecraft::tools {

/// One step's batch: every graph input's tensor of the global batch.
struct Batch {
  std::map<std::string, rt::Tensor> inputs;
  /// --tokens: the passes over the stream done before this batch's first window.
  std::optional<int64_t> epoch;
  nlohmann::json position;  ///< Where the data stands after this batch (see above).
};

/// Batches one after another (each call the next).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next() = 0;
  /// Goes on after the batch whose `position` a checkpoint kept. A position of another kind of
  /// data (or none: null) starts at the beginning; one of the same kind that does not fit this
  /// data (another batch or window count, seed or order) is refused with one line
  /// (`Error(kUsage)`) naming the checkpoint `dir` and what differs.
  virtual void restore(const nlohmann::json& position, const std::string& dir) = 0;
  /// The whole batches the data holds (--data: K; --tokens: its windows over a batch's rows).
  virtual int64_t batches() const = 0;
  /// Back to the first batch, in file order (a held-out evaluation reads the same batches each
  /// time: tools/stagerun_eval.h).
  virtual void rewind() = 0;
};

/// --data DIR: NAME.npy per graph input holding K batches along the first axis (checked as
/// before: whole batches alike); step s reads batch s mod K, just its rows. A NAME.pb input is
/// read whole (a protobuf cannot be read in parts). Errors name `flag` (--data, --eval-data).
std::unique_ptr<BatchSource> data_batches(const std::string& dir, const rt::Pipeline& pipeline,
                                          std::string_view flag = "--data");

/// --tokens FILE (args.tokens_path, --seq, --token-dtype, --shuffle, --seed): windows of the
/// stream for a language-model training plan (see stagerun_tokens.cpp for how its inputs are
/// found). `note` gets one line when the token ids cannot be checked against the vocabulary.
std::unique_ptr<BatchSource> token_batches(const Args& args, const rt::Pipeline& pipeline,
                                           std::string& note);

/// Reads `total` batches of `source` on a thread of its own, at most `ahead` of the one taken
/// last: the next step's batch is read while the current step runs. An error reading a batch
/// is thrown by the `next` that would have returned it.
class Prefetcher {
 public:
  Prefetcher(BatchSource& source, int64_t total, size_t ahead = 1);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  Batch next();

 private:
  void read_all();
  BatchSource& source_;
  int64_t total_;
  size_t ahead_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace stagecraft::tools
