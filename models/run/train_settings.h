// The trainer's flags checked in one place: everything that can be checked before the model,
// the data and the other ranks are known, in the order a user reads --help; the first problem
// is returned, with its fix. The result carries the parsed values, so nothing reads or checks
// these flags again.
//
//   absl::StatusOr<TrainSettings> s = ValidateTrainFlags();   // after a resume adopted its flags
//   if (!s.ok()) return s.status();   // "--lr_schedule=cosin: use constant, cosine or linear"
//   TrainOptions o = s->options;      // optimizer, schedule, pipeline, overlap, recompute ...
#ifndef SHARDMAP_MODELS_RUN_TRAIN_SETTINGS_H_
#define SHARDMAP_MODELS_RUN_TRAIN_SETTINGS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "models/components/trace_writer.h"
#include "models/train/train_options.h"

namespace shardmap {

struct SampleSettings {
  int64_t tokens = 0;  // --sample: 0, no sample
  double temperature = 0;
  int64_t top_k = 0;  // checked against the model's vocab once it is known
};

struct TrainSettings {
  // steps, batch, grad_accum, the optimizer and its schedule, the batch order, the pipeline,
  // overlap, recompute, eval every/steps, save_every, cuda_graph.
  TrainOptions options;
  SampleSettings sample;
  absl::Duration collective_timeout;
  int devices = 0;          // --devices=cpu:N (0: not given)
  double memory_limit = 0;  // --max_memory in bytes (the machine's when not given)
  StepFilter trace_steps;
};

// Every flag of train_flags.h, placement.h and overlap_flags.h that does not need the model, the
// data or the other ranks. InvalidArgument naming the flag, its value and the fix.
absl::StatusOr<TrainSettings> ValidateTrainFlags();

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_RUN_TRAIN_SETTINGS_H_
