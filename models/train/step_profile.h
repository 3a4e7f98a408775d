// StepProfile: what one rank does in one GPT optimizer step, from a shape-only run
// (models/train/gpt_shape_only.h): its collectives in program order, its op counts (FLOPs, bytes, GEMM
// shapes), its persistent and peak memory and, under a pipeline, its timetable. The planner
// (models/plan_gpt) turns these into step times with a hardware profile.
//
//   absl::StatusOr<std::vector<StepProfile>> roles = ProfileGptStep(layout, options);
//   for (const StepProfile& p : *roles) {
//     std::cout << p.role << ": " << p.flops / 1e12 << " TFLOP, peak " << p.peak_bytes << "\n";
//     for (const CollectiveTraffic& c : p.collectives) ...;   // op, axes, group, bytes, phase
//     for (const GemmCount& g : p.gemms) ...;                  // [batch] m x k @ k x n, count
//   }
#ifndef SHARDMAP_MODELS_TRAIN_STEP_PROFILE_H_
#define SHARDMAP_MODELS_TRAIN_STEP_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace shardmap {

// One collective this rank issued (the CollectiveRecord of a real run, with names resolved).
struct CollectiveTraffic {
  std::string op;                  // "all_reduce", "all_gather", "reduce_scatter", "ppermute", ...
  std::vector<std::string> axes;   // mesh axes, in mesh order
  int64_t group_size = 1;          // ranks in the group (product of the axes' sizes)
  int64_t bytes = 0;               // bytes this rank contributed (CollectiveRecord::bytes)
  DType dtype = DType::kF32;
  bool backward = false;           // issued while the backward pass ran
  // "forward", "backward" (the forward/backward strategy, all microbatches) or "optimizer"
  // (after it: gradient reductions, the norm, the loss report, the tied-wte exchange).
  std::string phase;
};

// GEMMs of one shape (matmul / einsum contractions and their VJPs), counted.
struct GemmCount {
  int64_t batch = 1, m = 0, n = 0, k = 0;  // [batch] (m x k) @ (k x n)
  DType dtype = DType::kF32;
  bool trans_a = false, trans_b = false;
  int64_t count = 0;
  double flops = 0;  // all of them: count * 2 * batch * m * n * k
};

// Every op of one name and dtype, counted (the OpCounter's records summed).
struct OpTotal {
  std::string op;
  DType dtype = DType::kF32;
  int64_t count = 0;
  double flops = 0;
  double bytes = 0;  // read + written
};

struct StepProfile {
  std::string role;               // "all ranks", "pp stage 0 (first)", "pp stage 3 (last)", ...
  int rank = 0;                   // the rank that was run
  std::vector<int> ranks_like_this;  // every rank running the same program (rank included)
  std::vector<CollectiveTraffic> collectives;  // program order, all microbatches, one step
  std::vector<OpTotal> ops;       // by (op, dtype), in first-seen order
  std::vector<GemmCount> gemms;   // by shape, in first-seen order
  double flops = 0, gemm_flops = 0, op_bytes = 0;  // the step's ops on this rank
  double optimizer_flops = 0;     // of which after the forward/backward (reductions, AdamW)
  // Persistent per rank: parameters held, their gradients, AdamW moments (exp_avg + exp_avg_sq).
  int64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
  // The step's peak of live tensor bytes on this rank (MemoryTracker, whole step: parameters,
  // moments, batch, activations, gradients, optimizer temporaries).
  int64_t peak_bytes = 0;
  // peak_bytes less what persists across steps (parameters + AdamW moments) and the gradients:
  // the activations and temporaries at the peak (an upper bound where the peak is reached
  // before every gradient exists).
  int64_t activation_peak_bytes = 0;
  // As the trainer's summary reports them (TrainResult): the tape's peak of saved activations
  // (FSDP parameters while gathered and held, not once resharding freed them), the gathered FSDP
  // parameters at most (-1: no FSDP gathers), and the MemoryTracker's peak of the step's own
  // tensors over the whole step and up to the end of the backward (without what persists).
  int64_t saved_activation_peak_bytes = 0, gathered_peak_bytes = -1;
  int64_t step_tensor_peak_bytes = 0, backprop_tensor_peak_bytes = 0;
  int64_t collective_bytes = 0;   // sum of collectives[i].bytes
  // Pipeline (pp > 1 or microbatches > 1): this stage's actions in timetable order, one string
  // per tick ("F0", "B3", "-" idle), and the fraction of ticks idle.
  std::vector<std::string> pipeline_timetable;
  double pipeline_bubble = 0;
};

// A multi-line summary (role, ranks, flops, memory, collectives by kind and axes).
std::string FormatStepProfile(const StepProfile& p);

}  // namespace shardmap

#endif  // SHARDMAP_MODELS_TRAIN_STEP_PROFILE_H_
