#include "models/run/outputs.h"

#include <cstdio>
#include <iostream>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "models/run/train_flags.h"
#include "models/train/run_flags.h"

namespace shardmap {
RunOutputs::RunOutputs(const Model& layout, const RankWorld& ranks, const RunConfig& run)
    : layout_(layout),
      ranks_(ranks),
      save_path_(absl::GetFlag(FLAGS_save)),
      rotation_{save_path_, absl::GetFlag(FLAGS_keep_last), run.id},
      run_metadata_(RunConfigMetadata(run)) {}

absl::Status RunOutputs::Set(const TokenData& data, const TrainSettings& settings,
                             TrainOptions& o) {
  if (!save_path_.empty()) {
    if (absl::Status s = CheckSavePath(save_path_); !s.ok()) return s;
  }
  o.eval.tokens = data.val;  // evaluation on the held-out split
  if (o.eval.every > 0 && data.val.empty()) {
    return absl::InvalidArgumentError(
        "--eval_every needs validation data: add --val_fraction=0.1 or --val_data=FILE");
  }
  // Batch e of an evaluation reads tokens [e*B*T, (e+1)*B*T + 1) of the held-out split, wrapping
  // around its end: say so when the batches repeat tokens (the loss then weights them twice).
  const int64_t seq = layout_.shape().seq;
  const int64_t eval_tokens = o.eval.steps * o.batch * seq + 1;
  if (o.eval.every > 0 && ranks_.print && eval_tokens > static_cast<int64_t>(data.val.size())) {
    std::cout << absl::StrFormat(
        "note: --eval_steps %d x batch %d x seq %d reads %d validation tokens but the held-out "
        "split has %d: the evaluation batches wrap around and repeat tokens; lower "
        "--eval_steps or give more --val_fraction / --val_data\n",
        o.eval.steps, o.batch, seq, eval_tokens, data.val.size());
  }
  if (!save_path_.empty() && ranks_.print) {
    // Saves that were killed left <prefix>.step<N>.safetensors.tmp.<pid>: gone with this run.
    absl::StatusOr<std::vector<std::string>> removed = rotation_.RemoveStaleTemporaries();
    if (removed.ok() && !removed->empty()) {
      std::cout << "removed " << removed->size() << " temporary file"
                << (removed->size() == 1 ? "" : "s") << " of killed saves: "
                << absl::StrJoin(*removed, ", ") << "\n";
    }
  }
  if (o.checkpoint.save_every > 0) {  // with --save (ValidateTrainFlags)
    if (absl::Status s = rotation_.Validate(); !s.ok()) return s;
    if (absl::Status s = rotation_.CheckWritable(); !s.ok()) return s;
    if (absl::Status s = CheckNoOtherRuns(); !s.ok()) return s;
    o.checkpoint.on_save = [this](const TrainResult& snapshot) -> absl::Status {
      if (ranks_.world != nullptr && ranks_.world->rank() != 0) return absl::OkStatus();
      absl::StatusOr<std::string> path =
          rotation_.Save(snapshot.steps_done, [&](const std::string& tmp) {
            return SaveGptWithConfig(tmp, layout_, snapshot.params, &snapshot.adam_state,
                                     snapshot.steps_done, run_metadata_);
          });
      if (!path.ok()) return path.status();
      if (ranks_.print) std::cout << "checkpoint: " << *path << "\n";
      if (!std::exchange(overwrite_others_, false)) return absl::OkStatus();
      absl::StatusOr<std::vector<std::string>> gone = rotation_.RemoveOtherRuns();
      if (!gone.ok()) return gone.status();
      if (ranks_.print && !gone->empty()) {
        std::cout << "--overwrite: removed " << gone->size() << " checkpoint"
                  << (gone->size() == 1 ? "" : "s") << " of other runs: "
                  << absl::StrJoin(*gone, ", ") << "\n";
      }
      return absl::OkStatus();
    };
  }
  return SetTrace(settings.trace_steps, o);
}

// Periodic checkpoints of one run only under a prefix: another run's there are refused, or
// with --overwrite removed once this run has saved its first checkpoint (rank 0 removes them and
// names them; a run refused or failing before that removes nothing), so that --keep_last and
// --resume=auto never mix runs.
absl::Status RunOutputs::CheckNoOtherRuns() const {
  absl::StatusOr<std::vector<std::string>> others =
      OtherRunsCheckpoints(rotation_, *rotation_.run_id);
  if (!others.ok()) return others.status();
  if (others->empty()) return absl::OkStatus();
  if (!absl::GetFlag(FLAGS_overwrite)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--save '", save_path_, "' holds checkpoints of another run (", absl::StrJoin(*others, ", "),
        ") and this run (id ", *rotation_.run_id,
        ") would save beside them: continue that run with --resume=auto, choose another --save, "
        "or remove them with --overwrite"));
  }
  overwrite_others_ = true;  // removed after this run's first checkpoint, not before
  return absl::OkStatus();
}

// The trace: opened now (a bad path fails before training), written as the run goes.
// With a process per rank, each process writes its own track to a part file beside the trace
// (<trace>.rank<R>), on the machine's monotonic clock so the tracks line up; after training
// rank 0 merges them into the trace (MergeTraceParts), so one Perfetto file shows every rank.
absl::Status RunOutputs::SetTrace(const StepFilter& steps, TrainOptions& o) {
  trace_path_ = absl::GetFlag(FLAGS_trace);
  if (trace_path_.empty()) return absl::OkStatus();
  const bool processes = ranks_.world != nullptr && ranks_.world->size() > 1;
  if (!ranks_.print && !processes) return absl::OkStatus();
  trace_steps_ = steps;
  const std::string path =
      ranks_.print ? trace_path_ : TracePartPath(trace_path_, ranks_.world->rank());
  absl::StatusOr<std::unique_ptr<TraceWriter>> w =
      TraceWriter::Open(path, processes ? 0.0 : TraceNowUs());
  if (!w.ok()) return w.status();
  writer_ = *std::move(w);
  o.tracing.writer = writer_.get();
  o.tracing.step_filter = [this](int64_t step) { return trace_steps_.Contains(step); };
  return absl::OkStatus();
}

absl::Status RunOutputs::SaveFinal(const TrainResult& r) const {
  if (save_path_.empty() || (ranks_.world != nullptr && ranks_.world->rank() != 0)) {
    return absl::OkStatus();
  }
  const bool moments = r.adam_state.exp_avg.size() == layout_.params().size();
  return SaveGptWithConfig(save_path_, layout_, r.params, moments ? &r.adam_state : nullptr,
                           r.steps_done, run_metadata_);
}

}  // namespace shardmap
