// The planner's step-time model: bench/tp_model.h's TP model (compute + ring alpha-beta
// collectives, perfmodel/ring_cost.h) extended to every mesh axis.
//
//   compute  = sum over the role's GEMMs of flops / rate(shape, dtype)      (profile.gemm)
//            + sum over other ops of max(bytes / memory_bandwidth, flops / vector_flops)
//              (fused attention: flops / the attention rate) + op_count * op_overhead_s
//   comm(c)  = fitted cost of (op, group) when the profile has one, else ring alpha-beta over
//              the link the group spans: intra-node when every member shares a node (ranks
//              numbered in mesh order, axes outermost first, gpus_per_node consecutive ranks a
//              node), else inter-node. all_reduce alpha + 2(n-1)/n S/B; all_gather,
//              reduce_scatter, all_to_all alpha + (n-1)/n S/B (S the full buffer); ppermute,
//              broadcast alpha + bytes/B; type conversions (convert, reinterpret, vary) 0.
//   overlap  the trainer's schedule (StepOptions, step_schedule.h), no constant: with
//            overlap on (issue 34's trainer: --overlap=on, --bucket_mb, --fsdp_prefetch,
//            --reshard_after_forward) FSDP parameters are all-gathered per layer in the compute
//            dtype (the role's parameter bytes x compute/param element size), prefetched d layers
//            ahead, gathered again in the backward when resharded, their gradients
//            reduce-scattered per layer in the backward (param dtype), each microstep; DDP /
//            HSDP-replicate gradients reduced in buckets during the last microstep's backward.
//            Each on a communication lane beside the compute lane (step_schedule.h); the first
//            gather and the last bucket cannot hide. A pipeline stage gathers each FSDP unit
//            once per step (compute dtype) and keeps it (models/train/stage_fsdp.h):
//            what stage 0's first forward cannot hide of the gathers and what the last backward
//            cannot of the reduce-scatters is exposed. With overlap off (and every simulated-CPU
//            run without a simulated link) every logged collective blocks. TP, CP, EP, pipeline
//            and norm collectives always block.
//   pipeline the asynchronous timetable (step_schedule.h's AsyncPipelineSeconds): each stage
//            runs its schedule's actions (1F1B, GPipe, interleaved 1F1B with v chunks) as soon
//            as its input has arrived, with per-stage forward / backward times (compute and
//            blocking comm) and the boundary transfer
//            on every hop between ranks. Simulated CPU ranks (cores > 0) run the trainer's
//            lockstep ticks (PipelineSeconds): each tick lasts as long as its slowest stage.
//   shared cores (profile.cores > 0, simulated CPU ranks): world ranks run on `cores` cores, so
//            every rank's compute and collective time is stretched by max(1, world / cores)
//            (a fitted collective, measured with its group's threads alone, by that over
//            max(1, group / cores)). A pipeline's compute is not stretched (a stage in its bubble
//            leaves its core to the others): its step is the timetable's time, but no less than
//            all ranks' compute / cores + the slowest stage's communication. The ranks that
//            compute at once (min(world, cores)) share caches and memory: their non-GEMM ops
//            run at the speeds measured with that many ranks at once (profile.shared_op_rate;
//            HardwareProfile::ForConcurrentRanks).
//
//   absl::StatusOr<StepPrediction> p = PredictStep(roles, mesh, pipeline, profile);
//   p->step_s; p->bubble; p->comm_by_kind["all_gather dp_shard"];
#ifndef SHARDMAP_MODELS_PLANNER_COST_MODEL_H_
#define SHARDMAP_MODELS_PLANNER_COST_MODEL_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/planner/hardware_profile.h"
#include "models/planner/step_schedule.h"
#include "models/planner/step_work.h"

namespace shardmap::planner {

// Axis names and sizes, outermost first (the framework's mesh order).
struct MeshShape {
  std::vector<std::string> axes;
  std::vector<int> sizes;
  int world() const;
  int size(const std::string& axis) const;  // 1 when absent
  std::string ToString() const;             // "dp_shard=4,tp=2" ("single" for no axes)
};

// Whether the group of ranks that differ only along `axes` crosses a node boundary (checked for
// the groups of the first and the last rank).
bool SpansNodes(const MeshShape& mesh, const std::vector<std::string>& axes, int gpus_per_node);

// Seconds of one collective (bytes per rank, as CollectiveWork) over a group of n ranks on `link`.
// InvalidArgument for an unknown op.
absl::StatusOr<double> RingSeconds(const std::string& op, int n, double rank_bytes,
                                   const Link& link);
// The collective's seconds on this mesh and profile (fitted entry, else the ring on its link).
absl::StatusOr<double> CollectiveSeconds(const CollectiveWork& c, const MeshShape& mesh,
                                         const HardwareProfile& profile);

struct PipelineSpec {
  int stages = 1;
  int microbatches = 1;
  std::string schedule = "1f1b";  // "gpipe", "1f1b" or "interleaved_1f1b"
  int virtual_stages = 1;         // model chunks per stage (interleaved_1f1b)
};

// How the trainer runs the step's collectives (issue 34's flags).
struct StepOptions {
  bool overlap = true;             // --overlap: collectives on their own lane
  double bucket_bytes = 25.0 * 1024 * 1024;  // --bucket_mb (DDP's default, 25 MiB)
  int fsdp_prefetch = 1;           // --fsdp_prefetch
  bool reshard_after_forward = true;  // --reshard_after_forward (FSDP2's default)
  int grad_accum = 1;              // microsteps without a pipeline
  // FSDP gathers parameters in the compute dtype: its element size over the parameters'.
  double gather_scale = 1.0;
  // Simulated CPU ranks whose collectives sleep for the link's time (issue 34's simulated-link
  // benchmark) instead of running inline: they overlap even with cores > 0, take no core (no
  // shared-core stretch, no oversubscribed wait).
  bool simulated_link = false;
};

// Per-rank memory with the trainer summary's parts (models/train/train_gpt.cc): parameters
// (FSDP padding included, as the trainer holds them), gradients, AdamW moments, the saved
// activations at most, the FSDP-gathered parameters at most (-1: none) and the whole step's
// peak with its phase.
struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, saved_activations = 0, gathered = -1, peak = 0;
  bool peak_after_backward = false;
};
MemoryBreakdown RoleMemory(const RoleWork& role);
// "parameters 1.2 MiB, gradients ..., step peak 9.8 MiB (after the backward: ...)".
std::string FormatMemory(const MemoryBreakdown& m);

struct StepPrediction {
  double step_s = 0;
  double compute_s = 0;         // the slowest role's compute (a pipeline: its stage's)
  // Its parts, unstretched: GEMMs, the other ops, the per-op overhead.
  double gemm_s = 0, other_s = 0, overhead_s = 0;
  double blocking_comm_s = 0;   // tp / cp / ep / pp / norm / loss collectives on that role
  double overlapped_comm_s = 0; // fsdp + grad collectives before overlap
  double exposed_comm_s = 0;    // the part of those not hidden
  double bubble = 0;            // pipeline idle fraction (0 without one)
  double peak_bytes = 0;        // the largest role's
  MemoryBreakdown memory;       // and its parts
  std::string critical_role;
  // Bytes a rank moves per step by "<op> <axes>" (the largest role's), and their seconds.
  std::map<std::string, double> bytes_by_kind, seconds_by_kind;
};

// This rank's bytes of FSDP-sharded parameters: its forward all-gathers over dp_shard over the
// `passes` times the shape-only step gathers them (once per microstep without a pipeline, once
// per step in a pipeline stage).
double FsdpShardBytes(const RoleWork& role, int passes);

// Time of one role's compute (no sharing stretch), and its parts.
struct ComputeParts {
  double gemm_s = 0, other_s = 0, overhead_s = 0;
  double total() const { return gemm_s + other_s + overhead_s; }
};
absl::StatusOr<ComputeParts> ComputeBreakdown(const RoleWork& role, const HardwareProfile& profile);
absl::StatusOr<double> ComputeSeconds(const RoleWork& role, const HardwareProfile& profile);

// The whole step: one role per distinct program (one without a pipeline, one per stage with one;
// roles[i].pp_stage says which). InvalidArgument when the roles do not match the pipeline.
// InvalidArgument for bad StepOptions (bucket <= 0, prefetch < 1, grad_accum < 1).
absl::StatusOr<StepPrediction> PredictStep(const std::vector<RoleWork>& roles,
                                           const MeshShape& mesh, const PipelineSpec& pipeline,
                                           const HardwareProfile& profile,
                                           const StepOptions& options = StepOptions{});

// Lockstep pipeline time from the timetable (the trainer's RunPipeline on simulated CPU ranks): forward_s[s] / backward_s[s] one microbatch's work
// on stage s, boundary_s the transfer after each tick. Returns the time; *bubble the
// time-weighted idle fraction of stage-ticks.
// stage_share > 0: the stages' ranks share cores (simulated CPU ranks), stage_share = ranks per
// stage / cores. A tick then lasts at least the work of its busy stages spread over the cores
// (sum of their actions x stage_share): the idle stages' cores serve the busy ones, but a tick
// with more busy ranks than cores runs them in turn.
absl::StatusOr<double> PipelineSeconds(const PipelineSpec& spec,
                                       const std::vector<double>& forward_s,
                                       const std::vector<double>& backward_s, double boundary_s,
                                       double* bubble, double stage_share = 0);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_COST_MODEL_H_
