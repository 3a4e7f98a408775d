// GPT-2 training with pipeline parallelism over the mesh's first axis "pp" (models/pipeline.h),
// composable with dp / dp_replicate / dp_shard (FSDP, HSDP) and tp (+sp) inside each stage.
//
//   absl::StatusOr<GptLayout> layout =
//       GptLayout::Create(*ParseMesh("pp=2,dp=2,tp=2"), cfg, /*sp=*/false);
//   TrainOptions opt{.steps = 3, .batch = 8, .microbatches = 4, .schedule = "1f1b"};
//   absl::StatusOr<TrainResult> r = TrainGptPipeline(*layout, InitGpt(cfg, 1), tokens, opt);
//
// Stages: stage s (pp index s) holds blocks [first_s, first_s + stage_layers[s]); stage 0 also
// the embeddings (wte, wpe), the last stage ln_f and a copy of wte for the tied lm_head. The
// boundary between stages is the residual stream [rows of a microbatch, d_model] (rows / tp
// under sp). Parameters are V on pp (each stage holds its own); their gradients are reduced
// over the other axes as in TrainGpt. The tied wte: the embedding's gradient (stage 0) and the
// lm_head's (last stage) are exchanged by one ppermute over pp and summed on both, so the two
// copies take identical AdamW steps; the global norm counts wte once.
// Each step's batch is cut into `microbatches` consecutive groups of batch/microbatches
// sequences, each split over the batch axes as TrainGpt splits a batch; the loss is the same
// mean over all the step's tokens. Not supported: cp (an error), checkpoint loading (init_path,
// resume_path: an error), trace. save_path works.
#ifndef SHARDMAP_MODELS_GPT_PIPELINE_H_
#define SHARDMAP_MODELS_GPT_PIPELINE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt.h"

namespace shardmap {

// Same contract as TrainGpt, plus options.microbatches / schedule / stage_layers. A mesh
// without pp (or pp=1) runs one stage (gradient accumulation over the microbatches).
// InvalidArgument before training for layers < pp, batch not divisible by microbatches x the
// batch axes, an unknown schedule, cp, checkpoint loading.
absl::StatusOr<TrainResult> TrainGptPipeline(const GptLayout& layout,
                                             const std::vector<NamedTensor>& init,
                                             const std::vector<int64_t>& tokens,
                                             const TrainOptions& options);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_GPT_PIPELINE_H_
