// GPT-2 in this library: the umbrella header of the model, its parallel layout, its checkpoints,
// its trace and its trainer. Include the parts directly where one is enough:
//   models/parallel/parallel_dims.h   axis names (axis::kDp, ...), ParseMesh, ParallelDims
//   models/gpt/gpt_model.h       GptConfig, GptLayout, InitGpt, GptLoss and its pieces (GptEmbed,
//                            GptBlock, GptHead, GptParamUse), BatchAt
//   models/gpt/gpt_checkpoint.h  safetensors files in GPT-2's names and layouts, AdamState
//   models/gpt/gpt_trace.h       TraceEvent, the backward/forward tracers, Chrome trace JSON
//   models/train/trainer.h         TrainGpt (every parallelism, the pipeline strategy included),
//                            TrainOptions, TrainResult, StepInfo
//
//   GptConfig cfg{.layers = 2, .d_model = 16, .heads = 4, .vocab = 32, .seq = 8};
//   absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("dp_shard=2,tp=2"), cfg,
//                                                        /*sp=*/true);
//   TrainOptions opt{.steps = 3, .batch = 4};
//   absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(cfg, /*seed=*/1), tokens, opt);
//   // r->losses[s]: the mean cross-entropy of step s; r->params: the trained global tensors.
//   cfg.compute = DType::kBF16;  // bf16 mixed precision: f32 master weights, bf16 compute
//
// Include order: parallel_dims <- gpt_model <- gpt_checkpoint, gpt_trace <- trainer <- gpt.
#ifndef SHARDMAP_MODELS_GPT_H_
#define SHARDMAP_MODELS_GPT_H_

#include "models/gpt/gpt_checkpoint.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/gpt_trace.h"
#include "models/parallel/parallel_dims.h"
#include "models/train/trainer.h"

#endif  // SHARDMAP_MODELS_GPT_H_
