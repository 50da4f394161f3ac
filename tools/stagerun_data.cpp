// stagerun's data read step by step (stagerun_data.h): --data DIR's batches read a batch at a
// time, and the thread that reads the next step's batch while a step runs.
#include "tools/stagerun_data.h"

#include <fmt/format.h>

#include <fstream>

#include "runtime/core/npy_header.h"
#include "runtime/core/tensor_io.h"
#include "runtime/format/error.h"
#include "tools/stagerun_inputs.h"

namespace stagecraft::tools {

namespace {

// --data DIR: each step reads its batch's rows of each .npy (seek and read: never the whole file,
// never mmap, so a data set larger than the address space the process may have trains).
class NpyBatches final : public BatchSource {
 public:
  NpyBatches(const std::string& dir, const rt::Pipeline& pipeline, std::string_view flag)
      : dir_(dir), flag_(flag) {
    std::map<std::string, ArrayInfo> arrays;
    for (const rt::ModelTensor& in : pipeline.inputs()) {
      Input input;
      input.file = input_file(dir, in, pipeline, flag);
      if (input.file.ends_with(".npy")) {
        const rt::NpyArray array = rt::read_npy_header(input.file);
        input.array = {array.dtype, array.shape};
        input.offset = array.data_offset;
      } else {
        input.whole = rt::read_tensor_pb(input.file);
        input.array = {input.whole.dtype, input.whole.shape};
      }
      arrays[in.name] = input.array;
      inputs_[in.name] = std::move(input);
    }
    batches_ = count_batches(arrays, pipeline, dir, flag);
    for (auto& [name, input] : inputs_) input.rows = input.array.shape[0] / batches_;
  }

  Batch next() override {
    Batch batch;
    for (auto& [name, input] : inputs_) {
      const int64_t first = next_ * input.rows;
      if (input.whole.data != nullptr) {
        batch.inputs[name] = rt::slice_rows(input.whole, first, first + input.rows);
        continue;
      }
      rt::Shape shape = input.array.shape;
      shape[0] = input.rows;
      rt::Tensor t = rt::Tensor::uninitialized(input.array.dtype, shape);
      const int64_t at = input.offset + first * (t.bytes() / input.rows);
      std::ifstream in(input.file, std::ios::binary);
      if (!in || !in.seekg(at) || !in.read(reinterpret_cast<char*>(t.data), t.bytes()))
        fail(ErrorKind::kIo, "{} {}: cannot read batch {} of {} ({} bytes at byte {})", flag_,
             dir_, next_, input.file, t.bytes(), at);
      batch.inputs[name] = std::move(t);
    }
    next_ = (next_ + 1) % batches_;
    batch.position = {{"kind", "data"}, {"batches", batches_}, {"next", next_}};
    return batch;
  }

  void restore(const nlohmann::json& position, const std::string& dir) override {
    if (!position.is_object() || position.value("kind", "") != "data") return;
    const int64_t batches = position.value("batches", int64_t{-1});
    const int64_t next = position.value("next", int64_t{-1});
    if (batches != batches_)
      fail(ErrorKind::kUsage,
           "--resume {}: its data position is batch {} of {} batches; --data {} holds {}", dir,
           next, batches, dir_, batches_);
    if (next < 0 || next >= batches_)
      fail(ErrorKind::kFormat, "--resume {}: data position batch {} is not one of 0..{}", dir,
           next, batches_ - 1);
    next_ = next;
  }

  int64_t batches() const override { return batches_; }
  void rewind() override { next_ = 0; }

 private:
  struct Input {
    std::string file;
    ArrayInfo array;
    int64_t offset = 0;  ///< .npy: where the data starts.
    rt::Tensor whole;    ///< .pb: read whole.
    int64_t rows = 0;    ///< Per batch.
  };
  std::string dir_, flag_;
  std::map<std::string, Input> inputs_;
  int64_t batches_ = 0;
  int64_t next_ = 0;
};

}  // namespace

std::unique_ptr<BatchSource> data_batches(const std::string& dir, const rt::Pipeline& pipeline,
                                          std::string_view flag) {
  return std::make_unique<NpyBatches>(dir, pipeline, flag);
}

Prefetcher::Prefetcher(BatchSource& source, int64_t total, size_t ahead)
    : source_(source), total_(total), ahead_(ahead) {
  thread_ = std::thread([this] { read_all(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Prefetcher::read_all() {
  for (int64_t k = 0; k < total_; ++k) {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || ready_.size() < ahead_; });
      if (stop_) return;
    }
    try {
      Batch batch = source_.next();
      std::lock_guard lock(mutex_);
      ready_.push_back(std::move(batch));
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      changed_.notify_all();
      return;  // the batches after a bad one are not read
    }
    changed_.notify_all();
  }
}

Batch Prefetcher::next() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty()) std::rethrow_exception(error_);
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace stagecraft::tools
