// The trainer's side of run_config.h: the run's settings read from and adopted into its absl
// flags, a flag given at its default value told apart from one left out
// (absl::flags_internal::WasPresentOnCommandLine), and the run ids of a checkpoint prefix.
//
//   std::vector<std::string> notes;
//   absl::StatusOr<ResumedRun> run = AdoptRunFlags(file.metadata(), file.path(), &notes);
//   // flags not given now hold the run's values; notes: what was adopted, what changed.
//   RunConfig now{.id = run->run_id, .flags = CurrentRunFlags()};
//   absl::StatusOr<std::vector<std::string>> others = OtherRunsCheckpoints(rotation, now.id);
#ifndef SHARDMAP_MODELS_TRAIN_RUN_FLAGS_H_
#define SHARDMAP_MODELS_TRAIN_RUN_FLAGS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/train/checkpoint_rotation.h"
#include "models/train/run_config.h"

namespace shardmap {

// The flag was on the command line (at any value, its default included).
bool GivenOnCommandLine(const std::string& flag);

// Every registered flag of RunSettings() with its current value.
std::map<std::string, std::string> CurrentRunFlags();

struct ResumedRun {
  std::string run_id;             // the run's ("" for a file from before run ids)
  std::optional<RunConfig> saved;  // nullopt: the file holds no run configuration
};
// The checkpoint's run configuration: the settings not given on the command line take its
// values (one note listing them), each one given with another value adds a note, and the
// ones that cannot change are refused (ReconcileRunConfig). A file without a configuration
// (older, or GPT-2's) changes nothing. `metadata`: the checkpoint's header, parsed once by the
// caller; `checkpoint` names the file in messages. Errors name the file.
absl::StatusOr<ResumedRun> AdoptRunFlags(const std::map<std::string, std::string>& metadata,
                                         const std::string& checkpoint,
                                         std::vector<std::string>* notes);

// --resume=auto: the id of the one run whose checkpoints are under the prefix (nullopt: none
// there); InvalidArgument naming each run and its steps when there are several.
absl::StatusOr<std::optional<std::string>> SingleRunUnder(const CheckpointRotation& rotation);

// The prefix's checkpoints of runs other than `run_id` (files that do not open are not
// counted: a cut-short save of this run looks the same).
absl::StatusOr<std::vector<std::string>> OtherRunsCheckpoints(const CheckpointRotation& rotation,
                                                              const std::string& run_id);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_RUN_FLAGS_H_
