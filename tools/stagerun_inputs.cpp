// stagerun's inputs (stagerun_inputs.h): --inputs FILE.npy|DIR and --data DIR read and cut.
#include "tools/stagerun_inputs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include <fmt/ranges.h>
#include <onnx/onnx_pb.h>

#include "runtime/core/tensor_io.h"
#include "runtime/format/error.h"

namespace fs = std::filesystem;

namespace stagecraft::tools {

// A tensor name as a file name: characters other than letters, digits, '.', '-' and '_' become '_'.
std::string file_stem(const std::string& name) {
  std::string out = name;
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return out;
}

std::string input_file(const std::string& dir, const rt::ModelTensor& in,
                       const rt::Pipeline& pipeline, std::string_view flag) {
  for (const std::string& stem : {in.name, file_stem(in.name)})
    for (const char* ext : {".npy", ".pb"}) {
      fs::path file = fs::path(dir) / (stem + ext);
      if (fs::exists(file)) return file.string();
    }
  // What the file must hold: the step's batch (--inputs), or K of them (--data).
  rt::Shape batch = in.shape;
  if (!batch.empty()) batch[0] *= pipeline.step_microbatches();
  fail(ErrorKind::kUsage, "{} {}: no {}.npy or {}.pb for input '{}' ({}{}{})", flag, dir,
       file_stem(in.name), file_stem(in.name), in.name, flag != "--inputs" ? "K batches of " : "",
       dtype_name(in.dtype), rt::shape_string(batch));
}

std::map<std::string, rt::Tensor> read_inputs(const std::string& path, const rt::Pipeline& pipeline,
                                              std::string_view flag) {
  std::map<std::string, rt::Tensor> inputs;
  const auto& wanted = pipeline.inputs();
  if (!fs::exists(path)) fail(ErrorKind::kIo, "{} {}: no such file or directory", flag, path);
  if (!fs::is_directory(path)) {
    if (wanted.size() != 1)
      fail(ErrorKind::kUsage,
           "{} {}: the model has {} inputs; give a directory with one NAME.npy per input", flag,
           path, wanted.size());
    inputs[wanted[0].name] = with_context(fmt::format("{} {}", flag, path), ErrorKind::kFormat, [&] {
      return path.ends_with(".pb") ? rt::read_tensor_pb(path) : rt::read_npy(path);
    });
    return inputs;
  }
  for (const rt::ModelTensor& in : wanted) {
    const std::string file = input_file(path, in, pipeline, flag);
    inputs[in.name] = file.ends_with(".npy") ? rt::read_npy(file) : rt::read_tensor_pb(file);
  }
  return inputs;
}

namespace {

/// Where `t` differs from the plan's `in` in a dim the model leaves symbolic (its file at the
/// plan's model_path names it): "; the plan fixed seq=32: re-plan for this data with stagec's
/// --dim seq=64"; "" when the model cannot be read or names none of them.
std::string replan_hint(const rt::Pipeline& pipeline, const rt::ModelTensor& in,
                        const rt::Shape& shape) {
  onnx::ModelProto model;
  std::ifstream file(pipeline.plan().model_path, std::ios::binary);
  if (!file || !model.ParseFromIstream(&file)) return "";
  std::vector<std::string> fixed, wanted;
  for (const onnx::ValueInfoProto& input : model.graph().input()) {
    if (input.name() != in.name) continue;
    const auto& dims = input.type().tensor_type().shape().dim();
    const auto rank = static_cast<int>(shape.size());
    for (int i = 1; i < dims.size() && i < rank && i < static_cast<int>(in.shape.size()); ++i) {
      if (dims[i].dim_param().empty() || shape[i] == in.shape[i]) continue;
      fixed.push_back(fmt::format("{}={}", dims[i].dim_param(), in.shape[i]));
      wanted.push_back(fmt::format("--dim {}={}", dims[i].dim_param(), shape[i]));
    }
  }
  if (wanted.empty()) return "";
  return fmt::format("; the plan fixed {}: re-plan for this data with stagec's {}",
                     fmt::join(fixed, ", "), fmt::join(wanted, " "));
}

}  // namespace

// --data: each input's file holds K batches along the first axis, alike.
int64_t count_batches(const std::map<std::string, ArrayInfo>& data, const rt::Pipeline& pipeline,
                      const std::string& dir, std::string_view flag) {
  int64_t batches = -1;
  const int64_t m = pipeline.step_microbatches();  // of every replica
  for (const rt::ModelTensor& in : pipeline.inputs()) {
    const ArrayInfo& t = data.at(in.name);
    const auto rank = static_cast<int64_t>(t.shape.size());
    int64_t rows = in.shape.empty() ? 1 : in.shape[0] * m;
    bool fits = !in.shape.empty() && t.dtype == in.dtype &&
                rank == static_cast<int64_t>(in.shape.size()) &&
                std::equal(in.shape.begin() + 1, in.shape.end(), t.shape.begin() + 1) &&
                t.shape[0] % rows == 0 && t.shape[0] > 0;
    if (!fits)
      fail(ErrorKind::kShape,
           "{} {}: input '{}' is {}{} but should be K batches of {}{} along the first axis{}",
           flag, dir, in.name, dtype_name(t.dtype), rt::shape_string(t.shape), dtype_name(in.dtype),
           rt::shape_string([&] {
             rt::Shape b = in.shape;
             if (!b.empty()) b[0] = rows;
             return b;
           }()),
           t.dtype == in.dtype && rank == static_cast<int64_t>(in.shape.size())
               ? replan_hint(pipeline, in, t.shape)
               : "");
    int64_t k = t.shape[0] / rows;
    if (batches >= 0 && k != batches)
      fail(ErrorKind::kShape, "{} {}: input '{}' holds {} batches, another input {}", flag,
           dir, in.name, k, batches);
    batches = k;
  }
  return batches;
}

}  // namespace stagecraft::tools
