// The parallelism planner: which mix of FSDP, TP(+SP), PP, CP and EP to run for any registered
// model (models/model/registry.h: gpt2, llama3, ...) on N GPUs. It enumerates the meshes that
// divide the problem, profiles each (one shape-only step of the model's own per-device program
// per rank role, models/train/gpt_shape_only.h), predicts its step time with
// planner/cost_model.h on a hardware profile, and ranks them; every mesh it does not rank is
// listed with the reason.
//
//   PlanRequest req;
//   req.model = "llama3";
//   req.args = ModelArgs{.preset = "llama3_8b", .dtype = "bf16"};
//   req.global_batch = 512;
//   req.gpus = 64;
//   absl::StatusOr<HardwareProfile> hw = LoadHardwareProfile("h100_node");
//   absl::StatusOr<Plan> plan = PlanGpt(req, *hw, ShapeOnlyProfiler());
//   std::cout << FormatPlan(*plan, /*top=*/15);
//
// Enumeration: every factorisation gpus = pp x (data) x ep x cp x tp with
//   data    dp (DDP), dp_shard (FSDP) or dp_replicate x dp_shard (HSDP, each > 1);
//   tp      with and without SP, inside a node unless tp_across_nodes;
//   pp      each schedule (1f1b, gpipe, interleaved_1f1b with each virtual-stage count that
//           divides the layers per stage), microbatches = pp x {1, 2, 4, 8};
//   cp, ep  (ep only with MoE);
// and for each such mesh the step's settings that need no new profile: activation
// recomputation (none / selective / full, planner/recompute.h) and, under FSDP,
// reshard_after_forward (true / false); the fastest variant that fits is the mesh's row.
// Gradient accumulation (without a pipeline) takes the fewest microsteps, any divisor of the
// local batch, whose activations fit.
// then the framework's own checks (the model's Create through CreateModel, CheckTrainOptions: e.g. no cp or MoE
// under a pipeline) and the batch's divisibility refuse what cannot run, and a lower bound on
// memory (parameters, gradients and AdamW state perfectly sharded) refuses what never fits,
// before anything is profiled.
#ifndef SHARDMAP_MODELS_PLANNER_PLAN_H_
#define SHARDMAP_MODELS_PLANNER_PLAN_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model/model.h"
#include "models/model/registry.h"
#include "models/planner/cost_model.h"
#include "models/planner/hardware_profile.h"
#include "models/planner/recompute.h"
#include "models/planner/step_work.h"
#include "models/train/trainer.h"

namespace shardmap::planner {

struct PlanRequest {
  // The model: its registered name and the shape flags / preset CreateModel takes.
  std::string model = "gpt2";
  ModelArgs args;
  int64_t global_batch = 8;  // sequences per optimizer step
  int gpus = 1;
  int gpus_per_node = 0;     // 0: the profile's
  bool tp_across_nodes = false;
  std::vector<std::string> schedules = {"1f1b", "gpipe", "interleaved_1f1b"};
  std::vector<int> virtual_stages = {2, 4};  // interleaved_1f1b's chunks per stage to try
  // The data-parallel forms to enumerate: "dp" (DDP), "fsdp" (dp_shard), "hsdp"
  // (dp_replicate x dp_shard).
  std::vector<std::string> data_parallel = {"dp", "fsdp", "hsdp"};
  std::vector<int> microbatch_factors = {1, 2, 4, 8};  // microbatches = pp x factor
  bool sp_variants = true;  // with tp: both with and without SP (false: SP only)
  bool no_sp = false;       // with tp: never SP (what frameworks without it could run)
  int max_pp = 0, max_cp = 0;  // largest pp / cp to enumerate (0: any)   // with tp: both with and without SP
  // Only these meshes (empty: enumerate), each "AXES [+sp] [SCHEDULE/mMICROBATCHES] [gaN]",
  // the parts separated by spaces or ':', e.g. "pp=2,dp_shard=4 1f1b/m8", "dp=2,tp=2:+sp".
  std::vector<std::string> only_meshes;
  // How the trainer runs its collectives (cost_model.h's StepOptions; reshard_after_forward and
  // grad_accum there are chosen per mesh). overlap: issue 34's overlapped trainer.
  StepOptions step;
  // The variants tried per mesh.
  std::vector<Recompute> recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  std::vector<bool> reshard_after_forward = {true, false};
  RecomputeEstimator recompute_estimator = KorthikantiRecompute();
  // A recomputing variant's memory from a shape-only step with the trainer's own --recompute
  // (its work stays the estimator's: the same GEMM FLOPs, models/planner/
  // recompute_vs_trainer_test.cc), profiled only for a mesh on which a variant without
  // recomputation does not fit (where one fits it is faster than the same schedule
  // recomputing). False: the estimator's memory (Korthikanti et al.'s accounting, which prices
  // this framework's kept activations 23-45% low).
  bool measure_recompute = true;
  // The shape-only step (the reference schedule: TrainOptions::overlap off, see
  // CandidateTrainOptions) keeps every FSDP-gathered parameter alive from its forward use to the
  // backward: with overlap on, the planner replaces that by what the overlapped trainer holds
  // (prefetch + 1 layers resharding, or the whole model in the compute dtype without). False
  // for a profile of the overlapped schedule itself.
  bool shape_only_keeps_gathered = true;
  // 1F1B pipelines and gradient accumulation of many microbatches priced from two short
  // shape-only steps of the same rows per microbatch (planner/profile_reuse.h: the counts are
  // affine in the microbatches), and (plan_cli's profiler, ShapeOnlyProfiler's share_stages) a
  // pipeline's middle stages from three of them; false: every candidate's own step, every stage.
  bool reuse_profiles = true;
  // The attention the shape-only steps run ("flash" or "materialised"; "" : not said), for the
  // header's assumptions and for refusing selective recomputation under flash with a true
  // reason. plan_cli's PlanText sets it (and the path itself) from --attention.
  std::string attention;
  // Told after each shape-only profile (done, total); for progress lines.
  std::function<void(int done, int total)> progress;
  // Told when a mesh becomes the fastest that fits so far (its name and predicted step).
  std::function<void(const std::string& mesh, double step_s)> on_best;
  // Seconds the search may take (0: no limit). Past it the meshes not yet priced are left out,
  // the plan says so (Plan::stopped) and ranks what it priced; one mesh is always priced, and a
  // mesh being priced is finished (the limit is read between meshes).
  double time_limit_s = 0;
  // The clock the limit is read from, in seconds (empty: a steady clock); tests give their own.
  std::function<double()> clock;
};

// One mesh and how it runs.
struct Candidate {
  MeshShape mesh;
  bool sp = false;
  PipelineSpec pipeline;
  // Gradient accumulation without a pipeline (TrainOptions::grad_accum): the local batch in
  // this many microsteps. PlanGpt raises it (any divisor of the local batch) until the
  // activations fit.
  int grad_accum = 1;
  Recompute recompute = Recompute::kNone;
  bool reshard_after_forward = true;  // FSDP meshes only (shown as "keep" when false)
  // Given by --mesh: the planner tries only this setting.
  bool fixed_recompute = false, fixed_reshard = false, fixed_grad_accum = false;
  // "pp=2,dp_shard=4,tp=8 +sp 1f1b/m8", "dp_shard=64 ga4 rc=full keep",
  // "pp=4,tp=8 interleaved_1f1b/m16/v2"
  std::string Name() const;
};

struct PlanRow {
  Candidate candidate;
  StepPrediction prediction;
  double tokens_per_s = 0;
  double mfu = 0;            // model FLOPs / (step x gpus x peak of the compute dtype)
  bool fits = false;
  std::vector<RoleWork> roles;  // the priced roles (recomputation applied)
};

struct Refusal {
  std::string candidate;
  std::string reason;
};

struct Plan {
  std::vector<PlanRow> rows;        // fitting meshes, fastest first
  std::vector<PlanRow> unfit;       // priced meshes that do not fit, smallest peak first
  std::vector<Refusal> refused;     // everything else, with the reason
  int candidates = 0, profiled = 0;
  int extrapolated = 0;             // profiles extrapolated from two shorter ones
  double profile_seconds = 0;       // wall time spent in the shape-only runs
  // The search reached PlanRequest::time_limit_s with `unpriced` meshes left out.
  bool stopped = false;
  int unpriced = 0;
  double time_limit_s = 0;
  double model_flops_per_step = 0;
  double parameters = 0;
  std::string profile_name;
  double usable_memory = 0;
  int gpus = 0, gpus_per_node = 0;
  int64_t tokens_per_step = 0;
  std::string dtype;                // "bf16 compute, f32 parameters"
  std::vector<std::string> assumptions;  // stated in the header
};

using Profiler =
    std::function<absl::StatusOr<std::vector<RoleWork>>(const Candidate&, const PlanRequest&)>;

// The layout a candidate trains (its mesh, sp) and the trainer options of its step (batch,
// pipeline schedule and microbatches, grad_accum): what the checks and the profiler both use.
absl::StatusOr<std::unique_ptr<Model>> CandidateLayout(const Candidate& c,
                                                       const PlanRequest& req);

// The request's model on one device: its shape, parameter table and FLOPs per token. An unknown
// name is the registry's NotFound (listing the names); the model's own errors (a bad preset or
// shape) come prefixed with "--model=NAME [--preset=PRESET]: ".
absl::StatusOr<std::unique_ptr<Model>> RequestModel(const PlanRequest& req);
TrainOptions CandidateTrainOptions(const Candidate& c, const PlanRequest& req);

// The candidates the request enumerates; what fails the cheap checks goes to *refused.
// InvalidArgument for a request that cannot be planned at all (gpus < 1, gpus not whole nodes,
// batch < 1, a malformed only_meshes entry).
absl::StatusOr<std::vector<Candidate>> EnumerateCandidates(const PlanRequest& req,
                                                           const HardwareProfile& hw,
                                                           std::vector<Refusal>* refused);

// Parameters of the model (global: the elements of its parameter table), and the FLOPs of one
// step: the model's FlopsPerToken (e.g. 6 N + 12 L d seq, N without GPT-2's wpe) x batch x seq.
double ModelParameters(const Model& model);
double ModelFlopsPerStep(const Model& model, int64_t batch);

// Plans: profiles each candidate, predicts it, ranks. FailedPrecondition when nothing runs
// (every mesh refused). When nothing fits, the plan has no rows and its `unfit` rows carry the
// prices (FormatPlan says so, naming the smallest memory need).
absl::StatusOr<Plan> PlanGpt(const PlanRequest& req, const HardwareProfile& hw,
                             const Profiler& profiler);

// The step time of one configuration on a simulated link (issue 34's benchmark: CPU ranks whose
// collectives complete after alpha + bytes / bandwidth, sleeping): `mesh` in --mesh's form (its
// gaN is kept), compute from `cpu` (a measured CPU profile: MeasureCpuProfile), every collective
// on `link`, overlapped per `options` (overlap, bucket_bytes, fsdp_prefetch,
// reshard_after_forward). E.g.
//   PredictOnSimulatedLink(req, "dp_replicate=2,dp_shard=2", *cpu, {50e-6, 1e9}, {},
//                          ShapeOnlyProfiler(Device::Cpu()))->step_s;
// InvalidArgument for a bad link, the mesh's refusal otherwise.
absl::StatusOr<StepPrediction> PredictOnSimulatedLink(const PlanRequest& request,
                                                      const std::string& mesh,
                                                      const HardwareProfile& cpu, const Link& link,
                                                      const StepOptions& options,
                                                      const Profiler& profiler);

// "peak 74.63 GiB per GPU > 74.60 GiB usable": one decimal, more while the two would print
// alike.
std::string PeakOverUsable(double peak_bytes, double usable_bytes);

// The assumptions a plan's header states (overlap, pipeline execution, recomputation's source).
std::vector<std::string> PlanAssumptions(const PlanRequest& req, const HardwareProfile& hw,
                                         DType compute);
// The same with the request's model's compute dtype (its own checks' error otherwise).
absl::StatusOr<std::vector<std::string>> PlanAssumptions(const PlanRequest& req,
                                                         const HardwareProfile& hw);

// The ranked table (top rows; <= 0: all), the meshes that do not fit with their prices (OOM), the collectives of the best rows, and the refusals.
std::string FormatPlan(const Plan& plan, int top, bool list_refusals = true);

// "mesh=..." parse for only_meshes: a Candidate with sp / schedule / microbatches / virtual
// stages. Without a pipeline, a candidate that does not fit is profiled again with gradient
// accumulation (the fewest microsteps, any divisor of the local batch, that the activations'
// estimate says fit; then checked).
absl::StatusOr<Candidate> ParseCandidate(const std::string& mesh, bool sp,
                                         const std::string& schedule, int microbatches,
                                         int virtual_stages = 1);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_PLAN_H_
