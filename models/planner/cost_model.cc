#include "models/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "models/parallel/pipeline.h"
#include "perfmodel/ring_cost.h"

namespace shardmap::planner {

int MeshShape::world() const {
  int w = 1;
  for (int s : sizes) w *= s;
  return w;
}

int MeshShape::size(const std::string& axis) const {
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] == axis) return sizes[i];
  }
  return 1;
}

std::string MeshShape::ToString() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < axes.size(); ++i) parts.push_back(absl::StrCat(axes[i], "=", sizes[i]));
  return parts.empty() ? "single" : absl::StrJoin(parts, ",");
}

namespace {

// Ranks of the group through `rank` along `axes` (row-major, axes outermost first).
// The lowest and the highest rank of `rank`'s group along `axes` (its members differ from it
// only in those axes' coordinates): the group shares a node exactly when these two do, nodes
// being runs of consecutive ranks.
std::pair<int, int> GroupBounds(const MeshShape& mesh, const std::vector<std::string>& axes,
                                int rank) {
  const int n = static_cast<int>(mesh.axes.size());
  int stride = 1, low = rank, span = 0;
  for (int i = n - 1; i >= 0; --i) {
    if (std::find(axes.begin(), axes.end(), mesh.axes[i]) != axes.end()) {
      low -= (rank / stride) % mesh.sizes[i] * stride;
      span += (mesh.sizes[i] - 1) * stride;
    }
    stride *= mesh.sizes[i];
  }
  return {low, low + span};
}

bool SameNode(std::pair<int, int> bounds, int gpus_per_node) {
  return bounds.first / gpus_per_node == bounds.second / gpus_per_node;
}

bool Overlappable(const CollectiveWork& c) { return c.phase == "fsdp" || c.phase == "grad"; }

std::string KindKey(const CollectiveWork& c) {
  return absl::StrCat(c.op, " ", c.axes.empty() ? "-" : absl::StrJoin(c.axes, "+"));
}

// Simulated CPU ranks computing at once: every rank, but no more than the cores run.
int ConcurrentRanks(const MeshShape& mesh, const HardwareProfile& p) {
  return static_cast<int>(std::min<double>(mesh.world(), std::max(1.0, std::round(p.cores))));
}

double Stretch(const MeshShape& mesh, const HardwareProfile& p) {
  return p.cores > 0 ? std::max(1.0, mesh.world() / p.cores) : 1.0;
}

// A fitted collective was measured with only its group's threads running: stretch it by the
// rest of the world's share of the cores only.
double CollectiveStretch(const CollectiveWork& c, const MeshShape& mesh, const HardwareProfile& p) {
  const double s = Stretch(mesh, p);
  if (p.cores <= 0 || p.fitted.count({c.op, c.group_size}) == 0) return s;
  return s / std::max(1.0, c.group_size / p.cores);
}

// Ranks sharing too few cores wait at a collective for the OS to run the members it has not
// run yet, when the group has more members than cores (a smaller group's members run
// together while the others wait their turn) and the collective follows compute. FSDP
// all-gathers / reduce-scatters and gradient all-reduces come in runs, one parameter after
// another, and pay that wait once per run: priced at their own cost. A collective that moves
// nothing (a type conversion in the log) waits for no one; the caller passes those as 0.
double OversubscribedWait(const CollectiveWork& c, const MeshShape& mesh,
                          const HardwareProfile& p) {
  // The effective core count reads a little under the hardware's on a shared machine (1.85-2.0
  // of 2): a group of 2 there still runs together.
  if (p.cores <= 0 || c.group_size <= std::round(p.cores) || c.phase == "fsdp" ||
      c.phase == "grad") {
    return 0.0;
  }
  return p.OversubscribedSyncSeconds(mesh.world());
}

}  // namespace

bool SpansNodes(const MeshShape& mesh, const std::vector<std::string>& axes, int gpus_per_node) {
  if (gpus_per_node <= 0) return false;
  return !SameNode(GroupBounds(mesh, axes, 0), gpus_per_node) ||
         !SameNode(GroupBounds(mesh, axes, mesh.world() - 1), gpus_per_node);
}

absl::StatusOr<double> RingSeconds(const std::string& op, int n, double rank_bytes,
                                   const Link& link) {
  if (n <= 1) return 0.0;
  if (link.busbw <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a link with bus bandwidth ", link.busbw, " B/s; give the profile's link"));
  }
  // perfmodel/ring_cost.h's ring cost for the kinds it knows (full bytes), the rest here.
  using perfmodel::CollectiveKind;
  const perfmodel::CollectiveCost ring = perfmodel::RingCost({link.alpha_s, link.busbw});
  if (op == "all_reduce") return ring(CollectiveKind::kAllReduce, n, rank_bytes);
  if (op == "reduce_scatter") return ring(CollectiveKind::kReduceScatter, n, rank_bytes);
  if (op == "all_gather") return ring(CollectiveKind::kAllGather, n, rank_bytes * n);
  if (op == "all_to_all") return link.alpha_s + (n - 1.0) / n * rank_bytes / link.busbw;
  if (op == "ppermute" || op == "ppermute_start" || op == "broadcast") {
    return link.alpha_s + rank_bytes / link.busbw;
  }
  // Type conversions the log may list: local, nothing moves.
  if (op.rfind("convert", 0) == 0 || op.rfind("reinterpret", 0) == 0 || op.rfind("vary", 0) == 0 ||
      op == "ppermute_wait") {
    return 0.0;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown collective '", op,
      "' (all_reduce, all_gather, reduce_scatter, all_to_all, ppermute, broadcast)"));
}

absl::StatusOr<double> CollectiveSeconds(const CollectiveWork& c, const MeshShape& mesh,
                                         const HardwareProfile& profile) {
  if (c.group_size <= 1) return 0.0;
  const auto fit = profile.fitted.find({c.op, c.group_size});
  if (fit != profile.fitted.end()) {
    return fit->second.alpha_s + c.bytes * fit->second.seconds_per_byte;
  }
  const bool inter = SpansNodes(mesh, c.axes, profile.gpus_per_node);
  const Link& link = inter ? profile.inter : profile.intra;
  if (inter && link.busbw <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile ", profile.name, " has no inter-node link but ", KindKey(c), " on mesh ",
        mesh.ToString(), " crosses nodes of ", profile.gpus_per_node, " GPUs"));
  }
  return RingSeconds(c.op, c.group_size, c.bytes, link);
}

namespace {
absl::Status AddWork(const std::vector<GemmWork>& gemms, const std::vector<OtherWork>& others,
                     const HardwareProfile& profile, ComputeParts* parts) {
  for (const GemmWork& g : gemms) {
    absl::StatusOr<double> t = profile.GemmSeconds(g);
    if (!t.ok()) return t.status();
    parts->gemm_s += *t;
  }
  for (const OtherWork& o : others) {
    absl::StatusOr<double> t = profile.OtherSeconds(o);
    if (!t.ok()) return t.status();
    parts->other_s += *t;
  }
  return absl::OkStatus();
}

// The recomputation's share of the role's compute.
absl::StatusOr<double> RecomputeSeconds(const RoleWork& role, const HardwareProfile& profile) {
  ComputeParts parts;
  if (absl::Status s = AddWork(role.recompute_gemms, role.recompute_others, profile, &parts);
      !s.ok()) {
    return s;
  }
  return parts.total();
}
}  // namespace

absl::StatusOr<ComputeParts> ComputeBreakdown(const RoleWork& role,
                                              const HardwareProfile& profile) {
  ComputeParts parts;
  if (absl::Status s = AddWork(role.gemms, role.others, profile, &parts); !s.ok()) return s;
  if (absl::Status s = AddWork(role.recompute_gemms, role.recompute_others, profile, &parts);
      !s.ok()) {
    return s;
  }
  parts.overhead_s = role.op_count * profile.op_overhead_s;
  return parts;
}

absl::StatusOr<double> ComputeSeconds(const RoleWork& role, const HardwareProfile& profile) {
  absl::StatusOr<ComputeParts> parts = ComputeBreakdown(role, profile);
  if (!parts.ok()) return parts.status();
  return parts->total();
}

absl::StatusOr<double> PipelineSeconds(const PipelineSpec& spec,
                                       const std::vector<double>& forward_s,
                                       const std::vector<double>& backward_s, double boundary_s,
                                       double* bubble, double stage_share) {
  absl::StatusOr<Schedule> schedule = ParseSchedule(spec.schedule);
  if (!schedule.ok()) return schedule.status();
  absl::StatusOr<Timetable> tt = MakeTimetable(*schedule, spec.stages, spec.microbatches);
  if (!tt.ok()) return tt.status();
  if (static_cast<int>(forward_s.size()) != spec.stages ||
      static_cast<int>(backward_s.size()) != spec.stages) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline times for ", forward_s.size(),
                                                   " stages; the pipeline has ", spec.stages));
  }
  double total = 0, busy = 0;
  for (int t = 0; t < tt->num_ticks(); ++t) {
    double tick = 0, work = 0;
    bool moved = false;
    for (int s = 0; s < spec.stages; ++s) {
      const PipeAction& a = tt->at(t, s);
      const double d = a.kind == PipeAction::kForward    ? forward_s[s]
                       : a.kind == PipeAction::kBackward ? backward_s[s]
                                                         : 0.0;
      busy += d;
      work += d;
      tick = std::max(tick, d);
      moved = moved || a.kind != PipeAction::kIdle;
    }
    if (stage_share > 0) tick = std::max(tick, work * stage_share);
    total += tick + (moved && spec.stages > 1 ? boundary_s : 0.0);
  }
  if (bubble != nullptr) *bubble = total > 0 ? 1.0 - busy / (spec.stages * total) : 0.0;
  return total;
}

namespace {

struct RoleTimes {
  double compute = 0, blocking = 0, blocking_fwd = 0, overlapped = 0, boundary = 0;
  double forward = 0;  // the forward passes' compute (recomputation runs in the backward)
  // The overlapped schedule's inputs (options.overlap): one gather / reduce-scatter of every
  // layer, HSDP's replicate all-reduce, and DDP's gradient bytes with their kinds.
  bool fsdp = false;
  double gather_s = 0, reduce_s = 0, replicate_s = 0, grad_bytes = 0;
  std::vector<CollectiveWork> grad_kinds;
};

bool IsFsdpGather(const CollectiveWork& w) { return w.phase == "fsdp" && w.op == "all_gather"; }

}  // namespace

MemoryBreakdown RoleMemory(const RoleWork& role) {
  return {.params = role.param_bytes, .grads = role.grad_bytes,
          .optimizer = role.optimizer_bytes,
          .saved_activations = role.saved_activation_peak_bytes,
          .gathered = role.gathered_peak_bytes, .peak = role.peak_bytes,
          .peak_after_backward = role.peak_after_backward};
}

std::string FormatMemory(const MemoryBreakdown& m) {
  auto mib = [](double b) { return absl::StrFormat("%.1f MiB", b / (1024.0 * 1024)); };
  return absl::StrCat(
      "parameters ", mib(m.params), ", gradients ", mib(m.grads), ", optimizer state ",
      mib(m.optimizer), ", activations ", mib(m.saved_activations), " saved at most",
      m.gathered >= 0 ? absl::StrCat(", FSDP gathered parameters at most ", mib(m.gathered)) : "",
      ", step peak ", mib(m.peak),
      m.peak_after_backward ? " (after the backward: gradient reductions and AdamW)"
                            : " (in the forward + backward)");
}

double FsdpShardBytes(const RoleWork& role, int passes) {
  double gathered = 0;
  for (const CollectiveWork& w : role.collectives) {
    if (IsFsdpGather(w) && !w.backward) gathered += w.bytes;
  }
  return gathered / std::max(1, passes);
}

namespace {

// The in-process cost of one started call beneath a simulated link (0 without a fit).
double LaneCpuOf(const CollectiveWork& w, const HardwareProfile& p) {
  const auto fit = p.lane_cpu.find({w.op, w.group_size});
  if (w.group_size <= 1 || fit == p.lane_cpu.end()) return 0;
  return fit->second.alpha_s + w.bytes * fit->second.seconds_per_byte;
}

// Simulated links with overlap: every started call's in-process collective runs on a lane thread
// and takes the cores from compute (profile.lane_cpu). What the trainer starts: FSDP's gathers
// (`gather`, one pass's shard in the compute dtype; the blocks gathered again in the backward
// when resharded, all but the last of `role.layers`) and reduce-scatters (`reduce`) each pass,
// and the gradient kinds (DDP's buckets, HSDP's replicate all-reduce) once. No-op otherwise.
void AddLaneCpu(const RoleWork& role, const CollectiveWork& gather, const CollectiveWork& reduce,
                const HardwareProfile& p, const StepOptions& o, double stretch, int passes,
                RoleTimes* t) {
  if (!o.overlap || !o.simulated_link || p.cores <= 0 || p.lane_cpu.empty()) return;
  const int layers = std::max(1, role.layers);
  const double regathered = o.reshard_after_forward ? (layers - 1.0) / layers : 0.0;
  const double fwd = passes * LaneCpuOf(gather, p);
  double cpu = fwd * (1 + regathered) + passes * LaneCpuOf(reduce, p);
  for (const CollectiveWork& k : t->grad_kinds) cpu += LaneCpuOf(k, p);
  t->compute += cpu * stretch;
  t->forward += fwd * stretch;
}

// Prices one role's collectives by what they do; `stretch` the shared-core factor of compute.
absl::StatusOr<RoleTimes> TimesOf(const RoleWork& role, const MeshShape& mesh,
                                  const HardwareProfile& profile, const StepOptions& o,
                                  double compute_stretch, int passes) {
  RoleTimes t;
  absl::StatusOr<double> c = ComputeSeconds(role, profile);
  if (!c.ok()) return c.status();
  t.compute = *c * compute_stretch;
  absl::StatusOr<double> rc = RecomputeSeconds(role, profile);
  if (!rc.ok()) return rc.status();
  t.forward = (*c - *rc) * role.forward_fraction * compute_stretch;
  const CollectiveWork* fsdp_gather = nullptr;
  for (const CollectiveWork& w : role.collectives) {
    absl::StatusOr<double> s = CollectiveSeconds(w, mesh, profile);
    if (!s.ok()) return s.status();
    const double secs = o.simulated_link
                            ? *s
                            : std::max(*s * CollectiveStretch(w, mesh, profile),
                                       *s > 0 ? OversubscribedWait(w, mesh, profile) : 0.0);
    if (Overlappable(w)) {
      t.overlapped += secs;
      if (IsFsdpGather(w) && fsdp_gather == nullptr) fsdp_gather = &w;
      if (w.phase == "grad" && w.group_size > 1) {
        // One entry per (op, axes, group): the overlapped trainer reduces buckets, not the
        // log's one collective per parameter.
        auto same = std::find_if(t.grad_kinds.begin(), t.grad_kinds.end(),
                                 [&w](const CollectiveWork& k) {
                                   return k.op == w.op && k.axes == w.axes &&
                                          k.group_size == w.group_size;
                                 });
        if (same == t.grad_kinds.end()) {
          t.grad_kinds.push_back(w);
        } else {
          same->bytes += w.bytes;
        }
        t.grad_bytes += w.bytes;
      }
    } else if (w.phase == "pp") {
      t.boundary += secs;
    } else {
      t.blocking += secs;
      if (!w.backward) t.blocking_fwd += secs;
    }
  }
  if (!o.overlap) return t;
  if (fsdp_gather == nullptr) AddLaneCpu(role, {}, {}, profile, o, compute_stretch, passes, &t);
  for (const CollectiveWork& k : t.grad_kinds) {
    absl::StatusOr<double> s = CollectiveSeconds(k, mesh, profile);
    if (!s.ok()) return s.status();
    t.replicate_s += *s;
  }
  if (fsdp_gather == nullptr) {
    // FSDP collectives without a parameter gather to schedule them by: they block.
    for (const CollectiveWork& w : role.collectives) {
      if (w.phase != "fsdp") continue;
      absl::StatusOr<double> s = CollectiveSeconds(w, mesh, profile);
      if (!s.ok()) return s.status();
      t.blocking += *s;
      if (!w.backward) t.blocking_fwd += *s;
    }
    return t;
  }
  // FSDP as the overlapped trainer runs it: every layer gathered in the compute dtype (this
  // rank's shard), its gradients reduce-scattered in the parameters' (the whole buffer).
  t.fsdp = true;
  // The sharded parameters' bytes: the shape-only step gathers each of them once per forward
  // pass (padded where dp_shard does not divide a size: ParamInfo::fsdp_pad; the padding is
  // gathered, reduce-scattered and held as the trainer does).
  const double sharded = FsdpShardBytes(role, passes);
  CollectiveWork g = *fsdp_gather;
  g.bytes = sharded * o.gather_scale;
  CollectiveWork r = g;
  r.op = "reduce_scatter";
  r.bytes = sharded * g.group_size;
  absl::StatusOr<double> gs = CollectiveSeconds(g, mesh, profile);
  if (!gs.ok()) return gs.status();
  absl::StatusOr<double> rs = CollectiveSeconds(r, mesh, profile);
  if (!rs.ok()) return rs.status();
  t.gather_s = *gs;
  t.reduce_s = *rs;
  AddLaneCpu(role, g, r, profile, o, compute_stretch, passes, &t);
  return t;
}

// What reducing `bytes` of gradients costs, spread over the logged gradient kinds.
std::function<double(double)> BucketCost(const RoleTimes& t, const MeshShape& mesh,
                                         const HardwareProfile& profile) {
  return [&t, &mesh, &profile](double bytes) {
    double s = 0;
    for (CollectiveWork w : t.grad_kinds) {
      w.bytes = bytes * w.bytes / t.grad_bytes;
      absl::StatusOr<double> c = CollectiveSeconds(w, mesh, profile);
      if (c.ok()) s += *c;
    }
    return s;
  };
}

absl::Status CheckOptions(const StepOptions& o) {
  if (!(o.bucket_bytes > 0) || o.fsdp_prefetch < 1 || o.grad_accum < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step options: bucket ", o.bucket_bytes, " bytes (> 0), prefetch ", o.fsdp_prefetch,
        " (>= 1), grad_accum ", o.grad_accum, " (>= 1)"));
  }
  return absl::OkStatus();
}

// One role's step without a pipeline, collectives overlapped as the trainer schedules them.
absl::StatusOr<double> OverlappedRoleSeconds(const RoleWork& role, const RoleTimes& t,
                                             const MeshShape& mesh,
                                             const HardwareProfile& profile,
                                             const StepOptions& o) {
  OverlappedStepInput in;
  in.layers = std::max(1, role.layers);
  in.microsteps = o.grad_accum;
  in.forward_s = (t.forward + t.blocking_fwd) / o.grad_accum;
  in.backward_s = (t.compute - t.forward + t.blocking - t.blocking_fwd) / o.grad_accum;
  in.bucket_bytes = o.bucket_bytes;
  in.prefetch = o.fsdp_prefetch;
  in.reshard_after_forward = o.reshard_after_forward;
  if (t.fsdp) {
    in.fsdp_gather_s = t.gather_s;
    in.fsdp_reduce_s = t.reduce_s;
    in.hsdp_replicate_s = t.replicate_s;
  } else {
    in.grad_bytes = t.grad_bytes;
    in.grad_bucket_seconds = BucketCost(t, mesh, profile);
  }
  return PredictOverlappedStep(in);
}

// One microbatch's forward and backward on a pipeline stage.
void StageActionSeconds(const RoleTimes& t, int m, double* fwd, double* bwd) {
  *fwd = (t.forward + t.blocking_fwd) / m;
  *bwd = (t.compute - t.forward + t.blocking - t.blocking_fwd) / m;
}

// FSDP in a pipeline stage as the trainer runs it (models/train/stage_fsdp.h): each unit
// gathered once per step in the compute dtype (t.gather_s), prefetched in the first
// microbatch's forward order, kept (in the parameters' dtype) over the
// microbatches, and reduce-scattered once as soon as its gradients are final in the last
// microbatch's backward. What does not hide: the gathers the first forward action (stage 0's:
// the later stages gather in their warm-up idle ticks) cannot cover, and the reduce-scatters
// the last backward cannot (then HSDP's replicate all-reduce).
absl::StatusOr<double> StageFsdpExposedSeconds(const RoleWork& role, const RoleTimes& t,
                                               const StepOptions& o, double fwd, double bwd) {
  const int layers = std::max(1, role.layers);
  double exposed = t.replicate_s;
  if (std::max(0, role.pp_stage) == 0) {
    absl::StatusOr<double> f = FsdpForwardSeconds(
        {.layers = layers, .compute_s = fwd, .gather_s = t.gather_s, .prefetch = o.fsdp_prefetch});
    if (!f.ok()) return f.status();
    exposed += *f - fwd;
  }
  absl::StatusOr<double> b = FsdpBackwardSeconds(
      {.layers = layers, .compute_s = bwd, .reduce_s = t.reduce_s, .prefetch = o.fsdp_prefetch});
  if (!b.ok()) return b.status();
  return exposed + *b - bwd;
}

}  // namespace

namespace {

// A pipeline's step: the stages' actions on the schedule's timetable (asynchronous; simulated
// CPU ranks: the trainer's lockstep ticks, sharing the cores), then what the last backward
// leaves exposed. Fills out->step_s and out->bubble, role_exposed, *critical.
absl::Status PipelinedStep(const std::vector<RoleWork>& roles, const std::vector<RoleTimes>& times,
                           const MeshShape& mesh, const PipelineSpec& pipeline,
                           const HardwareProfile& profile, const StepOptions& o,
                           std::vector<double>* role_exposed, size_t* critical,
                           StepPrediction* out) {
  const int p = pipeline.stages, m = pipeline.microbatches;
  std::vector<double> fwd(p, -1), bwd(p, -1);
  double boundary = 0, after = 0;
  for (size_t i = 0; i < roles.size(); ++i) {
    const int s = p == 1 ? 0 : roles[i].pp_stage;
    if (s < 0 || s >= p) {
      return absl::InvalidArgumentError(absl::StrCat(
          "role '", roles[i].role, "' has pipeline stage ", roles[i].pp_stage, " of ", p));
    }
    const RoleTimes& t = times[i];
    double f = 0, b = 0;
    StageActionSeconds(t, m, &f, &b);
    fwd[s] = std::max(fwd[s], f);
    bwd[s] = std::max(bwd[s], b);
    // Boundary transfers: one forward and one backward activation per microbatch.
    boundary = std::max(boundary, t.boundary / std::max<int>(1, 2 * m));
    double exposed = t.overlapped;
    if (o.overlap) {
      // FSDP: what the first forward and the last backward leave exposed; the gradients'
      // buckets overlap the last backward.
      exposed = 0;
      if (t.fsdp) {
        absl::StatusOr<double> e = StageFsdpExposedSeconds(roles[i], t, o, f, b);
        if (!e.ok()) return e.status();
        exposed = *e;
      } else if (t.grad_bytes > 0) {
        absl::StatusOr<double> with = BucketedBackwardSeconds(b, t.grad_bytes, o.bucket_bytes,
                                                              BucketCost(t, mesh, profile));
        if (!with.ok()) return with.status();
        exposed = *with - b;
      }
    }
    (*role_exposed)[i] = exposed;
    after = std::max(after, exposed);
  }
  for (int s = 0; s < p; ++s) {
    if (fwd[s] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("no role for pipeline stage ", s, " of ", p));
    }
  }
  absl::StatusOr<double> pipe;
  if (profile.cores > 0) {
    // Simulated CPU ranks run the trainer's lockstep ticks and share the cores tick by tick
    // (the pipeline's compute was not stretched above).
    const double share = (mesh.world() / p) / profile.cores;
    pipe = PipelineSeconds(pipeline, fwd, bwd, boundary, &out->bubble, share);
  } else {
    pipe = AsyncPipelineSeconds(pipeline.schedule, p, m, pipeline.virtual_stages, fwd, bwd,
                                boundary, &out->bubble);
  }
  if (!pipe.ok()) return pipe.status();
  out->step_s = *pipe + after;
  if (profile.cores > 0) {
    // Shared cores: no faster than every rank's work (each stage's ranks, world / p of them)
    // over the cores, plus the slowest stage's communication.
    double work = 0, comm = 0;
    for (size_t i = 0; i < roles.size(); ++i) {
      work += times[i].compute * (mesh.world() / p);
      comm = std::max(comm, times[i].blocking + times[i].boundary + (*role_exposed)[i]);
    }
    const double bound = work / profile.cores + comm;
    if (bound > out->step_s) {
      out->step_s = bound;
      out->bubble = 0;  // the idle stages' cores were busy with the others' work
    }
  }
  for (size_t i = 1; i < roles.size(); ++i) {
    if (times[i].compute > times[*critical].compute) *critical = i;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepPrediction> PredictStep(const std::vector<RoleWork>& roles,
                                           const MeshShape& mesh, const PipelineSpec& pipeline,
                                           const HardwareProfile& profile,
                                           const StepOptions& options) {
  if (roles.empty()) return absl::InvalidArgumentError("no rank roles to predict");
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  const bool piped = pipeline.stages > 1 || pipeline.microbatches > 1;
  // Simulated CPU ranks share the cores and run their collectives inline: nothing overlaps.
  StepOptions o = options;
  o.overlap = options.overlap && (profile.cores <= 0 || options.simulated_link);
  // A pipeline stage gathers each FSDP unit once (in the compute dtype) and keeps it for the
  // step (models/train/stage_fsdp.h): no regathers.
  if (piped) o.reshard_after_forward = false;
  const double stretch = Stretch(mesh, profile);
  // Simulated CPU ranks computing together share caches and memory (their non-GEMM ops).
  std::optional<HardwareProfile> shared;
  if (profile.cores > 0) shared = profile.ForConcurrentRanks(ConcurrentRanks(mesh, profile));
  const HardwareProfile& compute_profile = shared ? *shared : profile;
  std::vector<RoleTimes> times(roles.size());
  StepPrediction out;
  size_t largest = 0;
  for (size_t i = 0; i < roles.size(); ++i) {
    // A pipeline's stages idle in its bubble and leave their cores to the others: its compute
    // is not stretched here but bounded below by the whole world's work over the cores (below).
    // FSDP gathers each microstep without a pipeline, once per step in a pipeline stage.
    const int passes = piped ? 1 : o.grad_accum;
    absl::StatusOr<RoleTimes> t =
        TimesOf(roles[i], mesh, compute_profile, o, piped ? 1.0 : stretch, passes);
    if (!t.ok()) return t.status();
    times[i] = *std::move(t);
    if (roles[i].peak_bytes > roles[largest].peak_bytes) largest = i;
  }
  std::vector<double> role_exposed(roles.size(), 0);
  for (size_t i = 0; i < roles.size(); ++i) role_exposed[i] = times[i].overlapped;
  size_t critical = 0;
  if (!piped) {
    for (size_t i = 0; i < roles.size(); ++i) {
      const RoleTimes& t = times[i];
      double s = t.compute + t.blocking + t.overlapped;
      if (o.overlap) {
        absl::StatusOr<double> ov = OverlappedRoleSeconds(roles[i], t, mesh, profile, o);
        if (!ov.ok()) return ov.status();
        s = *ov;
        role_exposed[i] = std::max(0.0, s - t.compute - t.blocking);
      }
      if (s > out.step_s) {
        out.step_s = s;
        critical = i;
      }
    }
  } else if (absl::Status st = PipelinedStep(roles, times, mesh, pipeline, profile, o,
                                             &role_exposed, &critical, &out);
             !st.ok()) {
    return st;
  }
  const RoleTimes& ct = times[critical];
  out.compute_s = ct.compute;
  if (absl::StatusOr<ComputeParts> parts = ComputeBreakdown(roles[critical], compute_profile);
      parts.ok()) {
    out.gemm_s = parts->gemm_s;
    out.other_s = parts->other_s;
    out.overhead_s = parts->overhead_s;
  }
  out.blocking_comm_s = ct.blocking + ct.boundary;
  out.overlapped_comm_s = ct.overlapped;
  out.exposed_comm_s = role_exposed[critical];
  out.critical_role = roles[critical].role;
  out.peak_bytes = roles[largest].peak_bytes;
  out.memory = RoleMemory(roles[largest]);
  for (const CollectiveWork& w : roles[largest].collectives) {
    if (w.group_size <= 1) continue;
    out.bytes_by_kind[KindKey(w)] += w.bytes;
    absl::StatusOr<double> s = CollectiveSeconds(w, mesh, profile);
    if (s.ok()) {
      out.seconds_by_kind[KindKey(w)] += std::max(
          *s * CollectiveStretch(w, mesh, profile), *s > 0 ? OversubscribedWait(w, mesh, profile) : 0.0);
    }
  }
  return out;
}

}  // namespace shardmap::planner
