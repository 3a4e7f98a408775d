// Shape-only GPT training step: ProfileGptStep runs TrainGpt's step (the same code: forward,
// backward, gradient reductions, norm, clipping, AdamW) for one rank of each distinct program
// on the meta device (shardmap/shape_only.h), with a shape-only communicator, an OpCounter and a
// MemoryTracker around it, and reports one StepProfile per rank role (models/train/step_profile.h).
// Nothing is computed; a GPT with billions of parameters on thousands of ranks takes seconds.
//
//   GptConfig cfg{.layers = 48, .d_model = 6144, .heads = 48, .vocab = 50304, .seq = 2048,
//                 .dtype = DType::kF32, .compute = DType::kBF16};
//   GptLayout layout = *GptLayout::Create(*ParseMesh("pp=4,dp_shard=128,tp=8"), cfg, true);
//   TrainOptions opt{.batch = 1024, .pipeline = {.microbatches = 8, .schedule = "1f1b"}};
//   absl::StatusOr<std::vector<StepProfile>> roles = ProfileGptStep(layout, opt);
//   // roles: "pp stage 0 (first)", "pp stages 1-2", "pp stage 3 (last)"
//
// Roles: without a pipeline every rank runs the same program (one role, rank 0). With one,
// stage 0 and the last stage run their own programs and the middle stages one per distinct
// layer count. Within a stage all ranks are alike (the layout splits evenly).
//
// The options are TrainOptions as TrainGpt takes them (batch, microbatches, schedule,
// virtual_stages, stage_layers, grad_accum, adamw, clip): the same checks refuse the same settings with the
// same messages. What TrainGpt would read from disk or do outside the step (init/resume/save
// paths, evaluation, periodic checkpoints, traces, callbacks, a process communicator, GPU
// placement) is refused here: InvalidArgument naming it.
#ifndef SHARDMAP_MODELS_TRAIN_GPT_SHAPE_ONLY_H_
#define SHARDMAP_MODELS_TRAIN_GPT_SHAPE_ONLY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gpt/gpt_model.h"
#include "models/train/step_profile.h"
#include "models/train/trainer.h"

namespace shardmap {

// The ranks that run different programs: one representative rank per role.
struct GptRankRole {
  std::string role;
  int rank = 0;
  std::vector<int> ranks;  // all the ranks of the role
};
absl::StatusOr<std::vector<GptRankRole>> GptRankRoles(const Model& layout,
                                                      const TrainOptions& options);

// One StepProfile per role (GptRankRoles' order).
absl::StatusOr<std::vector<StepProfile>> ProfileGptStep(const Model& layout,
                                                        const TrainOptions& options);

// The step of one given rank (InvalidArgument outside [0, mesh size)), with ranks_like_this
// the ranks of its role (GptRankRoles). `role` labels it (empty: the role's name).
// device: where the rank's tensors live: the meta device (nothing computed), or the CPU (the
// ops run for real on zero parameters, the collectives stay shape-only: for tests of small
// models, and of the meta device against the CPU).
absl::StatusOr<StepProfile> ProfileGptRank(const Model& layout, const TrainOptions& options,
                                           int rank, const std::string& role = "",
                                           Device device = Device::Meta());

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_GPT_SHAPE_ONLY_H_
