// What a run continues from: --resume (a file, or 'auto': the newest checkpoint of --save) or
// --init, opened once (its header parsed once, then handed to every reader: the model check, the
// shape, the run's settings and the trainer), and the run's id and configuration.
//
//   std::string resume, note;
//   ResolveResume(&resume, &note);
//   absl::StatusOr<ShapeSource> src = OpenShapeSource(resume, absl::GetFlag(FLAGS_init));
//   CheckFileModel(*src, "gpt2");  AdoptShapeFrom(*src, &cfg, &note);
//   absl::StatusOr<ResumedRun> run = ContinueOrStartRun(*src, &note);
#ifndef SHARDMAP_MODELS_RUN_RESUME_H_
#define SHARDMAP_MODELS_RUN_RESUME_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/components/checkpoint.h"
#include "models/gpt/gpt_model.h"
#include "models/train/run_config.h"
#include "models/train/run_flags.h"

namespace shardmap {

// --resume=auto: the newest complete periodic checkpoint of --save, or a fresh run when there is
// none yet (so one command serves the first launch and every restart). Sets *resume to the file
// to resume from ("" for a fresh run) and adds to *note what the run says about it.
absl::Status ResolveResume(std::string* resume, std::string* note);

// The file the model comes from: the resume file, else --init (none: path empty, file null).
struct ShapeSource {
  std::string path;
  const char* flag = "--init";  // or "--resume"
  std::shared_ptr<SafetensorsFile> file;  // the header, parsed once
  bool resume() const { return std::string(flag) == "--resume"; }
};
// Opens and checks the header (OpenGptCheckpoint): a missing, non-regular or damaged file is
// refused here, naming it.
absl::StatusOr<ShapeSource> OpenShapeSource(const std::string& resume, const std::string& init);

// The file holds `model` (its metadata "model"; a GPT-2 file before that key: "gpt2").
// InvalidArgument with the --model to pass otherwise.
absl::Status CheckFileModel(const ShapeSource& source, const std::string& model);

// GPT-2's shape from the file's gpt.* metadata (a GPT-2 file without it keeps the flags' shape);
// shape flags on the command line must agree. A resume adds "resumed from FILE at step N".
absl::Status AdoptShapeFrom(const ShapeSource& source, GptConfig* cfg, std::string* note);

// The run this command continues (--resume: the checkpoint's run id, and its settings for the
// flags not given, AdoptRunFlags) or starts (a new run id). Adds what it adopted and every
// changed setting to *note.
absl::StatusOr<ResumedRun> ContinueOrStartRun(const ShapeSource& source, std::string* note);

// The run's configuration for its checkpoints: the settings, the training data file's identity
// and the tokenizer's hash. On a resume, data or a tokenizer that are not the run's are refused
// (CheckSameData); the same data under another path adds a note.
absl::StatusOr<RunConfig> DescribeRun(const ResumedRun& run, const std::string& resume,
                                      std::string* note);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_RUN_RESUME_H_
