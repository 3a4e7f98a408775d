// The validation loss of a checkpoint without training: the trainer's own evaluation
// (RankTrainer's: batch e of `eval_steps` is BatchAt(tokens, e, batch, seq), forward only, the
// mean of their losses) on any mesh the trainer allows, pipelines included, on CPU ranks or
// GPUs (options.runtime.placement). So the number equals the "val loss" train_gpt printed after
// the step the checkpoint was saved at, given the same tokens, batch and grad_accum.
//
//   TrainOptions o;
//   o.batch = 8;
//   o.checkpoint.init_path = "runs/gpt.step100.safetensors";  // its parameters are read
//   absl::StatusOr<double> loss = EvaluateGpt(layout, val_tokens, /*eval_steps=*/4, o);
#ifndef SHARDMAP_MODELS_TRAIN_EVALUATE_H_
#define SHARDMAP_MODELS_TRAIN_EVALUATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt/gpt_model.h"
#include "models/train/train_options.h"

namespace shardmap {

// options: batch, grad_accum, pipeline, runtime.placement and checkpoint.init_path (the file
// whose parameters are evaluated; or `init` global tensors when it is empty). Errors as
// PlanRun's and the checkpoint's (before any forward); InvalidArgument for eval_steps < 1 or
// fewer than seq+1 tokens.
absl::StatusOr<double> EvaluateGpt(const Model& layout, const std::vector<int64_t>& tokens,
                                   int64_t eval_steps, const TrainOptions& options,
                                   const std::vector<NamedTensor>& init = {});

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_EVALUATE_H_
