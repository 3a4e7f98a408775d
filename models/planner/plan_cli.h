// What `plan` (alias plan_gpt) and `train --plan` share: resolving the hardware profile from the command
// line's choices, and the plan's text with a given run's own mesh placed in the ranking.
//
//   PlanCliOptions cli{.profile = "h100_node", .top = 15};
//   absl::StatusOr<std::string> text = PlanText(request, cli, /*own=*/"dp_shard=8,tp=8 +sp");
#ifndef SHARDMAP_MODELS_PLANNER_PLAN_CLI_H_
#define SHARDMAP_MODELS_PLANNER_PLAN_CLI_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "models/planner/hardware_profile.h"
#include "models/planner/plan.h"

namespace shardmap::planner {

struct PlanCliOptions {
  // A shipped profile's name, a profile file, or "measure" (this CPU, now: simulated ranks).
  std::string profile = "h100_node";
  std::string tp_bench_profile;    // tp_bench --profile_out file: GEMM rates and the intra link
  std::string collectives_bench;   // collectives_bench --benchmark_format=json output
  bool shape_only_on_cpu = false; // run the shape-only steps on CPU tensors (small models)
  // The attention the shape-only steps run and the plan prices: "flash" (the fused kernel: no
  // [b, heads, t, t] scores kept; this framework's takes head_dim <= 128), "materialised" (the
  // einsum scores, as Megatron-LM ran in 2021), or "" (the profile's device: flash on a GPU
  // profile where head_dim <= 128, else materialised). The SHARDMAP_ATTENTION environment
  // variable does not decide it: PlanText sets it from this.
  std::string attention;
  int top = 20;
  bool list_refusals = true;
  // Set: the profile already resolved (--print_profile wrote it): used as is, nothing re-read.
  std::optional<HardwareProfile> resolved;
};

absl::StatusOr<HardwareProfile> ResolveProfile(const PlanCliOptions& cli);

// What a plan may ask for, refused at once with the fix (PlanText checks it first): at most
// kMaxPlanGpus ranks and kMaxPlanLayers layers (the search and the shape-only model grow with
// them), and with shape_only_on_cpu a model whose parameters and AdamW state fit this machine.
inline constexpr int kMaxPlanGpus = 1 << 16;
inline constexpr int64_t kMaxPlanLayers = 1 << 14;
absl::Status CheckPlanBounds(const PlanRequest& request, const PlanCliOptions& cli);

// The attention path ("flash" or "materialised") cli.attention asks for on profile hw, set for
// this process's shape-only steps (models/parallel/layers.h reads it once per process).
// InvalidArgument for an unknown name or flash with head_dim > 128; FailedPrecondition when
// this process already runs the other path.
absl::StatusOr<std::string> ResolveAttention(const PlanCliOptions& cli,
                                             const HardwareProfile& hw, int64_t head_dim);

// The plan (FormatPlan) and, when `own` names a candidate (Candidate::Name's form, e.g.
// "pp=2,dp=2 1f1b/m4"), where it ranks or why it was refused. The shape-only steps take
// cli.attention (ResolveAttention). A mesh the enumeration did not list is profiled on its own.
absl::StatusOr<std::string> PlanText(const PlanRequest& request, const PlanCliOptions& cli,
                                     const std::string& own = "");

// `train --plan`: the plan for a training run's own model (any registered one: its name and the
// args its ShapeMetadata describes), batch and world size (every mesh of layout.mesh().size()
// ranks, gpus_per_node 0: all of them on one node), with the run's mesh placed in it.
// cli.profile "" means "measure" (simulated CPU ranks).
absl::StatusOr<std::string> PlanForTrainRun(const Model& layout, int64_t batch,
                                            int64_t microbatches, const std::string& schedule,
                                            int virtual_stages, PlanCliOptions cli,
                                            int gpus_per_node = 0);

}  // namespace shardmap::planner

#endif  // SHARDMAP_MODELS_PLANNER_PLAN_CLI_H_
