#include "models/train/evaluate.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "models/parallel/pipeline.h"
#include "models/train/batch_rows.h"
#include "models/train/rank_state.h"
#include "models/train/run_plan.h"
#include "models/train/strategies.h"
#include "shardmap/spmd_runner.h"

namespace shardmap {

absl::StatusOr<double> EvaluateGpt(const Model& layout, const std::vector<int64_t>& tokens,
                                   int64_t eval_steps, const TrainOptions& options,
                                   const std::vector<NamedTensor>& init) {
  if (eval_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval_steps ", eval_steps, " must be >= 1 (validation batches)"));
  }
  TrainOptions o = options;
  o.steps = 1;  // PlanRun's checks; nothing is trained
  o.checkpoint.resume_path.clear();
  o.eval = {};
  absl::StatusOr<RunPlan> plan = PlanRun(layout, o);
  if (!plan.ok()) return plan.status();
  if (absl::Status s = CheckTokens(layout.shape(), tokens); !s.ok()) return s;
  absl::StatusOr<StateSource> source = OpenStateSource(layout, init, o);
  if (!source.ok()) return source.status();
  const int64_t seq = layout.shape().seq;
  double loss = 0;
  std::mutex mu;
  auto body = [&](RankContext& ctx) {
    const int stage = plan->pp_index >= 0 ? ctx.coord(plan->pp_index) : 0;
    RankState state(layout, *plan, *source, o.optimizer.adamw, ctx.rank(), stage, ctx.device());
    RankBatches batches(layout, *plan, o.batch, ctx.rank(), ctx.device());
    SpmdType boundary;
    if (plan->pipelined) {
      CreateAllCommunicators(ctx);
      boundary = PipelineBoundaryType(layout, *plan, ctx.device());
    }
    double sum = 0;
    for (int64_t e = 0; e < eval_steps; ++e) {  // as RankTrainer::MaybeEvaluate
      Tensor vi, vt;
      BatchAt(tokens, e, o.batch, seq, &vi, &vt);
      std::vector<Value> ids, targets;
      if (plan->pipelined) {
        batches.Microbatches(vi, vt, &ids, &targets);
        sum += PipelineForwardLoss(layout, *plan, stage, state.held, state.params, ids, targets,
                                   boundary, ctx.device());
      } else {
        batches.Microsteps(vi, vt, &ids, &targets);
        sum += ForwardLoss(layout, state.params, ids, targets, plan->global_tokens);
      }
    }
    if (ctx.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      loss = sum / static_cast<double>(eval_steps);
    }
  };
  SpmdOptions spmd;
  spmd.placement = o.runtime.placement;
  if (absl::Status s = RunSpmd(layout.mesh(), body, spmd); !s.ok()) return s;
  return loss;
}

}  // namespace shardmap
