#include "models/planner/plan_cli.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/components/bounded_read.h"
#include "models/model/registry.h"
#include "models/parallel/layers.h"
#include "models/planner/measure_cpu.h"
#include "models/planner/shape_only_source.h"
#include "perfmodel/gpu_profile.h"

namespace shardmap::planner {

namespace {
// A tp_bench profile has one line per measured GEMM shape (hundreds), collectives_bench one JSON
// row per size and collective: the limits refuse a wrong file before it is parsed.
constexpr int64_t kMaxBenchBytes = int64_t{16} << 20;
constexpr int64_t kMaxBenchLines = 100000;

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  absl::StatusOr<std::string> text = ReadBoundedFile(path, kMaxBenchBytes, what);
  if (!text.ok()) return text.status();
  if (absl::Status s = CheckCount(std::count(text->begin(), text->end(), '\n'), kMaxBenchLines,
                                  absl::StrCat(what, " lines"), path);
      !s.ok()) {
    return s;
  }
  return text;
}
}  // namespace

absl::StatusOr<HardwareProfile> ResolveProfile(const PlanCliOptions& cli) {
  if (cli.resolved.has_value()) return *cli.resolved;
  absl::StatusOr<HardwareProfile> p = cli.profile == "measure"
                                          ? MeasureCpuProfile(CpuMeasureOptions{})
                                          : LoadHardwareProfile(cli.profile);
  if (!p.ok()) return p.status();
  if (!cli.tp_bench_profile.empty()) {
    absl::StatusOr<std::string> text = ReadFile(cli.tp_bench_profile, "--tp_bench_profile");
    if (!text.ok()) return text.status();
    absl::StatusOr<perfmodel::GpuProfile> m = perfmodel::ParseGpuProfile(*text);
    if (!m.ok()) return m.status();
    p = FromTpBenchProfile(*m, *std::move(p));
    if (!p.ok()) return p.status();
  }
  if (!cli.collectives_bench.empty()) {
    absl::StatusOr<std::string> text = ReadFile(cli.collectives_bench, "--collectives_bench");
    if (!text.ok()) return text.status();
    p = WithCollectivesBench(*text, *std::move(p));
  }
  return p;
}

absl::Status CheckPlanBounds(const PlanRequest& request, const PlanCliOptions& cli) {
  if (request.gpus > kMaxPlanGpus) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpus ", request.gpus, " is more than ", kMaxPlanGpus,
        ": the planner enumerates and profiles meshes of that many ranks"));
  }
  // The shape flags are bounded before a parameter table of that size is built.
  if (request.args.layers.value_or(0) > kMaxPlanLayers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layers ", *request.args.layers, " is more than ", kMaxPlanLayers,
        ": the shape-only step builds every layer; lower --layers"));
  }
  absl::StatusOr<std::unique_ptr<Model>> model = RequestModel(request);
  if (!model.ok()) return model.status();
  const ModelShape& c = (*model)->shape();
  if (c.layers > kMaxPlanLayers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layers ", c.layers, " is more than ", kMaxPlanLayers,
        ": the shape-only step builds every layer; lower --layers"));
  }
  if (cli.shape_only_on_cpu) {
    // Real CPU tensors: the parameters, gradients and two moments at least.
    const double need = ModelParameters(**model) * DTypeSize(c.dtype) * 4;
    const double host = static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                        static_cast<double>(sysconf(_SC_PAGESIZE));
    if (!(need <= host)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--shape_only_device=cpu runs the shape-only steps on real tensors: this model's %.3g "
          "parameters with their gradients and AdamW moments need %.3g GiB, more than this "
          "machine's %.1f GiB; use --shape_only_device=meta",
          ModelParameters(**model), need / 1073741824.0, host / 1073741824.0));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveAttention(const PlanCliOptions& cli,
                                             const HardwareProfile& hw, int64_t head_dim) {
  std::string want = cli.attention;
  if (want.empty()) {
    // A GPU profile (ranks with a device each): the attention a CUDA run takes there. The
    // shape-only steps run on the meta device, where the materialised scores would be chosen.
    want = hw.cores == 0 && head_dim <= 128 ? "flash" : "materialised";
  }
  if (want != "flash" && want != "materialised") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--attention=", want, ": use flash (the fused kernel) or materialised (einsum scores)"));
  }
  if (want == "flash" && head_dim > 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--attention=flash: head_dim ", head_dim, " (d_model / heads) is more than the 128 this "
        "framework's fused attention kernel takes; use --attention=materialised or more heads"));
  }
  const AttentionPath path = want == "flash" ? AttentionPath::kFused : AttentionPath::kMaterialised;
  setenv("SHARDMAP_ATTENTION", want == "flash" ? "fused" : "materialised", 1);
  if (ResolveAttentionPath(AttentionPath::kAuto, Device::Meta(), head_dim) != path) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--attention=", want, ": this process already runs the other attention path (read once "
        "per process, models/parallel/layers.h); plan in a new process"));
  }
  return want;
}

absl::StatusOr<std::string> PlanText(const PlanRequest& request, const PlanCliOptions& cli,
                                     const std::string& own) {
  if (absl::Status s = CheckPlanBounds(request, cli); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<Model>> model = RequestModel(request);
  if (!model.ok()) return model.status();
  absl::StatusOr<HardwareProfile> hw = ResolveProfile(cli);
  if (!hw.ok()) return hw.status();
  absl::StatusOr<std::string> attention =
      ResolveAttention(cli, *hw, (*model)->shape().head_dim());
  if (!attention.ok()) return attention.status();
  PlanRequest req_attention = request;
  req_attention.attention = *attention;
  const Profiler profiler = ShapeOnlyProfiler(
      cli.shape_only_on_cpu ? Device::Cpu() : Device::Meta(), request.reuse_profiles);
  absl::StatusOr<Plan> plan = PlanGpt(req_attention, *hw, profiler);
  if (!plan.ok()) return plan.status();
  std::string text = FormatPlan(*plan, cli.top, cli.list_refusals);
  if (own.empty()) return text;
  // A row matches the run's mesh whatever recomputation / resharding the planner chose for it.
  auto same = [&own](const Candidate& c) {
    Candidate bare = c;
    bare.recompute = Recompute::kNone;
    bare.reshard_after_forward = true;
    return c.Name() == own || bare.Name() == own;
  };
  for (size_t i = 0; i < plan->rows.size(); ++i) {
    const PlanRow& r = plan->rows[i];
    if (same(r.candidate) && !plan->rows.empty()) {
      absl::StrAppend(&text, absl::StrFormat(
                                 "\nthis run's mesh %s ranks %zu of %zu: predicted %.4g s/step "
                                 "(%.3gx the best, %s)\n",
                                 own, i + 1, plan->rows.size(), r.prediction.step_s,
                                 r.prediction.step_s / plan->rows[0].prediction.step_s,
                                 plan->rows[0].candidate.Name()));
      return text;
    }
  }
  for (const Refusal& r : plan->refused) {
    if (r.candidate == own) {
      absl::StrAppend(&text, "\nthis run's mesh ", own, " was refused: ", r.reason, "\n");
      return text;
    }
  }
  PlanRequest one = req_attention;
  one.only_meshes = {own};
  absl::StatusOr<Plan> mine = PlanGpt(one, *hw, profiler);
  if (!mine.ok()) {
    absl::StrAppend(&text, "\nthis run's mesh ", own, ": ", mine.status().message(), "\n");
  } else if (mine->rows.empty()) {
    absl::StrAppend(&text, "\nthis run's mesh ", own, " does not fit: ",
                    mine->refused.empty() ? std::string("out of memory")
                                          : mine->refused.back().reason,
                    "\n");
  } else {
    const PlanRow& r = mine->rows[0];
    size_t rank = 0;
    while (rank < plan->rows.size() && plan->rows[rank].prediction.step_s < r.prediction.step_s) {
      ++rank;
    }
    absl::StrAppend(&text, absl::StrFormat(
                               "\nthis run's mesh %s (not enumerated): predicted %.4g s/step, "
                               "would rank %zu of %zu\n",
                               own, r.prediction.step_s, rank + 1, plan->rows.size() + 1));
  }
  return text;
}

absl::StatusOr<std::string> PlanForTrainRun(const Model& layout, int64_t batch,
                                            int64_t microbatches, const std::string& schedule,
                                            int virtual_stages, PlanCliOptions cli,
                                            int gpus_per_node) {
  PlanRequest req;
  // The run's model as its registration rebuilds it on any mesh: its args from the metadata a
  // checkpoint of it would carry.
  absl::StatusOr<const ModelSpec*> spec = FindModel(layout.name());
  if (!spec.ok()) return spec.status();
  absl::StatusOr<ModelArgs> args = (*spec)->args_from_metadata(layout.ShapeMetadata());
  if (!args.ok()) {
    return absl::Status(args.status().code(),
                        absl::StrCat("--plan: ", args.status().message()));
  }
  req.model = layout.name();
  req.args = *std::move(args);
  req.args.recompute = layout.shape().recompute;  // the run's own --recompute, as it trains
  req.global_batch = batch;
  req.gpus = layout.mesh().size();
  req.gpus_per_node = gpus_per_node > 0 ? gpus_per_node : req.gpus;
  if (cli.profile.empty()) cli.profile = "measure";
  // Models a CPU trains are small: their shape-only steps may run the real ops on zeros (exact
  // as well, and independent of which ops the meta device covers).
  if (ModelParameters(layout) < 50e6) cli.shape_only_on_cpu = true;
  Candidate own;
  for (int i = 0; i < layout.mesh().num_axes(); ++i) {
    own.mesh.axes.push_back(layout.mesh().axis_names()[i]);
    own.mesh.sizes.push_back(layout.mesh().axis_size(i));
  }
  own.sp = layout.tp().sp;
  own.pipeline = {layout.pp_ways(), static_cast<int>(microbatches), schedule, virtual_stages};
  absl::StatusOr<std::string> text = PlanText(req, cli, own.Name());
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--plan: ", text.status().message()));
  }
  return text;
}

}  // namespace shardmap::planner
