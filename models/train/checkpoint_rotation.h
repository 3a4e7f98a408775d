// Periodic checkpoints of a long run: files <prefix>.step<N>.safetensors written atomically,
// all but the last K deleted, the newest found for --resume=auto; and the model configuration
// plus the step (the data position: a batch is a function of the step) in the file's metadata,
// so --resume needs no shape flags.
//
//   CheckpointRotation ckpt{.dir_or_prefix = "runs/gpt", .keep_last = 3};
//   if (absl::Status s = ckpt.CheckWritable(); !s.ok()) return s;   // before the first step
//   absl::StatusOr<std::string> path = ckpt.Save(step, [&](const std::string& path) {
//     return SaveGptWithConfig(path, layout, snapshot.params, &snapshot.adam_state, step);
//   });                                       // runs/gpt.step<step>.safetensors; older deleted
//   absl::StatusOr<std::string> latest = ckpt.Latest();  // NotFound when there is none
//   std::vector<std::string> skipped;                   // newer files that are no checkpoint
//   absl::StatusOr<std::string> resume = ckpt.LatestComplete(&skipped);
//   ckpt.RemoveStaleTemporaries();                      // *.tmp.<pid> of killed saves
//   absl::StatusOr<GptCheckpointInfo> info = ReadGptCheckpointInfo(*latest);
//   // info->config: layers, d_model, heads, vocab, seq, dtype, compute, moe; info->step.
//
// dir_or_prefix: an existing directory or a path ending in '/' gives DIR/gpt.step<N>...; any
// other path is a prefix (a trailing ".safetensors" is dropped: "ckpt.safetensors" gives
// ckpt.step<N>.safetensors). Save has `writer` write the final name atomically (WriteSafetensors:
// one exclusively created temporary <final>.tmp.<pid>.<random> beside it, fsync, rename; a
// symlink planted there is never written through) and fsyncs the directory: a write that fails
// or is killed leaves the earlier checkpoints as they were (and one stray temporary file at
// worst, never a partial <prefix>.step<N>.safetensors). After a successful save it deletes the
// older checkpoints of the prefix beyond the last keep_last (0: keep all); files of later steps
// (another run's) are left alone.
//
// Metadata keys (strings): "step", "gpt.layers", "gpt.d_model", "gpt.heads", "gpt.vocab",
// "gpt.seq", "gpt.dtype", "gpt.compute" (absent without mixed precision), "gpt.moe.experts",
// "gpt.moe.topk", "gpt.moe.capacity_factor", "gpt.moe.aux_loss_coef", "gpt.moe.expert_axes"
// (comma-separated). GptConfigFromMetadata validates every value (a missing key, a non-number,
// sizes < 1, d_model not divisible by heads, an unknown dtype, a step outside [0, 2^53]) with an
// error naming the key, the value and the fix.
#ifndef SHARDMAP_MODELS_TRAIN_CHECKPOINT_ROTATION_H_
#define SHARDMAP_MODELS_TRAIN_CHECKPOINT_ROTATION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/components/optimizer.h"
#include "models/gpt/gpt_checkpoint.h"
#include "models/gpt/gpt_model.h"
#include "models/model/model.h"

namespace shardmap {

struct CheckpointRotation {
  std::string dir_or_prefix;
  int64_t keep_last = 3;  // 0: keep every checkpoint
  // Set: Save's pruning and LatestComplete consider only the checkpoints whose metadata
  // "run.id" is this ("" : files written before run ids); other runs' files are left alone.
  // Unset: every checkpoint under the prefix.
  std::optional<std::string> run_id;

  // InvalidArgument for an empty dir_or_prefix or keep_last < 0.
  absl::Status Validate() const;
  // The final path of step's checkpoint.
  std::string PathFor(int64_t step) const;
  // The directory exists and a file can be created in it (a probe file, removed again).
  // FailedPrecondition naming the directory, the reason and the fix.
  absl::Status CheckWritable() const;
  // Writes step's checkpoint (writer(path) must write the whole file at path atomically, as
  // WriteSafetensors does), then deletes the old ones; returns the final path. Errors name the
  // step and the path.
  absl::StatusOr<std::string> Save(
      int64_t step, const std::function<absl::Status(const std::string& path)>& writer) const;
  // (step, path) of the prefix's checkpoints, by step; temporary files are not listed.
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> List() const;
  // The path with the highest step; NotFound naming the pattern when there is none.
  absl::StatusOr<std::string> Latest() const;
  // The newest checkpoint that opens and holds a configuration and step
  // (ReadGptCheckpointInfo): a save cut short by a full disk or a crash of the storage leaves
  // a newest file that is not one, and --resume=auto then continues from the one before.
  // `skipped`: "path: why" of each newer file passed over. NotFound when none is complete.
  absl::StatusOr<std::string> LatestComplete(std::vector<std::string>* skipped) const;
  // Removes the temporary files (<prefix>.step<N>.safetensors.tmp.<pid>[.<anything>], and the
  // final file's <prefix>.safetensors.tmp.<pid>[...]) that saves of killed processes left
  // behind: those whose pid is no live process. Returns the removed paths.
  absl::StatusOr<std::vector<std::string>> RemoveStaleTemporaries() const;
  // --overwrite: removes the prefix's checkpoints of runs other than run_id (which must be set;
  // files that do not open as checkpoints stay) and returns their paths. Called after this run's
  // first checkpoint is saved, so that a run refused or failing at its start removes nothing.
  absl::StatusOr<std::vector<std::string>> RemoveOtherRuns() const;
  // The prefix's checkpoints by run id (their metadata's "run.id"; "" without one), each run's
  // (step, path) by step; files that do not open as checkpoints go to *unreadable.
  absl::StatusOr<std::map<std::string, std::vector<std::pair<int64_t, std::string>>>> ListRuns(
      std::vector<std::string>* unreadable) const;
};

// The writer's pid of a temporary file name "<x>.safetensors.tmp.<pid>" or
// "<x>.safetensors.tmp.<pid>.<more>" (atomic_file.h's names, and the older doubled
// ".tmp.<pid>.tmp.<pid>"); nullopt for any other name.
std::optional<int64_t> TemporaryWriterPid(const std::string& name);

// A checkpoint's metadata "run.id" ("" when it has none); errors as SafetensorsFile::Open's.
absl::StatusOr<std::string> CheckpointRunId(const std::string& path);

// GptConfigMetadata / GptConfigFromMetadata (the configuration as metadata strings, see above)
// are in models/gpt/gpt_model.h; add {"step", N} for a training state.
// "step": an integer in [0, 2^53] (InvalidArgument otherwise, NotFound when absent).
absl::StatusOr<int64_t> StepFromMetadata(const std::map<std::string, std::string>& m);

// As SaveGpt (models/gpt/gpt_checkpoint.h), with the model's ShapeMetadata() and "step" in
// the metadata. params / moments: global tensors in layout order (moments may be null).
// `extra`: more metadata (e.g. run_config.h's RunConfigMetadata).
absl::Status SaveGptWithConfig(const std::string& path, const Model& layout,
                               const std::vector<NamedTensor>& params, const AdamState* moments,
                               int64_t step,
                               const std::map<std::string, std::string>& extra = {});

struct GptCheckpointInfo {
  GptConfig config;
  int64_t step = 0;
};
// Opens a checkpoint (models/components/checkpoint.h validates the file) and reads its config and step;
// errors are prefixed with the path.
absl::StatusOr<GptCheckpointInfo> ReadGptCheckpointInfo(const std::string& path);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_CHECKPOINT_ROTATION_H_
