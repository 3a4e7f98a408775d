// Pipeline-parallel GPT-2 training is a forward/backward strategy of the one trainer
// (models/train/trainer.h): TrainGpt runs it whenever the mesh has pp > 1 or options.microbatches > 1.
// TrainGptPipeline stays as a name for it.
//
//   absl::StatusOr<GptLayout> layout =
//       GptLayout::Create(*ParseMesh("pp=2,dp=2,tp=2"), cfg, /*sp=*/false);
//   TrainOptions opt{.steps = 3, .batch = 8, .pipeline = {.microbatches = 4, .schedule = "1f1b"}};
//   absl::StatusOr<TrainResult> r = TrainGptPipeline(*layout, InitGpt(cfg, 1), tokens, opt);
//   opt.pipeline = {.microbatches = 4, .schedule = "interleaved_1f1b", .virtual_stages = 2};
#ifndef SHARDMAP_MODELS_TRAIN_GPT_PIPELINE_H_
#define SHARDMAP_MODELS_TRAIN_GPT_PIPELINE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "models/train/trainer.h"

namespace shardmap {

// TrainGpt (the same contract; pp and microbatches choose the pipeline strategy).
inline absl::StatusOr<TrainResult> TrainGptPipeline(const GptLayout& layout,
                                                    const std::vector<NamedTensor>& init,
                                                    const std::vector<int64_t>& tokens,
                                                    const TrainOptions& options) {
  return TrainGpt(layout, init, tokens, options);
}

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_GPT_PIPELINE_H_
