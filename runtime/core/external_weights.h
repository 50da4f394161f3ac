#pragma once
/// \file
/// Loading a stage file's initializers kept as ONNX external data (compiler/plan/stage_weights.h
/// writes them): each read straight from its window of the file into the tensor (pread, never
/// the whole file), the bytes hashed as they pass and checked against what plan.json recorded,
/// so a missing, truncated or changed file is refused before anything runs.

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <map>
#include <string>

#include "runtime/core/tensor.h"
#include "runtime/format/plan.h"
#include "runtime/format/weights_hash.h"

namespace stagecraft::rt {

/// Where a stage file's external initializers are and what their bytes must hash to.
struct ExternalWeights {
  /// The plan directory: a location that plan.json does not declare must be a plain file in it
  /// (the stage's own `stage_K.weights`; runtime/format/inside_folder.h's rule).
  std::string folder;
  /// The model's own data files plan.json names (`Plan::weight_files`): location -> path. Only
  /// through these does a stage file reach outside the plan directory.
  std::map<std::string, std::string, std::less<>> declared;
  int64_t bytes = 0;   ///< plan.json's stages[k].weights_bytes.
  std::string hash;    ///< plan.json's stages[k].weights_hash.
  std::string field;   ///< "plan.json's stages[2]", for messages.
};

/// The declared files and the recorded bytes and hash of `stage` of `plan` in `plan_dir`.
ExternalWeights external_weights_of(const plan::Plan& plan, const plan::Stage& stage,
                                    const std::string& plan_dir);

/// Reads the external initializers of one stage file, in file order.
class ExternalWeightReader {
 public:
  /// `source` names the stage file in messages; `weights` may be null (then any external
  /// initializer is refused: a model given alone must embed its weights).
  ExternalWeightReader(const ExternalWeights* weights, std::string source);
  ~ExternalWeightReader();
  ExternalWeightReader(const ExternalWeightReader&) = delete;
  ExternalWeightReader& operator=(const ExternalWeightReader&) = delete;

  /// The tensor of initializer `proto` (data_location EXTERNAL). Throws `Error` naming the
  /// stage file, the tensor, the data file and the numbers: an undeclared or unsafe location,
  /// a missing file, a window past its end, a length its dtype and dims do not call for.
  Tensor read(const onnx::TensorProto& proto);

  /// After the last initializer: the bytes read must be plan.json's and hash alike. Throws
  /// `Error(kPlan)` naming the data files otherwise.
  void finish();

  int64_t bytes_read() const { return hasher_.bytes(); }

 private:
  int open(const std::string& path);
  const ExternalWeights* weights_;
  std::string source_;
  plan::WeightsHasher hasher_;
  std::map<std::string, int> fds_;  // by resolved path
};

}  // namespace stagecraft::rt
