#include "models/train/run_plan.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "models/gpt/gpt_checkpoint.h"

namespace shardmap {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

bool Finite(double x) { return std::isfinite(x); }

// The batch's divisibility and sequence parallelism's split: plan's microbatches and accum set.
absl::Status PlanRows(const Model& layout, const TrainOptions& options, RunPlan& plan) {
  const ModelShape& c = layout.shape();
  const Mesh& mesh = layout.mesh();
  const int ways = layout.batch_ways();
  const int64_t m = plan.microbatches;
  const int64_t accum = plan.accum;
  if (options.batch < 1 || options.batch % (m * accum * ways) != 0) {
    return Invalid(absl::StrCat(
        "batch ", options.batch, " is not divisible by ",
        m > 1 ? absl::StrCat("microbatches ", m, " x the ")
        : accum > 1 ? absl::StrCat("grad_accum ", accum, " x the ")
                    : std::string("the "),
        ways, " data-parallel ways of mesh ", mesh.ShortString(), "; pick batch a multiple of ",
        m * accum * ways));
  }
  plan.local_rows = options.batch / m / accum / ways * c.seq / layout.cp_ways();
  plan.boundary_rows = plan.local_rows;
  if (layout.tp().sp) {
    const int tp = layout.dims().tp_ways();
    if (plan.local_rows % tp != 0) {
      return Invalid(absl::StrCat("sequence parallelism splits each rank's ", plan.local_rows,
                                  " tokens", m > 1 ? " of a microbatch" : "", " over tp=", tp,
                                  ": make ", m > 1 ? "batch/(microbatches*dp)" : "batch/dp",
                                  " * seq/cp divisible by tp"));
    }
    plan.boundary_rows = plan.local_rows / tp;
  }
  return absl::OkStatus();
}

// Selective recomputation recomputes the attention scores; the fused attention kernel (GPU, or
// SHARDMAP_ATTENTION=fused) never keeps them, so there it would silently do nothing.
absl::Status CheckRecompute(const Model& layout, const TrainOptions& o) {
  const RecomputeMode mode = o.recompute.value_or(layout.shape().recompute);
  if (mode != RecomputeMode::kSelective || !layout.cp_axis().empty()) return absl::OkStatus();
  Device device = Device::Cpu();
  if (o.runtime.comm != nullptr && o.runtime.comm->memory_space().device) {
    device = Device::Cuda(o.runtime.comm->memory_space().device_index);
  } else if (!o.runtime.placement.is_cpu()) {
    absl::StatusOr<std::vector<Device>> devices =
        ResolvePlacement(o.runtime.placement, layout.mesh().size());
    if (devices.ok() && !devices->empty()) device = devices->front();
  }
  if (ResolveAttentionPath(AttentionPath::kAuto, device, layout.shape().head_dim()) !=
      AttentionPath::kFused) {
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat(
      "--recompute=selective with the fused attention kernel (on ", device.ToString(),
      ", head_dim ", layout.shape().head_dim(), "): selective recomputation recomputes the "
      "attention scores and softmax, which the fused kernel never keeps, so there is nothing "
      "to recompute; use --recompute=full, or --recompute=none, or SHARDMAP_ATTENTION="
      "materialised to use the materialised attention"));
}

// FSDP that shards nothing is plain data parallelism with extra collectives: refused. Sizes
// dp_shard does not divide are padded (ParamInfo::fsdp_pad), so this is a model whose every
// parameter tp or the experts already split on all its dims.
absl::Status CheckFsdpShards(const Model& layout) {
  const int ai = layout.mesh().AxisIndex(axis::kDpShard);
  const int shard = ai < 0 ? 1 : layout.mesh().axis_size(ai);
  if (shard <= 1) return absl::OkStatus();
  for (const ParamInfo& p : layout.params()) {
    if (p.fsdp_dim >= 0) return absl::OkStatus();
  }
  return Invalid(absl::StrCat(
      "dp_shard=", shard, " shards no parameter: every dimension of every parameter is already "
      "split by tp or the experts, so every rank would hold the same shards; use dp=", shard));
}

// Interleaved 1F1B's settings: virtual_stages >= 1, > 1 only with interleaved_1f1b (which needs
// it > 1), pp > 1, the microbatches in groups of pp, and the layers in pp * v virtual stages.
absl::Status CheckVirtualStages(const Model& layout, const TrainOptions& o) {
  const int v = o.pipeline.virtual_stages;
  const std::string& schedule = o.pipeline.schedule;
  if (v < 1) {
    return Invalid(absl::StrCat("--virtual_stages ", v, " must be >= 1 (model chunks per "
                                "pipeline stage; 1: no interleaving)"));
  }
  const bool interleaved = schedule == "interleaved_1f1b";
  if (v > 1 && !interleaved) {
    return Invalid(absl::StrCat(
        "--virtual_stages ", v, " with --schedule=", schedule, ": only the interleaved schedule "
        "runs several model chunks per stage; use --schedule=interleaved_1f1b or "
        "--virtual_stages=1"));
  }
  if (!interleaved) return absl::OkStatus();
  if (v == 1) {
    return Invalid("--schedule=interleaved_1f1b needs --virtual_stages >= 2 (model chunks per "
                   "stage; with one chunk it is --schedule=1f1b)");
  }
  const int p = layout.pp_ways();
  if (p < 2) {
    return Invalid(absl::StrCat(
        "--schedule=interleaved_1f1b on mesh ", layout.mesh().ShortString(), " without pp: "
        "interleaving cuts each pipeline stage into chunks; add pp >= 2 to the mesh or use "
        "--schedule=1f1b"));
  }
  const int64_t m = o.pipeline.microbatches * o.grad_accum;
  if (m % p != 0) {
    return Invalid(absl::StrCat(
        "--schedule=interleaved_1f1b runs the microbatches in groups of pp=", p, ": ", m,
        " microbatches", o.grad_accum > 1 ? " (--microbatches x --grad_accum)" : "",
        " is not a multiple of ", p, "; use --microbatches=", p * ((m + p - 1) / p),
        o.grad_accum > 1 ? " with --grad_accum=1, or another multiple" : " or another multiple"));
  }
  const int64_t layers = layout.shape().layers, vs = int64_t{p} * v;
  const std::vector<int64_t>& sizes = o.pipeline.stage_layers;
  if (!sizes.empty() && static_cast<int64_t>(sizes.size()) != vs) {
    return Invalid(absl::StrCat(
        "--stage_layers gives ", sizes.size(), " sizes but interleaving needs one per virtual "
        "stage: pp=", p, " x --virtual_stages=", v, " = ", vs, " sizes in virtual-stage order "
        "(chunk c of stage s is virtual stage c*", p, "+s)"));
  }
  if (sizes.empty() && layers < vs) {
    return Invalid(absl::StrCat(layers, " layers cannot fill pp=", p, " x --virtual_stages=", v,
                                " = ", vs, " virtual stages (each needs a block); lower "
                                "--virtual_stages"));
  }
  if (sizes.empty() && layers % vs != 0) {
    return Invalid(absl::StrCat(
        layers, " layers do not split evenly into pp=", p, " x --virtual_stages=", v, " = ", vs,
        " virtual stages; pick --virtual_stages so that pp x virtual_stages divides ", layers,
        ", or give --stage_layers with ", vs, " sizes (virtual-stage order)"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t StagePlan::StageLayers(int s) const {
  int64_t n = 0;
  for (int c = 0; c < virtual_stages; ++c) n += layers[c * stages() + s];
  return n;
}

StagePlan PlanStages(const Model& layout, const std::vector<int64_t>& sizes,
                     int virtual_stages) {
  const int v = virtual_stages, p = static_cast<int>(sizes.size()) / v;
  StagePlan plan;
  plan.virtual_stages = v;
  plan.layers = sizes;
  plan.owned.resize(p);
  plan.owned_chunk.resize(p);
  int64_t first = 0;
  std::vector<int> vs_of_layer;
  for (int vs = 0; vs < p * v; ++vs) {
    plan.first_layer.push_back(first);
    for (int64_t i = 0; i < sizes[vs]; ++i) vs_of_layer.push_back(vs);
    first += sizes[vs];
  }
  const int last = p * v - 1;
  const std::vector<ParamInfo>& params = layout.params();
  plan.owner.assign(params.size(), -1);
  for (size_t k = 0; k < params.size(); ++k) {
    const ModelUnit& unit = params[k].unit;
    std::vector<int> vss;  // the virtual stages holding it
    if (unit.kind == ModelUnit::kEmbed) {
      vss = {0};
      if (params[k].tied_to_head && p > 1) vss.push_back(last);  // the head's copy
    } else if (unit.kind == ModelUnit::kBlock) {
      vss = {vs_of_layer[unit.block]};
    } else {
      vss = {last};  // the head
    }
    plan.owner[k] = vss[0] % p;
    for (int vs : vss) {
      plan.owned[vs % p].push_back(static_cast<int>(k));
      plan.owned_chunk[vs % p].push_back(vs / p);
    }
  }
  return plan;
}

absl::Status CheckTrainOptions(const Model& layout, const TrainOptions& o) {
  const Mesh& mesh = layout.mesh();
  const AdamWOptions& a = o.optimizer.adamw;
  if (o.steps < 1) {
    return Invalid(absl::StrCat("steps (--steps) ", o.steps,
                                " must be >= 1 (the total number of optimizer steps)"));
  }
  if (!Finite(a.lr) || a.lr < 0) {
    return Invalid(absl::StrCat("learning rate (--lr) ", a.lr, " must be finite and >= 0 (e.g. 1e-3)"));
  }
  if (!Finite(a.beta1) || a.beta1 < 0 || a.beta1 >= 1 || !Finite(a.beta2) || a.beta2 < 0 ||
      a.beta2 >= 1) {
    return Invalid(absl::StrCat("AdamW betas (--beta1, --beta2) = (", a.beta1, ", ", a.beta2,
                                ") must lie in [0, 1) (e.g. 0.9 and 0.95)"));
  }
  if (!Finite(a.eps) || a.eps <= 0) {
    return Invalid(absl::StrCat("AdamW eps (--eps) ", a.eps, " must be finite and > 0 (e.g. 1e-8)"));
  }
  if (!Finite(a.weight_decay) || a.weight_decay < 0) {
    return Invalid(absl::StrCat("weight decay (--weight_decay) ", a.weight_decay,
                                " must be finite and >= 0 (e.g. 0.1)"));
  }
  if (std::isnan(o.optimizer.clip) || std::isinf(o.optimizer.clip)) {
    return Invalid(absl::StrCat("clip (--clip) ", o.optimizer.clip, " must be finite (<= 0 turns clipping off)"));
  }
  if (o.overlap.bucket_bytes <= 0) {
    return Invalid(absl::StrCat("the gradient bucket size (--bucket_mb) is ", o.overlap.bucket_bytes,
                                " bytes; it must be positive (DDP's default is 25 MiB)"));
  }
  if (o.overlap.fsdp_prefetch < 1) {
    return Invalid(absl::StrCat("the FSDP prefetch depth (--fsdp_prefetch) is ", o.overlap.fsdp_prefetch,
                                "; it must be at least 1 (the next unit's all-gather runs beside "
                                "this one's compute); --overlap=off gathers at use"));
  }
  if (!o.checkpoint.init_path.empty() && !o.checkpoint.resume_path.empty()) {
    return Invalid(absl::StrCat("both --init ('", o.checkpoint.init_path, "') and --resume ('", o.checkpoint.resume_path,
                                "') are given: --resume continues a run (parameters, moments, "
                                "step), --init starts one from weights; give one"));
  }
  if (o.pipeline.microbatches < 1) {
    return Invalid(absl::StrCat("--microbatches ", o.pipeline.microbatches, " must be >= 1"));
  }
  if (o.grad_accum < 1) {
    return Invalid(absl::StrCat("--grad_accum ", o.grad_accum, " must be >= 1"));
  }
  if (o.eval.every < 0 || o.eval.steps < 1) {
    return Invalid(absl::StrCat("--eval_every ", o.eval.every, " must be >= 0 and --eval_steps ",
                                o.eval.steps, " >= 1"));
  }
  if (o.eval.every > 0) {
    if (absl::Status s = CheckTokens(layout.shape(), o.eval.tokens); !s.ok()) {
      return Invalid(absl::StrCat("evaluation data (--eval_every ", o.eval.every,
                                  "): ", s.message(),
                                  "; give --val_fraction or --val_data with enough tokens"));
    }
  }
  if (o.checkpoint.save_every < 0 || (o.checkpoint.save_every > 0 && !o.checkpoint.on_save)) {
    return Invalid(absl::StrCat("--save_every ", o.checkpoint.save_every,
                                " must be >= 0 and needs a place to save (on_save)"));
  }
  if (o.hooks.only_rank != -1 && (!o.hooks.spmd_runner || o.hooks.only_rank < 0 || o.hooks.only_rank >= mesh.size())) {
    return Invalid(absl::StrCat("only_rank ", o.hooks.only_rank, " needs an spmd_runner and a rank of "
                                "mesh ", mesh.ShortString(), " (0 to ", mesh.size() - 1,
                                "), or -1 for every rank"));
  }
  if (o.hooks.spmd_runner && o.runtime.comm != nullptr) {
    return Invalid("an spmd_runner and a process communicator (comm) are two ways of running "
                   "the ranks; give one");
  }
  if (!o.runtime.placement.is_cpu()) {
    if (o.runtime.comm != nullptr) {
      return Invalid(absl::StrCat("placement ", o.runtime.placement.ToString(),
                                  " with a process communicator: the ranks run where the "
                                  "communicator's memory is (--backend=nccl: its GPU); leave "
                                  "the placement at cpu"));
    }
    absl::StatusOr<std::vector<Device>> devices = ResolvePlacement(o.runtime.placement, mesh.size());
    if (!devices.ok()) return devices.status();
  }
  if (absl::Status s = CheckRecompute(layout, o); !s.ok()) return s;
  if (absl::Status s = CheckVirtualStages(layout, o); !s.ok()) return s;
  const bool pipelined = layout.pp_ways() > 1 || o.pipeline.microbatches > 1;
  if (!pipelined) return absl::OkStatus();
  // What the pipeline strategy cannot do, refused here and nowhere else.
  if (!layout.cp_axis().empty()) {
    return Invalid(absl::StrCat(
        "mesh ", mesh.ShortString(), " with ",
        layout.pp_ways() > 1 ? absl::StrCat("pp=", layout.pp_ways())
                             : absl::StrCat(o.pipeline.microbatches, " microbatches"),
        ": the pipeline strategy does not support cp (pipeline (pp) with context parallelism "
        "(cp) is not supported); drop cp, or pp and --microbatches"));
  }
  if (layout.shape().moe.on()) {
    return Invalid(absl::StrCat("mesh ", mesh.ShortString(),
                                ": the pipeline strategy does not support MoE models yet (their "
                                "load-balancing loss spans stages); drop --experts or pp"));
  }
  return absl::OkStatus();
}

SpmdType RunPlan::ParamType(const Mesh& mesh, const ParamInfo& p) const {
  SpmdType t = p.spec.InputType(mesh);
  if (pp_index >= 0) t[pp_index] = AxisType::V();
  return t;
}

SpmdType RunPlan::RowType(const Model& layout) const {
  SpmdType t = layout.RowSpec(false).InputType(layout.mesh());
  if (pp_index >= 0) t[pp_index] = AxisType::V();
  return t;
}

absl::StatusOr<RunPlan> PlanRun(const Model& layout, const TrainOptions& options) {
  if (absl::Status s = CheckTrainOptions(layout, options); !s.ok()) return s;
  if (absl::Status s = CheckFsdpShards(layout); !s.ok()) return s;
  const ModelShape& c = layout.shape();
  RunPlan plan;
  plan.pipelined = layout.pp_ways() > 1 || options.pipeline.microbatches > 1;
  plan.stages = plan.pipelined ? layout.pp_ways() : 1;
  // Under a pipeline grad_accum multiplies the microbatches; else it is the one program's
  // microsteps.
  plan.microbatches = options.pipeline.microbatches * (plan.pipelined ? options.grad_accum : 1);
  plan.accum = plan.pipelined ? 1 : options.grad_accum;
  plan.global_tokens = options.batch * c.seq;
  plan.pp_index = plan.pipelined ? layout.mesh().AxisIndex(axis::kPp) : -1;
  if (absl::Status s = PlanRows(layout, options, plan); !s.ok()) return s;
  const int v = plan.pipelined ? options.pipeline.virtual_stages : 1;
  absl::StatusOr<std::vector<int64_t>> sizes =
      plan.pipelined ? SplitLayers(c.layers, plan.stages * v, options.pipeline.stage_layers)
                     : absl::StatusOr<std::vector<int64_t>>(std::vector<int64_t>{c.layers});
  if (!sizes.ok()) return sizes.status();
  if (plan.pipelined) {
    absl::StatusOr<Schedule> schedule = ParseSchedule(options.pipeline.schedule);
    if (!schedule.ok()) return schedule.status();
    absl::StatusOr<Timetable> tt =
        MakeTimetable(*schedule, plan.stages, static_cast<int>(plan.microbatches), v);
    if (!tt.ok()) return tt.status();
    plan.timetable = std::make_shared<const Timetable>(*std::move(tt));
  } else if (!options.pipeline.stage_layers.empty()) {
    return Invalid("stage_layers is a pipeline (pp > 1) setting; drop it or add pp");
  }
  plan.stage_plan = PlanStages(layout, *sizes, v);
  if (!options.checkpoint.save_path.empty()) {
    if (absl::Status s = CheckSavePath(options.checkpoint.save_path); !s.ok()) return s;
  }
  return plan;
}

}  // namespace shardmap
