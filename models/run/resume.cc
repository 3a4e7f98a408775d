#include "models/run/resume.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/gpt/gpt_checkpoint.h"
#include "models/run/train_flags.h"
#include "models/train/checkpoint_rotation.h"
#include "models/train/sample_text.h"

namespace shardmap {
namespace {

void AppendLines(const std::vector<std::string>& lines, std::string* note) {
  for (const std::string& line : lines) {
    if (!note->empty() && note->back() != '\n') note->push_back('\n');
    absl::StrAppend(note, line);
  }
}

}  // namespace

absl::Status ResolveResume(std::string* resume, std::string* note) {
  *resume = absl::GetFlag(FLAGS_resume);
  if (*resume != "auto") return absl::OkStatus();
  CheckpointRotation rot{absl::GetFlag(FLAGS_save), absl::GetFlag(FLAGS_keep_last)};
  if (absl::GetFlag(FLAGS_save).empty()) {
    return absl::InvalidArgumentError("--resume=auto needs --save (the checkpoint prefix)");
  }
  // Only the checkpoints of the run under the prefix count; several runs there are refused.
  absl::StatusOr<std::optional<std::string>> run = SingleRunUnder(rot);
  if (!run.ok()) return run.status();
  rot.run_id = *run;
  std::vector<std::string> skipped;  // newer files that are no complete checkpoint
  absl::StatusOr<std::string> latest = rot.LatestComplete(&skipped);
  for (const std::string& why : skipped) {
    absl::StrAppend(note, "--resume=auto: passed over ", why, "\n");
  }
  if (absl::IsNotFound(latest.status()) && skipped.empty()) {
    *resume = "";
    *note = absl::StrCat("--resume=auto: ", latest.status().message(), "; starting a fresh run");
    return absl::OkStatus();
  }
  if (!latest.ok()) return latest.status();
  *resume = *latest;
  return absl::OkStatus();
}

absl::StatusOr<ShapeSource> OpenShapeSource(const std::string& resume, const std::string& init) {
  ShapeSource s;
  s.path = !resume.empty() ? resume : init;
  s.flag = !resume.empty() ? "--resume" : "--init";
  if (s.path.empty()) return s;
  absl::StatusOr<SafetensorsFile> f = OpenGptCheckpoint(s.path);
  if (!f.ok()) return f.status();
  s.file = std::make_shared<SafetensorsFile>(*std::move(f));
  return s;
}

absl::Status CheckFileModel(const ShapeSource& source, const std::string& model) {
  if (source.file == nullptr) return absl::OkStatus();
  const std::map<std::string, std::string>& meta = source.file->metadata();
  auto it = meta.find("model");
  const std::string saved = it != meta.end()              ? it->second
                            : meta.count("gpt.layers") > 0 ? "gpt2"
                                                           : model;
  if (saved != model) {
    return absl::InvalidArgumentError(absl::StrCat(source.flag, " '", source.path, "' holds a ",
                                                   saved, " model but --model=", model,
                                                   "; pass --model=", saved));
  }
  return absl::OkStatus();
}

absl::Status AdoptShapeFrom(const ShapeSource& source, GptConfig* cfg, std::string* note) {
  if (source.file == nullptr) return absl::OkStatus();
  const SafetensorsFile& f = *source.file;
  const std::string& path = source.path;
  if (source.resume()) {
    if (absl::StatusOr<int64_t> step = CheckpointStep(f); step.ok()) {
      absl::StrAppend(note, "resumed from ", path, " at step ", *step);
    }
  }
  bool has_config = false;
  for (const auto& [k, v] : f.metadata()) has_config |= absl::StartsWith(k, "gpt.");
  if (!has_config) return absl::OkStatus();
  absl::StatusOr<GptConfig> saved = GptConfigFromMetadata(f.metadata());
  if (!saved.ok()) {
    return absl::Status(saved.status().code(),
                        absl::StrCat(source.flag, " '", path, "': ", saved.status().message()));
  }
  const std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> shape = {
      {"layers", {cfg->layers, saved->layers}}, {"d_model", {cfg->d_model, saved->d_model}},
      {"heads", {cfg->heads, saved->heads}},    {"vocab", {cfg->vocab, saved->vocab}},
      {"seq", {cfg->seq, saved->seq}},          {"experts", {cfg->moe.experts, saved->moe.experts}}};
  for (const auto& [name, values] : shape) {
    const absl::CommandLineFlag* cl = absl::FindCommandLineFlag(name);
    if (cl != nullptr && GivenOnCommandLine(name) && values.first != values.second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, "=", values.first, " but the checkpoint '", path, "' has ", name, " ",
          values.second, "; ", source.flag, " takes the model's shape from the file: drop --",
          name));
    }
  }
  if (GivenOnCommandLine("dtype") &&
      (saved->dtype != cfg->dtype || saved->compute != cfg->compute)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dtype=", absl::GetFlag(FLAGS_dtype), " but the checkpoint '", path,
        "' was trained in ", DTypeName(saved->compute_dtype()), "; drop --dtype"));
  }
  // The expert axes are a layout choice of this run's mesh, not the model's shape.
  saved->moe.expert_axes = cfg->moe.expert_axes;
  *cfg = *saved;
  return absl::OkStatus();
}

absl::StatusOr<ResumedRun> ContinueOrStartRun(const ShapeSource& source, std::string* note) {
  const std::string id = absl::GetFlag(FLAGS_run_id);
  if (!source.resume()) return ResumedRun{id.empty() ? NewRunId() : id, std::nullopt};
  std::vector<std::string> notes;
  absl::StatusOr<ResumedRun> run = AdoptRunFlags(source.file->metadata(), source.path, &notes);
  if (!run.ok()) return run.status();
  if (!id.empty() && run->saved.has_value() && id != run->run_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--run_id=", id, " but '", source.path, "' is a checkpoint of run '", run->run_id,
        "': a resume continues that run; drop --run_id"));
  }
  AppendLines(notes, note);
  return run;
}

absl::StatusOr<RunConfig> DescribeRun(const ResumedRun& run, const std::string& resume,
                                      std::string* note) {
  RunConfig now{run.run_id, CurrentRunFlags()};
  const std::string data = !absl::GetFlag(FLAGS_data).empty() ? absl::GetFlag(FLAGS_data)
                                                              : absl::GetFlag(FLAGS_text);
  if (!data.empty()) {
    absl::StatusOr<FileIdentity> id = IdentifyFile(data);
    if (!id.ok()) return id.status();
    now.data = *id;
  }
  if (!absl::GetFlag(FLAGS_tokenizer).empty()) {
    absl::StatusOr<std::vector<std::string>> files =
        TokenizerFiles(absl::GetFlag(FLAGS_tokenizer));  // models/train/sample_text.h
    if (!files.ok()) return files.status();
    absl::StatusOr<uint64_t> h = HashFiles(*files);
    if (!h.ok()) return h.status();
    now.tokenizer_hash = *h;
  }
  if (run.saved.has_value()) {
    std::vector<std::string> notes;
    if (absl::Status s = CheckSameData(*run.saved, now.data, now.tokenizer_hash, resume, &notes);
        !s.ok()) {
      return s;
    }
    AppendLines(notes, note);
  }
  return now;
}

}  // namespace shardmap
