#pragma once
/// \file
/// Training checkpoints and the export of trained weights into the original model.
///
/// A checkpoint is a directory:
///
///   DIR/manifest.json          {format: "stagecraft-checkpoint", version: 3, model_hash,
///                               plan {schedule, devices, microbatches}, step, optimizer,
///                               stages [{index, file, file_hash, weights [{name, file, dtype,
///                               shape}], optimizer [{weight, state, file}]}]}
///   DIR/stage_K/wNNNN.npy      stage K's weights (one .npy per tensor, numbered: names map to
///   DIR/stage_K/oNNNN.npy      files only through the manifest), its optimizer state tensors
///
/// `step` is the number of optimizer steps done (the lr schedule resumes from it). Version 3
/// adds, for a plan of precision fp16, `loss_scale` {scale, clean_steps}: dynamic loss
/// scaling's state (run_types.h `LossScale`), restored with the rest. `plan` and each stage's
/// `file` and `file_hash` record the plan that saved it; loading does not need them.
///
/// Weights and optimizer state are keyed by the weight's name, a stage weight's name: the
/// model's initializer name (a weight the exporter had merged into an equal one and the plan
/// trains apart: the duplicate's name, as --export writes it). So a checkpoint loads into any
/// training plan of the same model (model_hash) and optimizer: another device count, other
/// cuts, schedule or chunk count, replica count, ZeRO-1 or not, another precision (float32
/// master weights in every precision). Each stage of the loading plan takes each of its weights
/// and that weight's state from whichever saved stage holds it. The manifest's top level may
/// carry fields this reader does not know (a later stagerun's); they are ignored.
/// `data` (optional, any version): the caller's data position (SaveOptions::data; stagerun's,
/// tools/stagerun_data.h), an object the checkpoint keeps as given and load_checkpoint hands back.
///
/// A weight several stages hold (plan.json's shared_weights) is saved once, with its optimizer
/// state, by the lowest stage that holds it; loading restores it to every holder. Version 1
/// (before shared weights were summed) saved every stage's copy; it still loads, each shared
/// weight taken from its lowest holder.
///
/// Saving is atomic: everything goes into DIR.tmp-<pid>, every file and folder is fsynced,
/// then DIR (if any) is renamed to DIR.old, DIR.tmp-<pid> to DIR, and DIR.old removed. A crash
/// at any point leaves either DIR or (between the two renames) DIR.old holding the last
/// complete checkpoint; loading falls back to DIR.old when DIR is missing.

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/exec/pipeline.h"

namespace stagecraft::rt {

inline constexpr int kCheckpointVersion = 3;
inline constexpr const char* kCheckpointFormat = "stagecraft-checkpoint";

struct SaveOptions {
  /// Test hook: fail (as a crash would, without cleaning up) after writing this many tensor
  /// files into the temporary folder; < 0: never.
  int fail_after_files = -1;
  /// The caller's data position (stagerun's, tools/stagerun_data.h), kept opaque as the
  /// manifest's "data" (an object; null: none) and handed back by load_checkpoint.
  nlohmann::json data;
};

/// Saves `pipeline`'s weights, optimizer state and step count into `dir` (see above). Training
/// plans only (`Error(kUsage)` otherwise); I/O failures are `Error(kIo)` naming the file.
void save_checkpoint(const Pipeline& pipeline, const std::string& dir, const SaveOptions& options = {});

// The parts of a save, for a save shared by several processes (runtime/mpi/world.h: one
// writer per stage, the manifest written last by rank 0); save_checkpoint is them in a row.

/// Makes the temporary folder `dir`.tmp-`pid` (empty; stale ones of dead savers removed) and
/// returns its path.
std::string begin_save(const std::string& dir, long pid);

/// Writes stage `stage`'s weights (those the checkpoint holds: not a shared weight of a higher
/// holder) and the optimizer state `state` (whole: each tensor the weight's shape) into `tmp`
/// (`stage_K/`, fsynced), calling `after_file` after each file; returns its manifest entry.
nlohmann::ordered_json save_stage(const Pipeline& pipeline, int stage,
                                  const std::map<std::string, optim::OptimizerState>& state,
                                  const std::string& tmp,
                                  const std::function<void()>& after_file = {});

/// Writes the manifest (`stages`: every stage's entry, by index) into `tmp` and renames `tmp`
/// into `dir` by the atomic rules above.
void finish_save(const Pipeline& pipeline, const std::string& dir, const std::string& tmp,
                 nlohmann::ordered_json stages, const nlohmann::json& data = nullptr);

/// The directory a load of `dir` would read: `dir`, or `dir`.old when `dir` is missing and a
/// save was interrupted between its renames; `Error(kIo)` when neither exists.
std::string checkpoint_to_load(const std::string& dir);

/// Restores weights, optimizer state, step count and loss scale from `dir` (or `dir`.old, see
/// above) into any training plan of the model (weights found by name, see above), into every
/// data-parallel replica (with ZeRO-1 each replica takes its shard of the state). A pipeline
/// loaded for some devices (a rank of mpirun) restores its own stages only, each weight from
/// whichever saved stage's files hold it. A weight the plan holds but does not train (frozen)
/// takes the saved value without optimizer state.
/// Refuses, changing nothing, what cannot carry over (`Error(kPlan)`, one line naming it:
/// another model hash or optimizer, a float32 weight of the plan that the checkpoint lacks, a
/// checkpoint weight that no stage of the plan holds (checked where one process holds every
/// stage)), a saved tensor of another dtype or shape (`Error(kShape)`), or a damaged checkpoint
/// (`Error(kFormat)` naming the file and field; also a trained weight's missing optimizer state
/// after the first step). Returns the step restored; `data` (when given) gets the manifest's
/// "data" (SaveOptions::data), null when it has none.
int64_t load_checkpoint(Pipeline& pipeline, const std::string& dir,
                        nlohmann::json* data = nullptr);

/// Writes the plan's original model (plan.model_path, which must exist and hash to
/// plan.model_hash) to `out_path` with every initializer named like a stage weight replaced by
/// the pipeline's values (a shared weight once, from its lowest holder), through temporary files
/// renamed into place. A weight the exporter had merged into an equal one (an Identity copying an
/// initializer) and the plan trained apart becomes an initializer of its own in place of the
/// Identity. A model that keeps its weights in external data, or whose export would pass
/// protobuf's 2 GiB embedded, is written with its initializers of over 1 KiB in `out_path`.data
/// (ONNX external data), streamed one tensor at a time; otherwise they are embedded (raw_data).
/// Returns the number of initializers replaced or so added.
int export_model(const Pipeline& pipeline, const std::string& out_path);

}  // namespace stagecraft::rt
