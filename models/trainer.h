// The one GPT trainer (as torchtitan's train.py): a whole run inside one SPMD program, every
// rank holding its shards of the parameters and AdamW state. A forward/backward strategy per
// step, then, once for every parallelism: the gradient reduction over each gradient's pending
// sum axes, the global norm, clipping, AdamW, the loss and the per-step report.
//
//   absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("pp=2,dp=2"), cfg, false);
//   TrainOptions opt{.steps = 3, .batch = 8, .microbatches = 4, .schedule = "1f1b"};
//   absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(cfg, /*seed=*/1), tokens, opt);
//   // r->losses[s]: the mean cross-entropy of step s; r->params: the trained global tensors.
//
// Forward/backward strategies:
//   one program   (no pp, one microbatch): GptLoss on a tape, one backward.
//   pipeline      (pp > 1, or microbatches > 1): models/pipeline.h's lockstep GPipe / 1F1B
//                 timetable over the pp axis (one stage: gradient accumulation over the
//                 microbatches). Stage s holds blocks [first_s, first_s + stage_layers[s]);
//                 stage 0 also wte and wpe, the last stage ln_f and a copy of wte for the tied
//                 lm_head, whose gradient is exchanged over pp and summed on both (the norm
//                 counts it once). Parameters are V on pp. Each step's batch is cut into
//                 `microbatches` consecutive groups of batch/microbatches sequences.
// What the pipeline cannot do is refused before the first step, in one place
// (CheckTrainOptions): MoE and cp; traces, --init, --resume, --save, periodic snapshots,
// evaluation, --print_types and a process communicator (--backend=gloo) work under pp.
#ifndef SHARDMAP_MODELS_TRAINER_H_
#define SHARDMAP_MODELS_TRAINER_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "models/gpt_checkpoint.h"
#include "models/gpt_model.h"
#include "models/gpt_trace.h"
#include "models/trace_writer.h"
#include "models/optimizer.h"
#include "shardmap/context.h"
#include "shardmap/device_placement.h"
#include "shardmap/value.h"

namespace shardmap {

struct TrainResult;

struct StepInfo {
  int64_t step = 0;
  double loss = 0, grad_norm = 0;  // mean cross-entropy; global gradient norm before clipping
  double seconds = 0;              // rank 0's wall time of the step
  const std::vector<CollectiveRecord>* log = nullptr;  // rank 0's collectives of the step
  // MoE: (token, expert) assignments over capacity in the whole step (all layers, all ranks),
  // tokens that lost all their assignments (summed over layers), and all assignments; -1
  // without MoE.
  int64_t moe_dropped = -1, moe_assignments = -1, moe_dropped_tokens = -1;
  // GPU ranks: the peak bytes allocated so far in this run on rank 0's GPU (the caching
  // allocator's; every virtual rank sharing that GPU counted); -1 on CPU ranks.
  int64_t peak_device_bytes = -1;
  int64_t total_steps = 0;  // options.steps
  double lr = 0;            // the learning rate this step used
  int64_t tokens_seen = 0;  // tokens trained on after this step, from step 0 (batch * seq * (step+1))
  double val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN: not evaluated this step
};


struct TrainOptions {
  // The run's TOTAL optimizer steps (nanoGPT's max_iters): a resumed run continues from the
  // checkpoint's step up to it.
  int64_t steps = 1;
  int64_t batch = 4;  // global sequences per step
  // Pipeline strategy (pp > 1, or microbatches > 1 on one stage: gradient accumulation):
  // microbatches per step and the schedule ("gpipe" or "1f1b"); stage_layers: layers per stage
  // (empty: as even as possible).
  int64_t microbatches = 1;
  std::string schedule = "1f1b";
  std::vector<int64_t> stage_layers;
  AdamWOptions adamw{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  double clip = 1.0;  // global-norm clipping (<= 0: off)
  // Called on rank 0 after each step.
  std::function<void(const StepInfo&)> on_step;
  bool trace = false;          // record TraceEvents of every rank (TrainResult::trace)
  TypeTrace* types = nullptr;  // rank 0's types inside block 0 during the first step
  // Checkpoints (gpt_checkpoint.h). init_path: parameters from a GPT-2 safetensors file (each
  // rank reads its blocks; `init` may then be empty). resume_path: parameters, AdamW moments and
  // the step count from a file written with save_path; training continues at that step.
  std::string init_path, resume_path, save_path;
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
  // GPU ranks: capture the static step once and replay it as a CUDA graph where that is safe
  // (TrainResult::cuda_graph_used / cuda_graph_note say whether and why not).
  bool cuda_graph = true;
  // Learning-rate schedule (models/lr_schedule.h's At): the lr of each step, checked finite and
  // >= 0 when used. Null: adamw.lr at every step.
  std::function<double(int64_t step)> lr_at;
  // Gradient accumulation: each optimizer step's `batch` sequences run as grad_accum
  // consecutive microsteps of batch/grad_accum sequences whose gradients add up (the same numbers
  // as the whole batch at once, up to summation order). Under a pipeline it multiplies the
  // microbatches.
  int64_t grad_accum = 1;
  // Evaluation: every eval_every steps (and after the last step) the mean loss over eval_steps
  // batches of val_tokens (batch e of the evaluation is BatchAt(val_tokens, e, batch, seq)),
  // forward only, in StepInfo::val_loss. 0: never.
  std::vector<int64_t> val_tokens;
  int64_t eval_every = 0, eval_steps = 1;
  // Periodic checkpoints: after every save_every-th step, on_save runs on the reporting rank
  // with a snapshot (global params and AdamW moments on the host, steps_done = the step count so
  // far). An error stops the run. 0: never.
  int64_t save_every = 0;
  std::function<absl::Status(const TrainResult& snapshot)> on_save;
  // Streamed trace: with trace_writer, each step that trace_step accepts (null: every step) is
  // recorded on every rank and written to it at the step's end (nothing is kept in memory);
  // `trace` keeps every step's events in TrainResult::trace instead.
  TraceWriter* trace_writer = nullptr;
  std::function<bool(int64_t step)> trace_step;
  // Shape-only execution (models/gpt_shape_only.h) and per-rank instrumentation in tests: runs
  // the ranks' program in place of RunSpmd (the body once per rank it runs, with that rank's
  // RankContext installed). Null: RunSpmd (or options.comm).
  std::function<absl::Status(const Mesh&, const std::function<void(RankContext&)>&)> spmd_runner;
  // With spmd_runner: the one rank it runs (it reports), -1: every rank. With one rank the
  // global parameters and moments are not assembled (TrainResult::params stays empty).
  int only_rank = -1;
  // Called on every rank as its step moves to "step" (before the forward), "optimizer" (after
  // the backward: gradient reductions, norm, clipping, AdamW) and "end" (after AdamW).
  std::function<void(const char* phase)> on_phase;
};


struct TrainResult {
  std::vector<double> losses;          // per step
  std::vector<double> grad_norms;      // per step, before clipping
  std::vector<NamedTensor> params;     // trained, global (assembled)
  // "rank 0" below: the reporting rank (rank 0 in-process, this process's rank with comm).
  std::vector<CollectiveRecord> log;   // rank 0's collectives of the last step
  int64_t param_bytes_per_rank = 0;    // rank 0: parameters
  int64_t optimizer_bytes_per_rank = 0;  // rank 0: gradients + AdamW moments
  // Rank 0, first step: bytes of the tensors the taped forward ops produced (what the tape keeps
  // for the backward, at most), and the largest of them (the attention scores at long seq).
  int64_t activation_bytes_per_rank = 0;
  int64_t largest_activation_bytes = 0;
  // Rank 0, first step: the tape's peak of saved activation bytes (Tape::peak_saved_bytes).
  int64_t peak_activation_bytes_per_rank = 0;
  // Pipeline runs, last step, mean over ranks: the fraction of the step's timetable a rank
  // spent outside forwards and backwards (the measured bubble).
  double pipeline_bubble = 0;
  AdamState adam_state;                // trained moments, global
  std::vector<TraceEvent> trace;       // with options.trace: every rank's events
  int64_t steps_done = 0;              // the step count after the run (options.steps)
  std::vector<int64_t> moe_dropped;    // MoE: dropped assignments per step (StepInfo's)
  // GPU ranks: the run's peak bytes allocated on the reporting rank's GPU (shared by the virtual
  // ranks on it); -1 on CPU ranks. `device`: where the reporting rank ran ("cpu", "cuda:0").
  int64_t peak_device_bytes_per_rank = -1;
  std::string device = "cpu";
  int ranks_per_device = 1;  // virtual ranks sharing the reporting rank's device
  bool cuda_graph_used = false;
  std::string cuda_graph_note;  // why the step was not captured (empty when it was)
};


// For trainers: index k of the 3 * params tensors a rank ends with
// (parameters, then exp_avg, then exp_avg_sq, each in layout order) -> the result's named tensor.
void AddFinalTensor(const GptLayout& layout, size_t k, Tensor global, TrainResult* result);
// --save: the result's parameters (and AdamW moments once a step ran) at result.steps_done.
absl::Status SaveTrainResult(const std::string& path, const GptLayout& layout,
                             const TrainResult& result);

// Trains inside one RunSpmd over layout.mesh() (or over options.comm): each rank holds its
// shards of the parameters and AdamW state for the whole run. init: global tensors named as the
// layout (may be empty with init_path / resume_path). Errors before the first step for
// impossible settings (CheckTrainOptions, batch / microbatches / sp divisibility, tokens, the
// checkpoint file, the save path); FailedPrecondition naming the step when the loss or the
// gradient norm is not finite (the optimizer step is not taken).
absl::StatusOr<TrainResult> TrainGpt(const GptLayout& layout, const std::vector<NamedTensor>& init,
                                     const std::vector<int64_t>& tokens,
                                     const TrainOptions& options);

// Global-norm clipping coefficient of PyTorch's clip_grad_norm_: min(1, max / (norm + 1e-6)).
double ClipCoefficient(double norm, double max_norm);

// The squared global norm of typed gradients, the same on every rank: sharded parts summed over
// their axes, replicated parts counted once (one all_reduce over every axis).
double GlobalGradNormSquared(const std::vector<Value>& grads);
// The same counting only the gradients with counted[k] (a pipeline's second copy of a tied
// parameter is not); gradients V on an axis (a pipeline stage's own) add up over it.
double GlobalGradNormSquared(const std::vector<Value>& grads, const std::vector<bool>& counted);

// The checks TrainGpt makes of its options before anything else, and the one place where what
// the pipeline strategy cannot do is refused: steps >= 1; finite, possible AdamW settings
// (lr >= 0, betas in [0, 1), eps > 0, weight decay >= 0) and clip; not both init and resume;
// microbatches >= 1; with a pipeline (pp > 1 or microbatches > 1) no cp and no MoE;
// a placement with comm. InvalidArgument naming the setting and the fix. FailedPrecondition when the
// placement asks for GPUs that are not there (ResolvePlacement's message).
absl::Status CheckTrainOptions(const GptLayout& layout, const TrainOptions& options);


}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAINER_H_
