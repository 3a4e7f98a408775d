// TrainOptions: everything a training run is told (models/train/trainer.h's TrainGpt).
//
//   TrainOptions opt{.steps = 3, .batch = 8, .pipeline = {.microbatches = 4, .schedule = "1f1b"}};
//   opt.optimizer.adamw.lr = 3e-3;
//   opt.hooks.on_step = [](const StepInfo& s) { std::cout << s.loss << "\n"; };
//
// Grouped as a reader looks for them: the pipeline, the optimizer, checkpoints, evaluation,
// traces, where the ranks run, and callbacks.
#ifndef SHARDMAP_MODELS_TRAIN_TRAIN_OPTIONS_H_
#define SHARDMAP_MODELS_TRAIN_TRAIN_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "collectives/communicator.h"
#include "models/components/optimizer.h"
#include "models/components/trace_writer.h"
#include "models/data/batch_order.h"
#include "models/parallel/layers.h"
#include "models/parallel/recompute.h"
#include "shardmap/context.h"
#include "shardmap/device_placement.h"
#include "shardmap/value.h"

namespace shardmap {

class SafetensorsFile;  // models/components/checkpoint.h

struct TrainResult;
struct StepInfo;

// Pipeline strategy (pp > 1, or microbatches > 1 on one stage: gradient accumulation):
// microbatches per step and the schedule ("gpipe", "1f1b" or "interleaved_1f1b"); stage_layers:
// layers per stage (empty: as even as possible). virtual_stages: model chunks per stage, > 1
// only with "interleaved_1f1b" (which needs it > 1, pp > 1 and microbatches a multiple of pp):
// the layers split over pp * virtual_stages virtual stages, chunk c of stage s holding virtual
// stage c * pp + s's (equal sizes, or stage_layers with one size per virtual stage, in
// virtual-stage order).
struct PipelineOptions {
  int64_t microbatches = 1;
  std::string schedule = "1f1b";
  std::vector<int64_t> stage_layers;
  int virtual_stages = 1;
};

// AdamW, global-norm clipping and the learning-rate schedule.
struct OptimizerOptions {
  AdamWOptions adamw{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  double clip = 1.0;  // global-norm clipping (<= 0: off)
  // Learning-rate schedule (models/components/lr_schedule.h's At): the lr of each step, checked
  // finite and >= 0 when used. Null: adamw.lr at every step.
  std::function<double(int64_t step)> lr_at;
};

// Checkpoints (models/gpt/gpt_checkpoint.h). init_path: parameters from a GPT-2 safetensors
// file (each rank reads its blocks; `init` may then be empty). resume_path: parameters, AdamW
// moments and the step count from a file written with save_path; training continues at that
// step. Periodic checkpoints: after every save_every-th step, on_save runs on the reporting rank
// with a snapshot (global params and AdamW moments on the host, steps_done = the step count so
// far). An error stops the run. 0: never.
struct CheckpointOptions {
  std::string init_path, resume_path, save_path;
  // The init or resume file, already opened by the caller (its header parsed once, not again
  // here); used when its path is the one the run reads. Null: opened from the path.
  std::shared_ptr<SafetensorsFile> opened;
  int64_t save_every = 0;
  std::function<absl::Status(const TrainResult& snapshot)> on_save;
};

// Evaluation: every `every` steps (and after the last step) the mean loss over `steps` batches
// of `tokens` (batch e of the evaluation is BatchAt(tokens, e, batch, seq)), forward only, in
// StepInfo::val_loss. 0: never.
struct EvalOptions {
  std::vector<int64_t> tokens;
  int64_t every = 0, steps = 1;
};

// Traces. keep_events: record TraceEvents of every rank in TrainResult::trace. Streamed: with
// writer, each step that step_filter accepts (null: every step) is recorded on every rank and
// written at the step's end (nothing is kept in memory). types: rank 0's types inside block 0
// during the first step.
struct TraceOptions {
  bool keep_events = false;
  TypeTrace* types = nullptr;
  TraceWriter* writer = nullptr;
  std::function<bool(int64_t step)> step_filter;
};

// Where and how the ranks run.
struct RuntimeOptions {
  // Multi-process (e.g. Gloo, started by collectives/launch): run only this process's rank over
  // `comm` (its world, comm->size() == the mesh size) instead of RunSpmd's in-process ranks.
  // Every rank then reports its own view (the loss and norm are the same on every rank; log,
  // bytes and trace are this rank's, on_step runs on it), the parameters and moments are
  // all_gathered after the last step into TrainResult on every rank, and rank 0 alone writes
  // save_path. nullptr: in-process.
  collectives::Communicator* comm = nullptr;
  // Where the in-process ranks run (shardmap/device_placement.h): Cpu() (the default),
  // SharedGpu() (every rank a virtual rank on one GPU, a stream each), GpuPerRank() (rank r on
  // GPU r). Parameters, moments, batches and activations live on the rank's device; results and
  // checkpoints are host tensors. With comm the ranks run where the communicator's memory is
  // (NCCL: this process's GPU) and placement must stay Cpu(). FailedPrecondition without a GPU.
  DevicePlacement placement;
  // GPU ranks: capture the static step once (after one eager warm-up step) and replay it as a
  // CUDA graph where that is safe: one in-process GPU rank, no pipeline, no MoE, no trace, f32
  // master weights (models/train/cuda_graph_step.h's DecideCudaGraph). TrainResult::
  // cuda_graph_used / cuda_graph_note say whether and why not. The replayed steps give the eager
  // GPU step's numbers (the same kernels); false: every step runs eagerly.
  bool cuda_graph = true;
};

// How the step overlaps its communication with compute (docs/design.md, "The overlapped
// step"). Every setting gives bitwise the numbers of the reference schedule (overlap off).
struct OverlapOptions {
  // On: data-parallel gradients (the P axes: dp, dp_replicate, tp for tp-replicated
  // parameters) are reduced in buckets started during the backward as their gradients become
  // final (models/train/grad_buckets.h), and FSDP (dp_shard) gathers each unit's parameters in
  // the compute dtype, `fsdp_prefetch` units ahead, in the forward and the backward
  // (models/train/fsdp_params.h); both on the communicator's started-call lane. Off: the
  // reference schedule, one blocking all_reduce per gradient after the backward and one
  // blocking all_gather per FSDP parameter at its use. Pipeline stages gather each FSDP unit
  // once per step and reduce-scatter it once, flat and overlapped when on, by blocking calls per
  // parameter when off (models/train/stage_fsdp.h).
  bool on = true;
  // > 0; DDP's default (DistributedDataParallel's bucket_cap_mb=25).
  int64_t bucket_bytes = int64_t{25} << 20;
  int fsdp_prefetch = 1;  // >= 1: units gathered ahead of the one computing
  // FSDP2's reshard_after_forward: free each block's gathered parameters after its forward and
  // gather them again for its backward (peak parameter memory ~ 1/dp_shard); false keeps them
  // from the forward to the backward.
  bool reshard_after_forward = true;
};

// Callbacks and test hooks.
struct TrainHooks {
  // Called on the reporting rank after each step.
  std::function<void(const StepInfo&)> on_step;
  // Called on every rank as its step moves to "step" (before the forward), "optimizer" (after
  // the backward: gradient reductions, norm, clipping, AdamW) and "end" (after AdamW).
  std::function<void(const char* phase)> on_phase;
  // Shape-only execution (models/train/gpt_shape_only.h) and per-rank instrumentation in tests:
  // runs the ranks' program in place of RunSpmd (the body once per rank it runs, with that rank's
  // RankContext installed). Null: RunSpmd (or runtime.comm).
  std::function<absl::Status(const Mesh&, const std::function<void(RankContext&)>&)> spmd_runner;
  // With spmd_runner: the one rank it runs (it reports), -1: every rank. With one rank the
  // global parameters and moments are not assembled (TrainResult::params stays empty).
  int only_rank = -1;
};

struct TrainOptions {
  // The run's TOTAL optimizer steps (nanoGPT's max_iters): a resumed run continues from the
  // checkpoint's step up to it.
  int64_t steps = 1;
  int64_t batch = 4;  // global sequences per step
  // Gradient accumulation: each optimizer step's `batch` sequences run as grad_accum
  // consecutive microsteps of batch/grad_accum sequences whose gradients add up (the same numbers
  // as the whole batch at once, up to summation order). Under a pipeline it multiplies the
  // microbatches.
  int64_t grad_accum = 1;
  // The order of the training batches (models/data/batch_order.h): sequential (the default
  // here: BatchAt), or random offsets from a counter-based draw (train_gpt's default, as
  // nanoGPT's). Either way a step's batch is a function of the step alone (exact resume), the
  // same global batch on every rank and mesh. Evaluation batches stay sequential.
  BatchOrder batch_order;
  // Activation recomputation (models/parallel/recompute.h, train_gpt --recompute): none, full
  // (keep each block's input, recompute the block in the backward) or selective (recompute the
  // attention core). Set: the run uses it in place of the layout's config().recompute; unset:
  // the layout's. The same numbers bitwise either way.
  std::optional<RecomputeMode> recompute;
  PipelineOptions pipeline;
  OptimizerOptions optimizer;
  CheckpointOptions checkpoint;
  EvalOptions eval;
  TraceOptions tracing;
  RuntimeOptions runtime;
  OverlapOptions overlap;
  TrainHooks hooks;
};

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_TRAIN_OPTIONS_H_
