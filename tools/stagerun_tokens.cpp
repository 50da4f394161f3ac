// stagerun --tokens FILE (stagerun_data.h): a language-model training plan's batches cut from a
// token stream (token_stream.h), window after window.
//
// The plan must have two graph inputs: the loss's labels (plan.json training.labels) and one
// integer input, the model's tokens, both [microbatch, T] per microbatch. Row j of a step's
// batch is window w = order(epoch, index + j): the tokens get the stream's tokens [w T, w T + T),
// the labels [w T + 1, w T + T + 1). The vocabulary is the rows of the embedding table the
// tokens index: the initializer a Gather of the token input reads in the stage files.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <onnx/onnx_pb.h>
#include <vector>

#include "runtime/format/error.h"
#include "tools/stagerun_data.h"
#include "tools/token_stream.h"

namespace fs = std::filesystem;

namespace stagecraft::tools {

namespace {

// The rows of the embedding table `input` indexes (a Gather reading it as indices, directly or
// through a Cast, of an initializer of a stage file), or nullopt when no stage file says.
std::optional<int64_t> embedding_rows(const std::string& plan_dir, const plan::Plan& plan,
                                      const std::string& input) {
  for (const plan::Stage& stage : plan.stages) {
    bool reads = false;
    for (const plan::StageTensor& t : stage.inputs) reads = reads || t.name == input;
    if (!reads) continue;
    onnx::ModelProto model;
    std::ifstream file(fs::path(plan_dir) / stage.file, std::ios::binary);
    if (!file || !model.ParseFromIstream(&file)) continue;
    const onnx::GraphProto& graph = model.graph();
    std::vector<std::string> indices{input};  // the input and its Casts
    for (const onnx::NodeProto& node : graph.node())
      if (node.op_type() == "Cast" && node.input_size() == 1 && node.output_size() == 1 &&
          node.input(0) == input)
        indices.push_back(node.output(0));
    for (const onnx::NodeProto& node : graph.node()) {
      if (node.op_type() != "Gather" || node.input_size() != 2) continue;
      if (std::find(indices.begin(), indices.end(), node.input(1)) == indices.end()) continue;
      for (const onnx::TensorProto& init : graph.initializer())
        if (init.name() == node.input(0) && init.dims_size() >= 1) return init.dims(0);
    }
  }
  return std::nullopt;
}

class TokenBatches final : public BatchSource {
 public:
  TokenBatches(const Args& args, const rt::Pipeline& pipeline, std::string& note)
      : reader_(open_token_file(args.tokens_path, raw_dtype(args))),
        order_(1, false, 0),
        path_(args.tokens_path),
        shuffle_(args.shuffle),
        seed_(args.seed) {
    find_inputs(pipeline);
    const rt::ModelTensor& in = *tokens_;
    rows_ = in.shape[0] * pipeline.step_microbatches();
    seq_ = in.shape[1];
    if (args.seq && *args.seq != seq_)
      fail(ErrorKind::kUsage,
           "--seq {}: the plan's sequence length is {} (input '{}' is {}{} per microbatch); give "
           "--seq {}, or re-plan for rows of {} tokens (stagec --dim)",
           *args.seq, seq_, in.name, dtype_name(in.dtype), rt::shape_string(in.shape), seq_,
           *args.seq);
    const int64_t count = reader_.file().count;
    if (count < seq_ + 1)
      fail(ErrorKind::kFormat,
           "{}: {} tokens, fewer than one window of --seq {} + 1 = {} (the labels are the tokens "
           "one on)",
           path_, count, seq_, seq_ + 1);
    order_ = WindowOrder((count - 1) / seq_, shuffle_, seed_);
    const std::optional<int64_t> rows =
        embedding_rows(args.plan_dir, pipeline.plan(), tokens_->name);
    vocab_ = rows.value_or(0);
    if (!rows)
      note = fmt::format(
          "--tokens: the plan's vocabulary is not known (no Gather of an initializer reads "
          "input '{}' in its stage files): token ids are not checked against it",
          tokens_->name);
  }

  Batch next() override {
    Batch batch;
    batch.epoch = position_.epoch;
    rt::Tensor ids = rt::Tensor::uninitialized(tokens_->dtype, {rows_, seq_});
    rt::Tensor labels = rt::Tensor::uninitialized(labels_->dtype, {rows_, seq_});
    std::vector<int64_t> window(static_cast<size_t>(seq_ + 1));
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t w = order_.window(position_.epoch, position_.index);
      reader_.read(w * seq_, window, vocab_);
      put(ids, r, window.data());
      put(labels, r, window.data() + 1);
      position_.advance(1, order_.windows());
    }
    batch.inputs[tokens_->name] = std::move(ids);
    batch.inputs[labels_->name] = std::move(labels);
    batch.position = {{"kind", "tokens"},        {"windows", order_.windows()},
                      {"seq", seq_},             {"shuffle", shuffle_},
                      {"seed", seed_},           {"epoch", position_.epoch},
                      {"index", position_.index}};
    return batch;
  }

  void restore(const nlohmann::json& position, const std::string& dir) override {
    if (!position.is_object() || position.value("kind", "") != "tokens") return;
    auto number = [&](const char* key) { return position.value(key, int64_t{-1}); };
    const bool shuffle = position.value("shuffle", false);
    const uint64_t seed = position.value("seed", uint64_t{0});
    const int64_t epoch = number("epoch"), index = number("index");
    if (number("windows") != order_.windows() || number("seq") != seq_)
      fail(ErrorKind::kUsage,
           "--resume {}: its data position is in a stream of {} windows of {} tokens; --tokens "
           "{} holds {} windows of {}",
           dir, number("windows"), number("seq"), path_, order_.windows(), seq_);
    if (shuffle != shuffle_ || (shuffle && seed != seed_))
      fail(ErrorKind::kUsage,
           "--resume {}: its data was drawn {}; this run asks for {} (give the same --shuffle "
           "and --seed to go on where it stopped)",
           dir, shuffle ? fmt::format("--shuffle --seed {}", seed) : "in order",
           shuffle_ ? fmt::format("--shuffle --seed {}", seed_) : "in order");
    if (epoch < 0 || index < 0 || index >= order_.windows())
      fail(ErrorKind::kFormat, "--resume {}: data position epoch {} window {} is not one of {}",
           dir, epoch, index, order_.windows());
    position_ = {epoch, index};
  }

  int64_t batches() const override { return order_.windows() / rows_; }
  void rewind() override { position_ = {}; }

 private:
  static std::optional<TokenDtype> raw_dtype(const Args& args) {
    if (args.token_dtype.empty()) return std::nullopt;
    return raw_token_dtype(args.token_dtype);  // CLI11 checked the name
  }

  // The labels and the token input; refuses a plan where either is not one input of [B, T].
  void find_inputs(const rt::Pipeline& pipeline) {
    const plan::Plan& plan = pipeline.plan();
    if (!plan.training)
      fail(ErrorKind::kUsage, "--tokens trains a language model; this is an inference plan");
    std::vector<std::string> names;
    std::vector<const rt::ModelTensor*> integer;
    for (const rt::ModelTensor& in : pipeline.inputs()) {
      names.push_back(fmt::format("'{}' {}{}", in.name, dtype_name(in.dtype),
                                  rt::shape_string(in.shape)));
      if (in.name == plan.training_config.labels)
        labels_ = &in;
      else if (in.dtype == DType::kInt64 || in.dtype == DType::kInt32)
        integer.push_back(&in);
    }
    const auto two_d = [](const rt::ModelTensor* t) { return t && t->shape.size() == 2; };
    if (labels_ == nullptr || integer.size() != 1 || pipeline.inputs().size() != 2 ||
        !two_d(labels_) || !two_d(integer[0]) || labels_->shape != integer[0]->shape ||
        (labels_->dtype != DType::kInt64 && labels_->dtype != DType::kInt32))
      fail(ErrorKind::kUsage,
           "--tokens: cannot tell the tokens from the labels: the plan's inputs are {} and its "
           "loss's labels input is '{}'; a token stream feeds a plan of two [batch, seq] integer "
           "inputs, the model's tokens and the loss's labels",
           fmt::join(names, ", "), plan.training_config.labels);
    tokens_ = integer[0];
  }

  // Row `r` of `t` ([rows, seq], int64 or int32) from `tokens`.
  void put(rt::Tensor& t, int64_t r, const int64_t* tokens) const {
    if (t.dtype == DType::kInt64) {
      std::copy(tokens, tokens + seq_, t.as<int64_t>() + r * seq_);
      return;
    }
    for (int64_t i = 0; i < seq_; ++i) {
      if (tokens[i] > INT32_MAX)
        fail(ErrorKind::kFormat, "{}: token {} does not fit the plan's int32 input '{}'", path_,
             tokens[i], tokens_->name);
      t.as<int32_t>()[r * seq_ + i] = static_cast<int32_t>(tokens[i]);
    }
  }

  TokenReader reader_;
  WindowOrder order_;
  std::string path_;
  bool shuffle_;
  uint64_t seed_;
  const rt::ModelTensor* tokens_ = nullptr;
  const rt::ModelTensor* labels_ = nullptr;
  int64_t rows_ = 0, seq_ = 0, vocab_ = 0;
  StreamPosition position_;
};

}  // namespace

std::unique_ptr<BatchSource> token_batches(const Args& args, const rt::Pipeline& pipeline,
                                           std::string& note) {
  return std::make_unique<TokenBatches>(args, pipeline, note);
}

}  // namespace stagecraft::tools
