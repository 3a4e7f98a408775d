// A training run's outputs as the flags ask: the evaluation's held-out data, the periodic
// checkpoints (--save_every, rotated, one run per prefix), the final --save, and the trace
// (with a process per rank, one part per process merged by rank 0 into one file).
#ifndef SHARDMAP_MODELS_RUN_OUTPUTS_H_
#define SHARDMAP_MODELS_RUN_OUTPUTS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "models/components/trace_writer.h"
#include "models/data/text_data.h"
#include "models/model/model.h"
#include "models/run/connection.h"
#include "models/run/trace_merge.h"
#include "models/run/train_settings.h"
#include "models/train/checkpoint_rotation.h"
#include "models/train/run_config.h"
#include "models/train/trainer.h"

namespace shardmap {

// The run's outputs as the flags ask: evaluation, periodic checkpoints, the trace.
class RunOutputs {
 public:
  // run: the run configuration every checkpoint carries (its id limits the rotation to it).
  RunOutputs(const Model& layout, const RankWorld& ranks, const RunConfig& run);

  // Checks the paths against the data and the prefix before the first step and sets them in `o`
  // (the flags themselves were checked by ValidateTrainFlags).
  absl::Status Set(const TokenData& data, const TrainSettings& settings, TrainOptions& o);
  absl::Status CloseTrace() { return writer_ != nullptr ? writer_->Close() : absl::OkStatus(); }
  // --save is written here after training (with the model's shape in its metadata); TrainGpt's
  // own save_path stays empty.
  absl::Status SaveFinal(const TrainResult& r) const;
  const std::string& save_path() const { return save_path_; }
  std::string trace_path() const { return writer_ != nullptr ? trace_path_ : ""; }

 private:
  absl::Status SetTrace(const StepFilter& steps, TrainOptions& o);
  absl::Status CheckNoOtherRuns() const;

  const Model& layout_;
  const RankWorld& ranks_;
  std::string save_path_;
  CheckpointRotation rotation_;  // periodic: atomic <prefix>.step<N>.safetensors, the last kept
  std::map<std::string, std::string> run_metadata_;
  std::string trace_path_;
  std::unique_ptr<TraceWriter> writer_;
  StepFilter trace_steps_;
  mutable bool overwrite_others_ = false;  // --overwrite with other runs' checkpoints present
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_RUN_OUTPUTS_H_
