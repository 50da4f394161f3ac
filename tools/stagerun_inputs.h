#pragma once
/// \file
/// stagerun's inputs: the whole batch read from --inputs (FILE.npy, or DIR with NAME.npy or
/// NAME.pb per graph input), and the checks of --data's K batches (read by stagerun_data.h).

#include <map>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/exec/pipeline.h"

namespace stagecraft::tools {

/// A tensor name as a file name: characters other than letters, digits, '.', '-' and '_'
/// become '_'.
std::string file_stem(const std::string& name);

/// The graph inputs of `pipeline` from `path` (a .npy or .pb for a one-input model, else a
/// directory); `Error(kUsage)`/`kIo` naming `flag` (--inputs or --data), the path and the input
/// otherwise.
std::map<std::string, rt::Tensor> read_inputs(const std::string& path, const rt::Pipeline& pipeline,
                                              std::string_view flag = "--inputs");

/// The file of graph input `in` in `dir`: NAME.npy or NAME.pb (NAME as is or as `file_stem`);
/// `Error(kUsage)` naming `flag` (--inputs or --data), `dir`, the input and what it must hold.
std::string input_file(const std::string& dir, const rt::ModelTensor& in,
                       const rt::Pipeline& pipeline, std::string_view flag);

/// A --data file's array: its dtype and shape.
struct ArrayInfo {
  DType dtype = DType::kUndefined;
  rt::Shape shape;
};

/// --data DIR: each input's file (`data`, by input name) holds K batches along the first axis;
/// returns K (`Error(kShape)` naming the input when they do not hold whole batches alike, with
/// the stagec --dim that re-plans for them where the model leaves that dim symbolic).
int64_t count_batches(const std::map<std::string, ArrayInfo>& data, const rt::Pipeline& pipeline,
                      const std::string& dir, std::string_view flag = "--data");

}  // namespace stagecraft::tools
