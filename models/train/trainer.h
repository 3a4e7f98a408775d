// The one GPT trainer (as torchtitan's train.py): a whole run inside one SPMD program, every
// rank holding its shards of the parameters and AdamW state. A forward/backward strategy per
// step, then, once for every parallelism: the gradient reduction over each gradient's pending
// sum axes, the global norm, clipping, AdamW, the loss and the per-step report.
//
//   absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh("pp=2,dp=2"), cfg, false);
//   TrainOptions opt{.steps = 3, .batch = 8, .pipeline = {.microbatches = 4, .schedule = "1f1b"}};
//   absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(cfg, /*seed=*/1), tokens, opt);
//   // r->losses[s]: the mean cross-entropy of step s; r->params: the trained global tensors.
//
// The trainer in pieces (models/train/):
//   train_options.h  what a run is told (TrainOptions)
//   run_plan.h       PlanRun: everything fixed before the first step, and every refusal
//   rank_state.h     a rank's parameters and AdamW state: from a file or init, back to globals
//   batch_rows.h     a rank's rows of each batch: microsteps or pipeline microbatches
//   strategies.h     one program or a pipeline schedule; forward-only losses; ShareLoss
//   device_step.h    GPU ranks outside a pipeline: the step ended on the device, and its CUDA
//                    graph capture and replay (cuda_graph_step.h: DecideCudaGraph)
//   step_report.h    trace events, MoE counts, the result assembled from the ranks
//   trainer.cc       TrainGpt: plan -> RunSpmd(RankTrainer) -> result
// Pipeline (pp > 1, or microbatches > 1): models/parallel/pipeline.h's GPipe / 1F1B /
// interleaved 1F1B timetable over the pp axis. Stage s holds blocks [first_s, first_s +
// stage_layers[s]) (interleaved: those of virtual stages s, p + s, ..., one chunk each); stage 0
// also wte and wpe, the last stage ln_f and a copy of wte for the tied lm_head, whose gradient is
// exchanged over pp and summed on both (the norm counts it once).
#ifndef SHARDMAP_MODELS_TRAIN_TRAINER_H_
#define SHARDMAP_MODELS_TRAIN_TRAINER_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "models/gpt/gpt_checkpoint.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/gpt_trace.h"
#include "models/train/run_plan.h"
#include "models/train/train_options.h"
#include "models/components/trace_writer.h"
#include "models/components/optimizer.h"
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




struct TrainResult {
  std::vector<double> losses;          // per step
  std::vector<double> grad_norms;      // per step, before clipping
  std::vector<NamedTensor> params;     // trained, global (assembled)
  // "rank 0" below: the reporting rank (rank 0 in-process, this process's rank with comm).
  std::vector<CollectiveRecord> log;   // rank 0's collectives of the last step
  int64_t param_bytes_per_rank = 0;    // rank 0: parameters
  int64_t optimizer_bytes_per_rank = 0;  // rank 0: gradients + AdamW moments
  int64_t gradient_bytes_per_rank = 0;   // rank 0: of which the gradients
  // Rank 0, first step: bytes of the tensors the taped forward ops produced (what the tape keeps
  // for the backward, at most), and the largest of them (the attention scores at long seq).
  int64_t activation_bytes_per_rank = 0;
  int64_t largest_activation_bytes = 0;
  // Rank 0, first step: the tape's peak of saved activation bytes (Tape::peak_saved_bytes; with
  // recomputation, a recomputed block's own activations while its backward runs included; FSDP
  // parameters gathered for a block count while held, not once resharding freed them).
  int64_t peak_activation_bytes_per_rank = 0;
  // Rank 0, first step, CPU/meta ranks: the peak of the tensors the step allocated (MemoryTracker:
  // activations, gathered FSDP parameters, gradients, buckets, optimizer temporaries; not the
  // parameters and moments held across steps); -1 on GPU ranks (see peak_device_bytes_per_rank).
  int64_t peak_step_bytes_per_rank = -1;
  // The same tracker's peak up to the end of the backward (gradient reductions and AdamW's
  // temporaries excluded): activations, gathered FSDP parameters, gradients; -1 as above.
  int64_t peak_backprop_bytes_per_rank = -1;
  // Rank 0, first step, overlapped FSDP: the most gathered parameter bytes alive at once
  // (FsdpParams::peak_gathered_bytes); -1 otherwise.
  int64_t peak_gathered_bytes_per_rank = -1;
  // The run's activation recomputation ("none", "full", "selective"; TrainOptions::recompute).
  std::string recompute = "none";
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
  int64_t cuda_graph_replays = 0;  // steps run as replays of the captured step
  // Why the step was not captured ("CPU ranks ...", "off ...", "not captured: ..."), or where it
  // was ("captured at step s after one eager warm-up step (N replays)").
  std::string cuda_graph_note;
};


// For trainers: index k of the 3 * params tensors a rank ends with
// (parameters, then exp_avg, then exp_avg_sq, each in layout order) -> the result's named tensor.
void AddFinalTensor(const Model& layout, size_t k, Tensor global, TrainResult* result);
// --save: the result's parameters (and AdamW moments once a step ran) at result.steps_done.
absl::Status SaveTrainResult(const std::string& path, const Model& layout,
                             const TrainResult& result);

// Trains inside one RunSpmd over layout.mesh() (or over options.comm): each rank holds its
// shards of the parameters and AdamW state for the whole run. init: global tensors named as the
// layout (may be empty with init_path / resume_path). Errors before the first step for
// impossible settings (CheckTrainOptions, batch / microbatches / sp divisibility, tokens, the
// checkpoint file, the save path); FailedPrecondition naming the step when the loss or the
// gradient norm is not finite (the optimizer step is not taken: on GPU ranks AdamW skips it on
// the device, and the host stops the run once it reads the step's loss and norm).
absl::StatusOr<TrainResult> TrainGpt(const Model& layout, const std::vector<NamedTensor>& init,
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

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_TRAINER_H_
