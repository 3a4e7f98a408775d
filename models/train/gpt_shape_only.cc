#include "models/train/gpt_shape_only.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "models/parallel/pipeline.h"
#include "shardmap/rank_context.h"
#include "shardmap/shape_only.h"
#include "tensor/memory_tracker.h"
#include "tensor/op_counter.h"

namespace shardmap {
namespace {

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// What a shape-only step cannot do: read or write files, evaluate, call back, run elsewhere.
absl::Status CheckProfileOptions(const TrainOptions& o) {
  auto refuse = [](const char* what) {
    return Invalid(absl::StrCat("shape-only profile: ", what,
                                " is outside one optimizer step (or needs data); drop it"));
  };
  if (!o.checkpoint.init_path.empty()) return refuse("init_path (--init)");
  if (!o.checkpoint.resume_path.empty()) return refuse("resume_path (--resume)");
  if (!o.checkpoint.save_path.empty()) return refuse("save_path (--save)");
  if (o.checkpoint.save_every > 0 || o.checkpoint.on_save) return refuse("periodic checkpoints (--save_every)");
  if (o.eval.every > 0) return refuse("evaluation (--eval_every)");
  if (o.tracing.keep_events || o.tracing.writer != nullptr) return refuse("a trace (--trace)");
  if (o.tracing.types != nullptr) return refuse("a type trace (--print_types)");
  if (o.hooks.on_step) return refuse("an on_step callback");
  if (o.hooks.on_phase) return refuse("an on_phase callback");
  if (o.runtime.comm != nullptr) return refuse("a process communicator (--backend)");
  if (o.hooks.spmd_runner || o.hooks.only_rank != -1) return refuse("an spmd_runner / only_rank");
  if (!o.runtime.placement.is_cpu()) {
    return Invalid(absl::StrCat("shape-only profile: placement ", o.runtime.placement.ToString(),
                                ": the profile runs on the meta device; leave it at cpu"));
  }
  return absl::OkStatus();
}

// The per-rank program counters of one shape-only step, filled through TrainOptions' hooks.
struct Capture {
  RankContext* ctx = nullptr;
  MemoryTracker* mem = nullptr;
  OpCounter* ops = nullptr;
  size_t ops_at_step = 0, ops_at_optimizer = 0, ops_at_end = 0;
  size_t log_at_optimizer = 0;
  int64_t peak = 0;
  bool ended = false;
};

void AddOps(const std::vector<OpCount>& ops, size_t begin, size_t end, size_t optimizer_begin,
            StepProfile* p) {
  // Hashed, keyed by views of the records' names (no string copied per op): p->ops and p->gemms
  // keep the order of first appearance either way.
  absl::flat_hash_map<std::pair<std::string_view, DType>, size_t> op_index;
  absl::flat_hash_map<std::tuple<int64_t, int64_t, int64_t, int64_t, DType, bool, bool>, size_t>
      gemm_index;
  for (size_t i = begin; i < end; ++i) {
    const OpCount& o = ops[i];
    p->flops += o.flops;
    p->op_bytes += o.bytes;
    if (i >= optimizer_begin) p->optimizer_flops += o.flops;
    auto [it, added] = op_index.try_emplace({o.op, o.dtype}, p->ops.size());
    if (added) p->ops.push_back(OpTotal{o.op, o.dtype});
    OpTotal& t = p->ops[it->second];
    ++t.count;
    t.flops += o.flops;
    t.bytes += o.bytes;
    if (o.gemm.has_value()) {
      const GemmShape& g = *o.gemm;
      p->gemm_flops += o.flops;
      auto [git, gadded] = gemm_index.try_emplace(
          {g.batch, g.m, g.n, g.k, g.dtype, g.trans_a, g.trans_b}, p->gemms.size());
      if (gadded) {
        p->gemms.push_back(GemmCount{g.batch, g.m, g.n, g.k, g.dtype, g.trans_a, g.trans_b});
      }
      ++p->gemms[git->second].count;
      p->gemms[git->second].flops += g.flops();
    }
  }
}

// This stage's actions per tick ("F0", "B3", "-" idle; interleaved "F0.1": chunk 1) and its
// idle fraction.
absl::Status AddTimetable(const Model& layout, const TrainOptions& o, int stage,
                          StepProfile* p) {
  absl::StatusOr<RunPlan> plan = PlanRun(layout, o);  // the trainer's own timetable
  if (!plan.ok()) return plan.status();
  if (!plan->pipelined) return absl::OkStatus();
  const Timetable* tt = plan->timetable.get();
  int idle = 0;
  for (int t = 0; t < tt->num_ticks(); ++t) {
    const PipeAction& a = tt->at(t, stage);
    if (a.kind == PipeAction::kIdle) ++idle;
    p->pipeline_timetable.push_back(a.kind == PipeAction::kIdle ? "-"
                                    : absl::StrCat(a.kind == PipeAction::kForward ? "F" : "B",
                                                   a.microbatch,
                                                   tt->virtual_stages() > 1
                                                       ? absl::StrCat(".", a.chunk)
                                                       : std::string()));
  }
  p->pipeline_bubble = tt->num_ticks() > 0 ? static_cast<double>(idle) / tt->num_ticks() : 0;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<GptRankRole>> GptRankRoles(const Model& layout,
                                                      const TrainOptions& options) {
  const Mesh& mesh = layout.mesh();
  const int p = layout.pp_ways();
  std::vector<GptRankRole> roles;
  if (p <= 1) {
    GptRankRole all{"all ranks", 0, {}};
    all.ranks.reserve(mesh.size());
    for (int r = 0; r < mesh.size(); ++r) all.ranks.push_back(r);
    roles.push_back(std::move(all));
    return roles;
  }
  // pp is the outermost axis (ParallelDims): stage s holds ranks [s*inner, (s+1)*inner). Each
  // stage is its own program: stage 0 embeds, the last computes the loss, and under 1F1B every
  // stage has its own warm-up (its order of forwards and backwards and its activations in
  // flight).
  absl::StatusOr<RunPlan> plan = PlanRun(layout, options);  // the trainer's stage split
  if (!plan.ok()) return plan.status();
  const int inner = mesh.size() / p;
  for (int s = 0; s < p; ++s) {
    GptRankRole role;
    role.role = absl::StrCat("pp stage ", s, s == 0 ? " (first)" : s == p - 1 ? " (last)" : "",
                             ": layers ", plan->stage_plan.StageLayers(s),
                             plan->stage_plan.virtual_stages > 1
                                 ? absl::StrCat(" in ", plan->stage_plan.virtual_stages, " chunks")
                                 : std::string());
    role.rank = s * inner;
    for (int r = 0; r < inner; ++r) role.ranks.push_back(s * inner + r);
    roles.push_back(std::move(role));
  }
  return roles;
}

absl::StatusOr<StepProfile> ProfileGptRank(const Model& layout, const TrainOptions& options,
                                           int rank, const std::string& role, Device device) {
  const Mesh& mesh = layout.mesh();
  const ModelShape& c = layout.shape();
  if (absl::Status s = CheckProfileOptions(options); !s.ok()) return s;
  if (rank < 0 || rank >= mesh.size()) {
    return Invalid(absl::StrCat("shape-only profile: rank ", rank, " is outside the ",
                                mesh.size(), " ranks of mesh ", mesh.ShortString()));
  }
  TrainOptions o = options;
  o.steps = 1;  // one optimizer step
  if (device.is_cuda()) {
    return Invalid("shape-only profile: runs on the meta device (or the CPU for tests), not " +
                   device.ToString());
  }
  // The global parameters: meta tensors (no data) of the layout's shapes; each rank's ShardOf
  // cuts its block as in a real run.
  std::vector<NamedTensor> init;
  init.reserve(layout.params().size());
  for (const ParamInfo& pi : layout.params()) {
    init.push_back({pi.name, Tensor::Zeros(pi.global_shape, c.dtype, device)});
  }
  // Token values never change a shape (MoE routing aside, whose buffers have fixed capacities).
  const std::vector<int64_t> tokens(static_cast<size_t>(c.seq) + 1, 0);
  Capture cap;
  o.hooks.only_rank = rank;
  o.hooks.spmd_runner = [&](const Mesh& m, const std::function<void(RankContext&)>& body) {
    ShapeOnlyOptions so;
    so.device = device;
    return RunShapeOnly(m, rank, [&](RankContext& ctx) {
      MemoryTracker mem;
      OpCounter ops;
      cap.ctx = &ctx;
      cap.mem = &mem;
      cap.ops = &ops;
      body(ctx);
      cap.ctx = nullptr;
      cap.mem = nullptr;
      cap.ops = nullptr;
    }, so);
  };
  StepProfile p;
  o.hooks.on_phase = [&](const char* phase) {
    const std::string ph = phase;
    if (ph == "step") {
      cap.ops_at_step = cap.ops->ops().size();
    } else if (ph == "optimizer") {
      cap.ops_at_optimizer = cap.ops->ops().size();
      cap.log_at_optimizer = cap.ctx->collective_log().size();
    } else if (ph == "end") {
      cap.ops_at_end = cap.ops->ops().size();
      cap.peak = cap.mem->peak_bytes();
      AddOps(cap.ops->ops(), cap.ops_at_step, cap.ops_at_end, cap.ops_at_optimizer, &p);
      cap.ended = true;
    }
  };
  absl::StatusOr<TrainResult> r = TrainGpt(layout, init, tokens, o);
  if (!r.ok()) return r.status();
  if (!cap.ended) return absl::InternalError("shape-only profile: the step never ended");
  // The rank's role: the ranks running its program.
  absl::StatusOr<std::vector<GptRankRole>> roles = GptRankRoles(layout, options);
  if (!roles.ok()) return roles.status();
  for (GptRankRole& r : *roles) {
    if (std::find(r.ranks.begin(), r.ranks.end(), rank) == r.ranks.end()) continue;
    p.role = role.empty() ? r.role : role;
    p.ranks_like_this = std::move(r.ranks);
  }
  p.rank = rank;
  for (size_t k = 0; k < r->log.size(); ++k) {
    const CollectiveRecord& rec = r->log[k];
    CollectiveTraffic t;
    t.op = rec.op;
    t.axes = mesh.AxisNamesOf(rec.axes);
    t.group_size = mesh.GroupSize(rec.axes);
    t.bytes = rec.bytes;
    t.dtype = rec.dtype;
    t.backward = rec.backward;
    t.phase = k >= cap.log_at_optimizer ? "optimizer" : rec.backward ? "backward" : "forward";
    p.collective_bytes += t.bytes;
    p.collectives.push_back(std::move(t));
  }
  p.parameter_bytes = r->param_bytes_per_rank;
  // The trainer's optimizer_bytes_per_rank is gradients + both moments; gradients have their
  // parameters' local shapes and dtype (reduced to the same shards).
  p.gradient_bytes = r->param_bytes_per_rank;
  p.optimizer_bytes = r->optimizer_bytes_per_rank - p.gradient_bytes;
  p.peak_bytes = cap.peak;
  p.activation_peak_bytes =
      std::max<int64_t>(0, p.peak_bytes - p.parameter_bytes - p.gradient_bytes - p.optimizer_bytes);
  p.saved_activation_peak_bytes = r->peak_activation_bytes_per_rank;
  p.gathered_peak_bytes = r->peak_gathered_bytes_per_rank;
  p.step_tensor_peak_bytes = r->peak_step_bytes_per_rank;
  p.backprop_tensor_peak_bytes = r->peak_backprop_bytes_per_rank;
  const int stage = layout.pp_ways() > 1 ? mesh.Coord(rank, mesh.AxisIndex(axis::kPp)) : 0;
  if (absl::Status s = AddTimetable(layout, o, stage, &p); !s.ok()) return s;
  return p;
}

absl::StatusOr<std::vector<StepProfile>> ProfileGptStep(const Model& layout,
                                                        const TrainOptions& options) {
  if (absl::Status s = CheckProfileOptions(options); !s.ok()) return s;
  absl::StatusOr<std::vector<GptRankRole>> roles = GptRankRoles(layout, options);
  if (!roles.ok()) return roles.status();
  std::vector<StepProfile> out;
  for (GptRankRole& role : *roles) {
    absl::StatusOr<StepProfile> p = ProfileGptRank(layout, options, role.rank, role.role);
    if (!p.ok()) return p.status();
    out.push_back(*std::move(p));
  }
  return out;
}

std::string FormatStepProfile(const StepProfile& p) {
  std::string s = absl::StrFormat(
      "%s (rank %d; %d ranks alike)\n  compute: %.4g GFLOP (GEMM %.4g, optimizer %.4g), "
      "%.4g GB moved by ops\n  memory: params %d, grads %d, AdamW %d, saved activations %d at "
      "most, FSDP gathered parameters %s, step tensors %d at most (%s), peak %d (activations "
      "and temporaries %d) bytes\n  collectives: %d calls, %d bytes\n",
      p.role, p.rank, p.ranks_like_this.size(), p.flops / 1e9, p.gemm_flops / 1e9,
      p.optimizer_flops / 1e9, p.op_bytes / 1e9, p.parameter_bytes, p.gradient_bytes,
      p.optimizer_bytes, p.saved_activation_peak_bytes,
      p.gathered_peak_bytes >= 0 ? absl::StrCat(p.gathered_peak_bytes, " at most") : "none",
      p.step_tensor_peak_bytes,
      p.step_tensor_peak_bytes > p.backprop_tensor_peak_bytes
          ? absl::StrCat("after the backward; ", p.backprop_tensor_peak_bytes,
                         " to its end")
          : std::string("in the forward + backward"),
      p.peak_bytes, p.activation_peak_bytes, p.collectives.size(), p.collective_bytes);
  // Collectives by (phase, op, axes): count and bytes, in first-seen order.
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> groups;
  std::map<std::string, size_t> index;
  for (const CollectiveTraffic& c : p.collectives) {
    const std::string key = absl::StrCat(c.phase, ": ", c.op, " over (",
                                         absl::StrJoin(c.axes, ","), ") of ", c.group_size);
    auto [it, added] = index.try_emplace(key, groups.size());
    if (added) groups.push_back({key, {0, 0}});
    ++groups[it->second].second.first;
    groups[it->second].second.second += c.bytes;
  }
  for (const auto& [key, v] : groups) {
    absl::StrAppendFormat(&s, "    %s: %d x, %d bytes\n", key, v.first, v.second);
  }
  if (!p.pipeline_timetable.empty()) {
    absl::StrAppendFormat(&s, "  timetable (bubble %.3f): %s\n", p.pipeline_bubble,
                          absl::StrJoin(p.pipeline_timetable, " "));
  }
  return s;
}

}  // namespace shardmap
