// What a training run fixes before its first step, and every refusal of impossible settings:
// one PlanRun(layout, options) for the trainer, the planner and the shape-only profiler alike.
//
//   absl::StatusOr<RunPlan> plan = PlanRun(layout, options);
//   if (!plan.ok()) return plan.status();   // InvalidArgument naming the setting and the fix
//   plan->pipelined;      // pp > 1 or microbatches > 1: the pipeline strategy
//   plan->microbatches;   // per step, grad_accum folded in under a pipeline
//   plan->local_rows;     // tokens of one microbatch (or microstep) on one rank
//
// A new parallelism adds its strategy (models/train/strategies.h) and its refusals here.
#ifndef SHARDMAP_MODELS_TRAIN_RUN_PLAN_H_
#define SHARDMAP_MODELS_TRAIN_RUN_PLAN_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt/gpt_model.h"
#include "models/parallel/pipeline.h"
#include "models/train/train_options.h"

namespace shardmap {

// Which stage holds which parameters (without a pipeline: one stage holding all of them).
// Interleaved (virtual_stages v > 1): virtual stage vs = c * p + s is chunk c of stage s.
struct StagePlan {
  int virtual_stages = 1;
  std::vector<int64_t> first_layer, layers;  // per virtual stage (per stage when v == 1)
  std::vector<std::vector<int>> owned;       // per stage: parameter indices (layout order)
  std::vector<std::vector<int>> owned_chunk;  // per stage: the chunk of each owned parameter
  std::vector<int> owner;                     // per parameter: the first stage holding it

  int stages() const { return static_cast<int>(layers.size()) / virtual_stages; }
  // The layers of stage s over all its chunks.
  int64_t StageLayers(int s) const;
};

// Virtual stage vs holds blocks [first_vs, first_vs + sizes[vs]) (sizes.size() = p * v);
// virtual stage 0 (stage 0, chunk 0) also wte and wpe, the last (stage p-1, chunk v-1) ln_f and
// (p > 1) a copy of wte for the tied lm_head.
StagePlan PlanStages(const Model& layout, const std::vector<int64_t>& sizes,
                     int virtual_stages = 1);

// What is fixed before the first step.
struct RunPlan {
  bool pipelined = false;
  int stages = 1;
  int64_t microbatches = 1;  // per step (pipeline), grad_accum folded in
  int64_t accum = 1;         // one-program microsteps (gradient accumulation without pp)
  std::shared_ptr<const Timetable> timetable;  // pipelined
  StagePlan stage_plan;
  int64_t local_rows = 0;     // tokens of one microbatch on one rank
  int64_t boundary_rows = 0;  // rows of the residual stream crossing stages (SP: / tp)
  int64_t global_tokens = 0;  // batch * seq: every loss share is over these
  int pp_index = -1;          // the pp axis's index under a pipeline, else -1

  // A parameter's type: its spec's, V on pp under a pipeline (each stage holds its own).
  SpmdType ParamType(const Mesh& mesh, const ParamInfo& p) const;
  // The type of a rank's token rows (V on pp under a pipeline, like the activations they meet).
  SpmdType RowType(const Model& layout) const;
};

// The checks of the options alone (before anything else): steps >= 1; finite, possible AdamW
// settings and clip; not both init and resume; microbatches, grad_accum >= 1; eval and
// snapshot settings; only_rank and spmd_runner; a placement with comm; with a pipeline (pp > 1
// or microbatches > 1) no cp and no MoE. InvalidArgument naming the setting and the fix;
// FailedPrecondition when the placement asks for GPUs that are not there.
absl::Status CheckTrainOptions(const Model& layout, const TrainOptions& options);

// CheckTrainOptions, then the run's shape: the batch's divisibility by microbatches x
// grad_accum x the data-parallel ways, sequence parallelism's split of each rank's tokens over
// tp, the stage split (over the virtual stages when interleaved) and the schedule's timetable,
// and the save path.
absl::StatusOr<RunPlan> PlanRun(const Model& layout, const TrainOptions& options);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_RUN_PLAN_H_
