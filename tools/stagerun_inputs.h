#pragma once
/// \file
/// stagerun's inputs: the whole batch read from --inputs (FILE.npy, or DIR with NAME.npy or
/// NAME.pb per graph input) and --data's K batches cut into one input map per batch.

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

/// --data DIR: each input's file holds K batches along the first axis; cut into K input maps
/// (`Error(kShape)` naming the input when they do not hold whole batches alike).
std::vector<std::map<std::string, rt::Tensor>> cut_batches(
    const std::map<std::string, rt::Tensor>& data, const rt::Pipeline& pipeline,
    const std::string& dir);

}  // namespace stagecraft::tools
