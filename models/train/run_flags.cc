#include "models/train/run_flags.h"

#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/components/checkpoint.h"

namespace shardmap {

bool GivenOnCommandLine(const std::string& flag) {
  return absl::flags_internal::WasPresentOnCommandLine(flag);
}

std::map<std::string, std::string> CurrentRunFlags() {
  std::map<std::string, std::string> out;
  for (const RunSetting& s : RunSettings()) {
    if (const absl::CommandLineFlag* f = absl::FindCommandLineFlag(s.flag); f != nullptr) {
      out[s.flag] = f->CurrentValue();
    }
  }
  return out;
}

absl::StatusOr<ResumedRun> AdoptRunFlags(const std::map<std::string, std::string>& metadata,
                                         const std::string& checkpoint,
                                         std::vector<std::string>* notes) {
  absl::StatusOr<RunConfig> saved = RunConfigFromMetadata(metadata);
  if (absl::IsNotFound(saved.status())) return ResumedRun{};
  if (!saved.ok()) {
    return absl::Status(saved.status().code(),
                        absl::StrCat("checkpoint '", checkpoint, "': ", saved.status().message()));
  }
  std::set<std::string> given;
  for (const RunSetting& s : RunSettings()) {
    if (GivenOnCommandLine(s.flag)) given.insert(s.flag);
  }
  absl::StatusOr<Reconciled> r = ReconcileRunConfig(*saved, CurrentRunFlags(), given, checkpoint);
  if (!r.ok()) return r.status();
  std::vector<std::string> adopted;
  for (const auto& [name, value] : r->adopt) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", checkpoint, "': run.flag.", name, " = '", value, "' is not a value of --",
          name, " (", error, "); the file is damaged or edited: give --", name, " explicitly"));
    }
    adopted.push_back(absl::StrCat("--", name, "=", value));
  }
  if (!adopted.empty()) {
    notes->push_back(absl::StrCat("from the checkpoint's run: ", absl::StrJoin(adopted, " ")));
  }
  notes->insert(notes->end(), r->notes.begin(), r->notes.end());
  return ResumedRun{saved->id, *saved};
}

absl::StatusOr<std::optional<std::string>> SingleRunUnder(const CheckpointRotation& rotation) {
  std::vector<std::string> unreadable;
  auto runs = rotation.ListRuns(&unreadable);
  if (!runs.ok()) return std::optional<std::string>();  // no directory yet: nothing there
  if (runs->empty()) return std::optional<std::string>();
  if (runs->size() == 1) return std::optional<std::string>(runs->begin()->first);
  std::vector<std::string> each;
  for (const auto& [id, files] : *runs) {
    std::vector<int64_t> steps;
    for (const auto& f : files) steps.push_back(f.first);
    each.push_back(absl::StrCat("run ", id.empty() ? "(no id: written before run ids)" : id,
                                " (steps ", absl::StrJoin(steps, ", "), ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--resume=auto: '", rotation.dir_or_prefix, "' holds the checkpoints of ", runs->size(),
      " runs: ", absl::StrJoin(each, "; "),
      "; continue one with --resume=FILE, or move the others away"));
}

absl::StatusOr<std::vector<std::string>> OtherRunsCheckpoints(const CheckpointRotation& rotation,
                                                              const std::string& run_id) {
  std::vector<std::string> unreadable, out;
  auto runs = rotation.ListRuns(&unreadable);
  if (!runs.ok()) return out;
  for (const auto& [id, files] : *runs) {
    if (id == run_id) continue;
    for (const auto& f : files) out.push_back(f.second);
  }
  return out;
}

}  // namespace shardmap
