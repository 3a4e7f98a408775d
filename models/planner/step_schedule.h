// The step's timeline as the trainer of issue 34 runs it: compute on one lane, collectives on a
// second (a communication stream / thread), each task starting when its lane is free and the
// task it waits for on the other lane has finished. The planner's cost model (cost_model.h)
// prices overlap with it instead of a constant fraction; the lead can call it directly to
// predict a simulated-link benchmark (PredictOverlappedStep).
//
//   // Forward of 4 layers, 2 ms each, each layer's all-gather 1 ms, prefetch depth 1:
//   FsdpPass f{.layers = 4, .compute_s = 8e-3, .gather_s = 4e-3, .prefetch = 1};
//   absl::StatusOr<double> t = FsdpForwardSeconds(f);   // 1 ms (the first gather) + 8 ms
//
// What it models (each an assumption, stated):
//   - Gradient buckets (DDP's 25 MiB): gradients become final at a steady rate over the
//     backward (bytes in proportion to its compute), in reverse layer order; bucket k's
//     reduction starts when its gradients are final and the lane is free; the last bucket
//     waits for the end of the backward, so it never overlaps.
//   - FSDP (FSDP2's schedule): each layer's parameters are all-gathered before its compute;
//     the gather of layer i+d (d the prefetch depth) is issued when layer i starts, and no
//     more than d+1 gathered layers are alive (a gather waits for the layer d+1 back to
//     finish). The backward gathers again when parameters are resharded after the forward,
//     and reduce-scatters each layer's gradients when its backward ends (then its HSDP
//     all-reduce). One lane in program order: a collective waits for the ones issued before
//     it (one NCCL stream's FIFO).
//   - Pipelines: each stage runs its schedule's actions (pipeline.h's StageActions) in order,
//     each as soon as its input has arrived (the previous virtual stage's forward plus the
//     boundary transfer) and the stage is free: the asynchronous point-to-point execution of
//     Megatron-LM and torchtitan, not lockstep ticks.
#ifndef SHARDMAP_MODELS_PLANNER_STEP_SCHEDULE_H_
#define SHARDMAP_MODELS_PLANNER_STEP_SCHEDULE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace shardmap::planner {

// One task on a lane: its seconds, and the index of the task on the other lane that must have
// finished before it starts (-1: none).
struct LaneTask {
  double seconds = 0;
  int after = -1;
};

struct TwoLaneTimes {
  double end = 0;          // when both lanes are done
  double compute_end = 0;  // when the compute lane is done
  double busy = 0;         // the compute lane's own seconds
  double exposed() const { return end - busy; }  // time the step spends beyond its compute
};

// Runs both lanes, each in its order. InvalidArgument for a dependency out of range or a cycle
// (a task that can never start).
absl::StatusOr<TwoLaneTimes> RunTwoLanes(const std::vector<LaneTask>& compute,
                                         const std::vector<LaneTask>& comm);

// Data-parallel gradient reduction in buckets of `bucket_bytes` during a backward of
// `backward_s` seconds: `grad_bytes` of gradients, bucket_seconds(bytes) what reducing one
// bucket of that size costs. Returns the seconds from the start of the backward to the end of
// the last reduction (>= backward_s). InvalidArgument for bucket_bytes <= 0.
absl::StatusOr<double> BucketedBackwardSeconds(double backward_s, double grad_bytes,
                                               double bucket_bytes,
                                               const std::function<double(double)>& bucket_seconds);

// One forward or backward pass of an FSDP role over its `layers` layers (compute and
// collectives spread evenly over them).
struct FsdpPass {
  int layers = 1;
  double compute_s = 0;     // the pass's compute, all layers
  double gather_s = 0;      // all-gathering every layer once (0: parameters already gathered)
  double reduce_s = 0;      // backward: reduce-scattering every layer's gradients once (0: none)
  double replicate_s = 0;   // backward: HSDP's all-reduce of the shards over dp_replicate
  int prefetch = 1;         // gathers in flight ahead of the computing layer
};
// InvalidArgument for layers < 1 or prefetch < 1.
absl::StatusOr<double> FsdpForwardSeconds(const FsdpPass& pass);
absl::StatusOr<double> FsdpBackwardSeconds(const FsdpPass& pass);

// The asynchronous pipeline: forward_s[s] / backward_s[s] one microbatch's forward / backward
// on stage s (all its chunks together; interleaved, each chunk takes 1/v of it), boundary_s
// one activation's transfer between neighbouring stages. Returns the time until the last stage
// finishes; *bubble (optional) = 1 - busy / (stages * time). InvalidArgument as StageActions,
// or for times of the wrong length.
absl::StatusOr<double> AsyncPipelineSeconds(const std::string& schedule, int stages,
                                            int microbatches, int virtual_stages,
                                            const std::vector<double>& forward_s,
                                            const std::vector<double>& backward_s,
                                            double boundary_s, double* bubble = nullptr);

// A whole data-parallel step on a simulated link, for the lead's benchmark (no pipeline):
// per-layer compute measured on this CPU, collectives priced as alpha + bytes / bandwidth by
// the given functions.
struct OverlappedStepInput {
  int layers = 1;
  double forward_s = 0, backward_s = 0;  // one microstep's compute, all layers
  double optimizer_s = 0;                // after the backward (AdamW, clipping)
  int microsteps = 1;                    // gradient accumulation
  bool overlap = true;                   // --overlap=on|off
  // DDP / HSDP-replicate gradients: total bytes reduced per step and a bucket's cost.
  double grad_bytes = 0;
  double bucket_bytes = 25.0 * 1024 * 1024;
  std::function<double(double)> grad_bucket_seconds;
  // FSDP: seconds of one gather of every layer and of one reduce-scatter of every layer's
  // gradients (0 without FSDP), and the HSDP all-reduce.
  double fsdp_gather_s = 0, fsdp_reduce_s = 0, hsdp_replicate_s = 0;
  int prefetch = 1;
  bool reshard_after_forward = true;
};
// InvalidArgument for layers / microsteps / prefetch < 1, bucket_bytes <= 0, or grad bytes
// without a bucket cost.
absl::StatusOr<double> PredictOverlappedStep(const OverlappedStepInput& in);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_STEP_SCHEDULE_H_
