// The trainer's forward/backward strategies and what every strategy shares: one program (GptLoss
// on a tape, gradient accumulation over microsteps) or this stage's part of a pipeline
// timetable; their forward-only losses (evaluation); the gradient reduction over pending-sum
// axes; the tied embedding's gradient exchange between the first and last stage; and ShareLoss,
// the one place the step's loss becomes the same number on every rank.
//
//   Backprop bp = OneProgramBackprop(layout, params, ids, targets, plan.global_tokens,
//                                    /*types=*/nullptr, tape, recorder);
//   ReduceGradients(layout.mesh(), bp.grads);      // all_reduce over each gradient's P axes
//   // or, overlapped: pass a GradientBuckets to the strategy and take buckets.Finish()
//   double loss = ShareLoss(layout, plan, stage, bp.loss);
//
// A new strategy is one more *Backprop function here (and its refusals in run_plan.cc).
#ifndef SHARDMAP_MODELS_TRAIN_STRATEGIES_H_
#define SHARDMAP_MODELS_TRAIN_STRATEGIES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/tape.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/gpt_trace.h"
#include "models/parallel/pipeline.h"
#include "models/train/fsdp_params.h"
#include "models/train/grad_buckets.h"
#include "models/train/rank_state.h"
#include "models/train/train_options.h"
#include "models/train/run_plan.h"
#include "models/train/stage_fsdp.h"
#include "shardmap/value.h"

namespace shardmap {

// What one step's forward and backward hand to the rest of the step.
struct Backprop {
  std::vector<Value> grads;  // per held parameter (the tape's dual types: pending sums P)
  Value loss;                // the loss's local share; undefined on pipeline stages but the last
  MoeStats moe;
  int64_t peak_saved_bytes = 0, activation_bytes = 0, largest_activation_bytes = 0;
  int64_t peak_gathered_bytes = -1;  // FSDP: FsdpParams / StageFsdp::peak_gathered_bytes (-1: n/a)
  double forward_end_us = 0;         // one program: when the forward ended (the trace)
  double busy_us = 0, total_us = 0;  // pipeline: time in forwards/backwards, whole timetable
  std::vector<PipelineSpan> spans;   // pipeline: this rank's forwards and backwards
};

// The local shape of parameter p on any rank: StoredShape (FSDP's padding included) split
// evenly by its spec.
Shape LocalShape(const ParamInfo& p, const Mesh& mesh);

// The names of the axes of `type` whose kind is `kind` (SpmdType::AxesOfKind), less `skip` (an
// axis index, or -1: the pipeline axis, whose sums the pipeline makes itself).
std::vector<std::string> AxesOfKind(const Mesh& mesh, const SpmdType& type, AxisKind kind,
                                    int skip = -1);

// The strategy "one program": GptLoss on a tape, one backward pass per microstep. Every loss
// share is over the whole batch's tokens, so the losses and gradients of the microsteps add up.
// With `buckets`, the last microstep's backward hands each gradient (the microsteps' sum) to
// it as soon as it is final, and Backprop::grads stays empty: the caller's buckets.Finish()
// returns them reduced (overlapped reduction). Without, grads are the pending sums. With
// `fsdp` and a dp_shard axis, the parameters are gathered by FsdpParams (prefetched, resharded
// after the forward); Backprop::peak_gathered_bytes says how much of them was alive at once.
Backprop OneProgramBackprop(const Model& layout, const std::vector<Value>& params,
                            const std::vector<Value>& ids, const std::vector<Value>& targets,
                            int64_t global_tokens, TypeTrace* types, Tape& tape,
                            TracingRecorder& rec, GradientBuckets* buckets = nullptr,
                            const FsdpSchedule* fsdp = nullptr);

// The strategy "pipeline": this stage's part of the timetable over the microbatches. With
// `buckets`, as OneProgramBackprop: the stage's last backward hands each gradient over. With a
// dp_shard axis the stage's FSDP parameters are gathered once per step and their gradients
// reduce-scattered once (StageFsdp, models/train/stage_fsdp.h): with `fsdp` by flat calls,
// prefetched and overlapped; without, by blocking calls (the reference);
// Backprop::peak_gathered_bytes is the stage's gathered bytes either way.
Backprop PipelineBackprop(const Model& layout, const RunPlan& plan, int stage,
                          const std::vector<Value>& params, const std::vector<Value>& ids,
                          const std::vector<Value>& targets, const SpmdType& boundary_type,
                          TypeTrace* types, BackwardObserver* observer,
                          GradientBuckets* buckets = nullptr, const FsdpSchedule* fsdp = nullptr);

// The type of the residual stream crossing pipeline stages: what the embedding gives, probed
// once with zeros on every rank (so the collectives inside match).
SpmdType PipelineBoundaryType(const Model& layout, const RunPlan& plan, const Device& dev);

// One all_reduce per gradient over the axes where it is a pending sum (P): dp for replicated
// parameters, dp_replicate under HSDP, tp for tp-replicated ones; never pp (the stages hold
// different parameters).
void ReduceGradients(const Mesh& mesh, std::vector<Value>& grads);

// The step's GradientBuckets when overlap.on (over the rank's held parameters), else
// null; and the reduction either way: the buckets' Finish() into grads, or ReduceGradients.
std::unique_ptr<GradientBuckets> NewGradientBuckets(const Model& layout,
                                                   const OverlapOptions& overlap,
                                                   const RankState& state);
void FinishGradients(const Model& layout, GradientBuckets* buckets, std::vector<Value>& grads);

// The tied wte under a pipeline: the embedding's (stage 0) and the lm_head's (last stage)
// gradients summed on both, so the two copies take identical AdamW steps; the last stage's copy
// is then not counted in the norm (counted[i] = false). `held`: the stage's parameter indices.
void ExchangeTiedEmbeddingGrad(const Model& layout, const RunPlan& plan, int stage,
                               const std::vector<int>& held, const Device& dev,
                               std::vector<Value>& grads, std::vector<bool>& counted);

// The loss as one number on every rank: its pending sums added up (pp aside), then, under a
// pipeline, the last stage's value handed to every stage. `loss` may be undefined (a stage
// other than the last).
double ShareLoss(const Model& layout, const RunPlan& plan, int stage, const Value& loss,
                 const Device& dev);

// The forward-only loss of one program's microsteps on every rank: evaluation.
double ForwardLoss(const Model& layout, const std::vector<Value>& params,
                   const std::vector<Value>& ids, const std::vector<Value>& targets,
                   int64_t global_tokens);

// Under a pipeline, the forward-only loss of the microbatches: per microbatch, stage t runs its
// blocks on what stage t-1 sent and one ppermute over pp hands the residual on (every rank calls
// each transfer; only stage t's output travels). `params`: the stage's held parameters.
double PipelineForwardLoss(const Model& layout, const RunPlan& plan, int stage,
                           const std::vector<int>& held, const std::vector<Value>& params,
                           const std::vector<Value>& ids, const std::vector<Value>& targets,
                           const SpmdType& boundary_type, const Device& dev);

// The run's stop at a non-finite loss or gradient norm (every rank sees the same values): throws
// OpError(FailedPrecondition) naming the step, before the optimizer step.
[[noreturn]] void NonFiniteStop(int64_t step, double loss, double norm);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_STRATEGIES_H_
