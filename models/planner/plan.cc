#include "models/planner/plan.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/parallel/parallel_dims.h"
#include "models/parallel/pipeline.h"
#include "models/planner/profile_reuse.h"
#include "models/train/trainer.h"

namespace shardmap::planner {

namespace {

std::vector<int> Divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

double GiB(double b) { return b / (1024.0 * 1024 * 1024); }

}  // namespace

std::string PeakOverUsable(double peak_bytes, double usable_bytes) {
  // One decimal, more while the two would print alike (74.6 > 74.6 says nothing).
  int digits = 1;
  while (digits < 9 && absl::StrFormat("%.*f", digits, GiB(peak_bytes)) ==
                           absl::StrFormat("%.*f", digits, GiB(usable_bytes))) {
    ++digits;
  }
  return absl::StrFormat("peak %.*f GiB per GPU > %.*f GiB usable", digits, GiB(peak_bytes),
                         digits, GiB(usable_bytes));
}

namespace {

std::string Seconds(double s) {
  if (s >= 1) return absl::StrFormat("%.3f s", s);
  if (s >= 1e-3) return absl::StrFormat("%.2f ms", s * 1e3);
  return absl::StrFormat("%.1f us", s * 1e6);
}

std::string Bytes(double b) {
  if (b >= 1e9) return absl::StrFormat("%.2f GB", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.1f MB", b / 1e6);
  if (b >= 1e3) return absl::StrFormat("%.1f kB", b / 1e3);
  return absl::StrFormat("%.0f B", b);
}

MeshShape MakeMesh(int pp, int dp_rep, int dp_shard, int dp, int ep, int cp, int tp) {
  MeshShape m;
  const std::pair<const char*, int> axes[] = {{axis::kPp, pp},      {axis::kDpReplicate, dp_rep},
                                              {axis::kDpShard, dp_shard}, {axis::kDp, dp},
                                              {axis::kEp, ep},      {axis::kCp, cp},
                                              {axis::kTp, tp}};
  for (const auto& [name, size] : axes) {
    if (size > 1) {
      m.axes.push_back(name);
      m.sizes.push_back(size);
    }
  }
  return m;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> CandidateLayout(const Candidate& c,
                                                       const PlanRequest& req) {
  absl::StatusOr<Mesh> mesh = c.mesh.axes.empty() ? Mesh() : ParseMesh(c.mesh.ToString());
  if (!mesh.ok()) return mesh.status();
  return CreateModel(req.model, req.args, *mesh, c.sp);
}

absl::StatusOr<std::unique_ptr<Model>> RequestModel(const PlanRequest& req) {
  if (absl::Status s = FindModel(req.model).status(); !s.ok()) return s;  // names the choices
  absl::StatusOr<std::unique_ptr<Model>> m = CreateModel(req.model, req.args, Mesh(), false);
  if (!m.ok()) {
    return absl::Status(m.status().code(),
                        absl::StrCat("--model=", req.model,
                                     req.args.preset.empty() ? "" : " --preset=", req.args.preset,
                                     ": ", m.status().message()));
  }
  return m;
}

TrainOptions CandidateTrainOptions(const Candidate& c, const PlanRequest& req) {
  TrainOptions o;
  o.batch = req.global_batch;
  o.pipeline.microbatches = c.pipeline.microbatches;
  o.pipeline.schedule = c.pipeline.schedule;
  o.pipeline.virtual_stages = std::max(1, c.pipeline.virtual_stages);
  o.grad_accum = c.grad_accum;
  if (c.recompute == Recompute::kFull) o.recompute = RecomputeMode::kFull;
  if (c.recompute == Recompute::kSelective) o.recompute = RecomputeMode::kSelective;
  // The profile is the reference schedule's work (every collective at its use, gathered
  // parameters kept, one all-reduce per gradient): the planner prices the overlapped schedule
  // (buckets, prefetch, reshard) from it itself (step_schedule.h, shape_only_keeps_gathered).
  o.overlap.on = false;
  return o;
}

namespace {

// The framework's checks for one candidate, without running anything: the layout's
// (CreateModel) and the trainer's own plan of the run (PlanRun: its option checks, the
// batch's divisibility, SP's split of the rows, the stage split). OK or the framework's message.
absl::Status FrameworkChecks(const Candidate& c, const PlanRequest& req, const ModelShape& ms) {
  absl::StatusOr<std::unique_ptr<Model>> layout = CandidateLayout(c, req);
  if (!layout.ok()) return layout.status();
  if (c.recompute == Recompute::kSelective && req.attention == "flash" &&
      c.mesh.size(axis::kCp) == 1) {
    return absl::InvalidArgumentError(
        "rc=selective under the fused (flash) attention this plan prices (--attention=flash): "
        "selective recomputation recomputes the attention scores and softmax, which the fused "
        "kernel never keeps (it recomputes them in its own backward), so it would equal "
        "rc=none; use rc=none or rc=full, or --attention=materialised");
  }
  if (absl::Status s = PlanRun(**layout, CandidateTrainOptions(c, req)).status(); !s.ok()) {
    return s;
  }
  const PipelineSpec& ps = c.pipeline;
  if (ps.schedule == "interleaved_1f1b" || ps.virtual_stages > 1) {
    absl::StatusOr<Schedule> sched = ParseSchedule(ps.schedule);
    if (!sched.ok()) return sched.status();
    if (absl::Status s =
            StageActions(*sched, ps.stages, ps.microbatches, 0, ps.virtual_stages).status();
        !s.ok()) {
      return s;
    }
    if (ms.layers % (static_cast<int64_t>(ps.stages) * ps.virtual_stages) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "interleaved_1f1b: ", ms.layers, " layers do not split into ", ps.stages,
          " stages x ", ps.virtual_stages, " chunks of equal size"));
    }
  }
  return absl::OkStatus();
}

double ElemBytes(DType t) { return static_cast<double>(DTypeSize(t)); }

}  // namespace

std::string Candidate::Name() const {
  std::string s = mesh.ToString();
  if (sp) absl::StrAppend(&s, " +sp");
  if (pipeline.stages > 1 || pipeline.microbatches > 1) {
    absl::StrAppend(&s, " ", pipeline.schedule, "/m", pipeline.microbatches);
    if (pipeline.virtual_stages > 1) absl::StrAppend(&s, "/v", pipeline.virtual_stages);
  }
  if (grad_accum > 1) absl::StrAppend(&s, " ga", grad_accum);
  if (recompute != Recompute::kNone) absl::StrAppend(&s, " rc=", RecomputeName(recompute));
  if (!reshard_after_forward) absl::StrAppend(&s, " keep");
  return s;
}

double ModelParameters(const Model& model) {
  double n = 0;
  for (const ParamInfo& p : model.params()) n += static_cast<double>(NumElements(p.global_shape));
  return n;
}

double ModelFlopsPerStep(const Model& model, int64_t batch) {
  return model.FlopsPerToken() * (static_cast<double>(batch) * model.shape().seq);
}

absl::StatusOr<Candidate> ParseCandidate(const std::string& mesh_text, bool sp,
                                         const std::string& schedule, int microbatches,
                                         int virtual_stages) {
  absl::StatusOr<Mesh> mesh = mesh_text == "single" ? Mesh() : ParseMesh(mesh_text);
  if (!mesh.ok()) return mesh.status();
  Candidate c;
  for (int i = 0; i < mesh->num_axes(); ++i) {
    c.mesh.axes.push_back(mesh->axis_names()[i]);
    c.mesh.sizes.push_back(mesh->axis_size(i));
  }
  c.sp = sp;
  c.pipeline.stages = c.mesh.size(axis::kPp);
  c.pipeline.microbatches = std::max(1, microbatches);
  c.pipeline.schedule = schedule;
  c.pipeline.virtual_stages = std::max(1, virtual_stages);
  return c;
}

namespace {

// The meshes --meshes names ("dp=2,tp=4 +sp 1f1b/m8 ga2 rc=full keep"), with the settings
// they fix, appended to raw.
absl::Status ParseGivenMeshes(const PlanRequest& req, std::vector<Candidate>& raw) {
  for (const std::string& text : req.only_meshes) {
    std::vector<std::string> f = absl::StrSplit(text, absl::ByAnyChar(" :"), absl::SkipEmpty());
    if (f.empty()) return absl::InvalidArgumentError("an empty mesh");
    bool sp = false, keep = false;
    std::string schedule = "1f1b";
    int m = 1, ga = 1, v = 1;
    std::optional<Recompute> rc;
    for (size_t i = 1; i < f.size(); ++i) {
      std::vector<std::string> sm = absl::StrSplit(f[i], "/m");
      if (f[i] == "+sp") {
        sp = true;
      } else if (f[i] == "keep") {
        keep = true;
      } else if (f[i].rfind("rc=", 0) == 0) {
        absl::StatusOr<Recompute> r = ParseRecompute(f[i].substr(3));
        if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("mesh '", text, "': ", r.status().message()));
        rc = *r;
      } else if (f[i].rfind("ga", 0) == 0 && absl::SimpleAtoi(f[i].substr(2), &ga) && ga >= 1) {
        continue;
      } else if (sm.size() == 2) {
        std::vector<std::string> mv = absl::StrSplit(sm[1], "/v");
        if (!absl::SimpleAtoi(mv[0], &m) || m < 1 ||
            (mv.size() == 2 && (!absl::SimpleAtoi(mv[1], &v) || v < 1)) || mv.size() > 2) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mesh '", text, "': '", f[i], "' is not <schedule>/m<microbatches>[/v<chunks>]"));
        }
        schedule = sm[0];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "mesh '", text, "': '", f[i],
            "' is neither +sp, <schedule>/m<microbatches>[/v<chunks>], ga<microsteps>, "
            "rc=<none|selective|full> nor keep"));
      }
    }
    absl::StatusOr<Candidate> c = ParseCandidate(f[0], sp, schedule, m, v);
    if (!c.ok()) return c.status();
    c->grad_accum = ga;
    c->fixed_grad_accum = absl::StrContains(text, " ga") || absl::StrContains(text, ":ga");
    // Given settings are fixed; others stay the planner's to choose.
    if (rc.has_value()) c->recompute = *rc;
    c->reshard_after_forward = !keep;
    c->fixed_recompute = rc.has_value();
    c->fixed_reshard = keep;
    if (c->mesh.world() != req.gpus) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh ", f[0], " has ", c->mesh.world(), " ranks; --gpus is ", req.gpus,
                       ": the mesh's sizes must multiply to the GPU count"));
    }
    raw.push_back(*c);
  }
  return absl::OkStatus();
}

// Every mesh of req.gpus ranks the search allows (pp, tp, cp, ep, the data-parallel forms,
// SP, pipeline schedules, microbatches and interleaving), appended to raw.
void SearchMeshes(const PlanRequest& req, const ModelShape& ms, std::vector<Candidate>& raw) {
  const bool moe = ms.moe.on();
  for (int pp : Divisors(req.gpus)) {
    if (req.max_pp > 0 && pp > req.max_pp) continue;
    const int r1 = req.gpus / pp;
    for (int tp : Divisors(r1)) {
      const int r2 = r1 / tp;
      for (int cp : Divisors(r2)) {
        if (req.max_cp > 0 && cp > req.max_cp) continue;
        const int r3 = r2 / cp;
        for (int ep : Divisors(r3)) {
          if (ep > 1 && !moe) continue;  // ep is a MoE axis
          const int data = r3 / ep;
          std::vector<std::array<int, 3>> forms;  // dp_replicate, dp_shard, dp
          auto allowed = [&req](const char* form) {
            return std::find(req.data_parallel.begin(), req.data_parallel.end(), form) !=
                   req.data_parallel.end();
          };
          if (data == 1) {
            forms.push_back({1, 1, 1});
          } else {
            if (allowed("dp")) forms.push_back({1, 1, data});
            if (allowed("fsdp")) forms.push_back({1, data, 1});
            for (int r : Divisors(data)) {
              if (r > 1 && r < data && allowed("hsdp")) forms.push_back({r, data / r, 1});
            }
          }
          for (const auto& f : forms) {
            Candidate c;
            c.mesh = MakeMesh(pp, f[0], f[1], f[2], ep, cp, tp);
            c.pipeline.stages = pp;
            std::vector<bool> sps = {false};
            if (tp > 1 && req.sp_variants) sps.push_back(true);
            if (tp > 1 && !req.sp_variants) sps = {true};
            if (req.no_sp) sps = {false};
            for (bool sp : sps) {
              c.sp = sp;
              if (pp == 1) {
                c.pipeline.microbatches = 1;
                raw.push_back(c);
                continue;
              }
              for (const std::string& sched : req.schedules) {
                for (int factor : req.microbatch_factors) {
                  c.pipeline.schedule = sched;
                  c.pipeline.microbatches = pp * factor;
                  c.pipeline.virtual_stages = 1;
                  if (sched != "interleaved_1f1b") {
                    raw.push_back(c);
                    continue;
                  }
                  for (int v : req.virtual_stages) {
                    // Only chunk counts that split the stage's layers evenly.
                    if (v < 2 || ms.layers % (int64_t{pp} * v) != 0) continue;
                    c.pipeline.virtual_stages = v;
                    raw.push_back(c);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<Candidate>> EnumerateCandidates(const PlanRequest& req,
                                                           const HardwareProfile& hw,
                                                           std::vector<Refusal>* refused) {
  const int gpn = req.gpus_per_node > 0 ? req.gpus_per_node : hw.gpus_per_node;
  if (req.gpus < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--gpus ", req.gpus, " must be >= 1"));
  }
  if (req.gpus > gpn && req.gpus % gpn != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpus ", req.gpus, " is not a whole number of nodes of ", gpn,
        " GPUs (--gpus_per_node); use a multiple of ", gpn));
  }
  if (req.global_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--batch ", req.global_batch, " must be >= 1"));
  }
  absl::StatusOr<std::unique_ptr<Model>> model = RequestModel(req);
  if (!model.ok()) return model.status();
  const ModelShape& ms = (*model)->shape();
  std::vector<Candidate> raw;
  if (!req.only_meshes.empty()) {
    if (absl::Status s = ParseGivenMeshes(req, raw); !s.ok()) return s;
  } else {
    SearchMeshes(req, ms, raw);
  }
  std::vector<Candidate> out;
  const double elem = ElemBytes(ms.dtype);
  const double n_params = ModelParameters(**model);
  for (const Candidate& c : raw) {
    const int tp = c.mesh.size(axis::kTp);
    if (tp > gpn && !req.tp_across_nodes && req.only_meshes.empty()) {
      refused->push_back({c.Name(), absl::StrCat("tp=", tp, " spans more than a node of ", gpn,
                                                 " GPUs (--tp_across_nodes allows it)")});
      continue;
    }
    if (absl::Status s = FrameworkChecks(c, req, ms); !s.ok()) {
      refused->push_back({c.Name(), std::string(s.message())});
      continue;
    }
    // Parameters + gradients + AdamW's two moments, perfectly sharded: a lower bound.
    const double shards = static_cast<double>(tp) * c.mesh.size(axis::kPp) *
                          c.mesh.size(axis::kDpShard) * c.mesh.size(axis::kEp);
    const double floor_bytes = 4 * n_params * elem / shards;
    if (floor_bytes > hw.UsableMemory()) {
      refused->push_back(
          {c.Name(), absl::StrFormat("memory never fits: parameters, gradients and AdamW state "
                                     "alone need >= %.1f GiB per GPU, %.1f GiB usable",
                                     GiB(floor_bytes), GiB(hw.UsableMemory()))});
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::vector<std::string> PlanAssumptions(const PlanRequest& req, const HardwareProfile& hw,
                                         DType compute) {
  std::vector<std::string> a;
  const StepOptions& o = req.step;
  if (o.overlap && hw.cores <= 0) {
    a.push_back(absl::StrFormat(
        "collectives overlap compute as the overlapped trainer schedules them: gradients in "
        "%.0f MiB buckets during the backward, FSDP gathers in %s prefetched %d layer(s) ahead, "
        "reduce-scatters per layer; the first gather and the last bucket are exposed",
        o.bucket_bytes / (1024.0 * 1024), DTypeName(compute),
        o.fsdp_prefetch));
  } else {
    a.push_back(hw.cores > 0 ? "simulated CPU ranks: every collective blocks (inline)"
                             : "--overlap=off: every collective blocks");
  }
  a.push_back(hw.cores > 0
                  ? "pipelines run the trainer's lockstep ticks"
                  : "pipelines run asynchronously (each action when its input has arrived)");
  a.push_back(absl::StrCat(
      "recomputation (rc=): its work from Korthikanti et al. 2022 (arXiv 2205.05198) applied to "
      "the shape-only profile, its memory ",
      req.measure_recompute ? "from a shape-only step with the trainer's --recompute"
                            : "from that accounting too (--recompute_memory=estimate)",
      "; FSDP meshes try reshard_after_forward true and false (keep)"));
  a.push_back("activations and parameters as the framework stores them (shape-only "
              "MemoryTracker), against the profile's usable memory; no NCCL trees, one NIC per "
              "GPU, no stragglers, no data loading");
  if (!req.attention.empty()) {
    a.push_back(req.attention == "flash"
                    ? "attention: the fused (flash) kernel, no scores kept (--attention)"
                    : "attention: materialised scores [b, heads, t, t] (--attention)");
  }
  // Float8 linear layers (torchtitan's Float8, Transformer Engine) are not a compute dtype of
  // this framework's trainer, so the shape-only step cannot run them.
  a.push_back(absl::StrCat(
      "float8 compute (e.g. torchtitan's Float8 linears) is not modelled: GEMMs in ",
      DTypeName(compute), ", activations as that dtype stores them"));
  return a;
}

absl::StatusOr<std::vector<std::string>> PlanAssumptions(const PlanRequest& req,
                                                         const HardwareProfile& hw) {
  absl::StatusOr<std::unique_ptr<Model>> model = RequestModel(req);
  if (!model.ok()) return model.status();
  return PlanAssumptions(req, hw, (*model)->shape().compute_dtype());
}

namespace {

int64_t LocalBatch(const Candidate& c, const PlanRequest& req) {
  int ways = 1;
  for (const char* a : axis::kBatch) ways *= c.mesh.size(a);
  return req.global_batch / ways;
}

// Microbatches (in whole-stage activations) stage s holds at its peak: 1 without a pipeline.
absl::StatusOr<double> InFlight(const PipelineSpec& ps, int stage) {
  if (ps.stages <= 1 && ps.microbatches <= 1) return 1.0;
  absl::StatusOr<Schedule> sched = ParseSchedule(ps.schedule);
  if (!sched.ok()) return sched.status();
  absl::StatusOr<Timetable> tt =
      MakeTimetable(*sched, ps.stages, ps.microbatches, ps.virtual_stages);
  if (!tt.ok()) return tt.status();
  return static_cast<double>(tt->MaxInFlight(std::max(0, stage))) / ps.virtual_stages;
}

// The candidate whose shape-only step is profiled: the work per rank does not depend on the
// interleaving (its chunks are the stage's layers), the recomputation or the resharding
// (applied to the profile afterwards; a recomputing variant's memory is profiled again with the
// trainer's --recompute, PlanRequest::measure_recompute). GPipe is profiled on its own: the trainer's lockstep
// exchange logs other transfers for it than for 1F1B.
Candidate ProfiledCandidate(Candidate c) {
  if (c.pipeline.schedule == "interleaved_1f1b") c.pipeline.schedule = "1f1b";
  c.pipeline.virtual_stages = 1;
  c.recompute = Recompute::kNone;
  c.reshard_after_forward = true;
  return c;
}

bool Interleaved(const Candidate& c) {
  return c.pipeline.schedule == "interleaved_1f1b" && c.pipeline.virtual_stages > 1;
}

// The candidate whose shape-only step gives a variant's memory: the trainer's own schedule
// (interleaved chunks hold activations in another pattern than 1F1B: the last stage holds p + 1
// chunk-microbatches, not one, and its loss and recomputation temporaries do not scale with
// them, so scaling the 1F1B profile by the microbatches in flight was wrong by multiples) with
// the variant's recomputation.
Candidate MemoryCandidate(const Candidate& c, Recompute mode) {
  Candidate m = Interleaved(c) ? c : ProfiledCandidate(c);
  m.recompute = mode;
  m.reshard_after_forward = true;
  return m;
}

// The two short profiles a long one is extrapolated from (profile_reuse.h): the same mesh and
// rows per microbatch with n1 and n1 + 1 microbatches (pipelines: n1 = pp + 1, where every
// stage's schedule has its whole warm-up and a steady 1F1B pair; at n1 = pp stage 0's peak is
// not yet reached; gradient accumulation: n1 = 2, since the first microstep writes the
// gradients and the others add to them), the global batch scaled to match.
struct Repeats {
  Candidate low, high;
  int64_t low_batch = 0, high_batch = 0;
  int n1 = 0, n = 0;
};

std::optional<Repeats> MicrobatchRepeats(const Candidate& key, const PlanRequest& req) {
  if (!req.reuse_profiles) return std::nullopt;
  const bool piped = key.pipeline.stages > 1 || key.pipeline.microbatches > 1;
  // GPipe holds every microbatch's activations: its peak is the larger of those and the
  // optimizer's, a kink no two short steps locate. Profiled in full.
  if (piped && (key.grad_accum > 1 || key.pipeline.schedule == "gpipe")) return std::nullopt;
  Repeats r;
  r.n = piped ? key.pipeline.microbatches : key.grad_accum;
  r.n1 = piped ? key.pipeline.stages + 1 : 2;
  // Interleaved 1F1B: its work is affine in groups of pp microbatches, but its peak is not (it
  // grows by less with each later group: profile_reuse_test), so it is profiled in full.
  if (Interleaved(key)) return std::nullopt;
  // Only where the two short steps run fewer microbatches than the long one.
  if (r.n <= 2 * r.n1 + 1 || req.global_batch % r.n != 0) return std::nullopt;
  r.low = key;
  r.high = key;
  if (piped) {
    r.low.pipeline.microbatches = r.n1;
    r.high.pipeline.microbatches = r.n1 + 1;
  } else {
    r.low.grad_accum = r.n1;
    r.high.grad_accum = r.n1 + 1;
  }
  r.low_batch = req.global_batch / r.n * r.n1;
  r.high_batch = req.global_batch / r.n * (r.n1 + 1);
  return r;
}

bool HasFsdpGather(const RoleWork& w) {
  for (const CollectiveWork& c : w.collectives) {
    if (c.phase == "fsdp" && c.op == "all_gather") return true;
  }
  return false;
}

bool FusedAttention(const RoleWork& w) {
  for (const OtherWork& o : w.others) {
    if (o.attention) return true;
  }
  return false;
}

// One profiled role's activations as the candidate's variant holds them: the schedule's
// microbatches in flight, FSDP's gathered parameters as the overlapped trainer holds them.
// keeps_gathered: the profile holds every FSDP-gathered parameter from its forward use to the
// backward (the reference schedule's tape; not under full recomputation, whose blocks gather
// again in the backward). w's activations become its own (the gathered parameters out); the
// gathered parameters the overlapped trainer holds go to *hold, added by the caller after
// recomputation (which saves activations, not parameters).
// profiled: the pipeline the profile w comes from ran.
absl::Status HeldActivations(const Candidate& c, const PlanRequest& req, const ModelShape& ms,
                             const std::vector<int64_t>& split, bool keeps_gathered,
                             const PipelineSpec& profiled_pipeline, RoleWork& w,
                             double* hold_out) {
  const PipelineSpec& ps = c.pipeline;
  const double scale = DTypeSize(ms.compute_dtype()) / ElemBytes(ms.dtype);
  const int stage = std::max(0, w.pp_stage);
  if (w.layers <= 0) w.layers = static_cast<int>(split[std::min<size_t>(stage, split.size() - 1)]);
  absl::StatusOr<double> profiled = InFlight(profiled_pipeline, stage);
  absl::StatusOr<double> target = InFlight(ps, stage);
  if (!profiled.ok()) return profiled.status();
  if (!target.ok()) return target.status();
  double act = w.activation_peak_bytes, hold = 0, saved = w.saved_activation_peak_bytes;
  // A pipeline stage holds its gathered units for the step under either schedule
  // (models/train/stage_fsdp.h): the profile's memory is the trainer's.
  const bool piped = ps.stages > 1 || ps.microbatches > 1;
  if (req.step.overlap && HasFsdpGather(w) && !piped) {
    // The whole gathered model of the role, as the shape-only step holds it (f32), against
    // prefetch + 1 layers (resharding) or the whole model in the compute dtype (keeping).
    int group = 1;
    for (const CollectiveWork& col : w.collectives) {
      if (col.phase == "fsdp" && col.op == "all_gather") group = std::max(group, col.group_size);
    }
    const int passes = ProfiledCandidate(c).pipeline.microbatches * c.grad_accum;
    const double full = FsdpShardBytes(w, passes) * group;
    if (keeps_gathered) {
      act = std::max(0.0, act - full);
      saved = std::max(0.0, saved - full);
    }
    const double layers_held =
        std::min(1.0, (req.step.fsdp_prefetch + 1.0) / std::max(1, w.layers));
    hold = (c.reshard_after_forward ? layers_held : 1.0) * full * scale;
  }
  act *= *target / *profiled;
  // The summary's figures as the variant runs them: the saved activations scale as the
  // activations do; the gathered parameters are what the overlapped trainer holds.
  w.saved_activation_peak_bytes = saved * *target / *profiled;
  if (hold > 0) w.gathered_peak_bytes = hold;
  w.in_flight = static_cast<int>(std::ceil(*target));
  w.peak_bytes += act - w.activation_peak_bytes;
  w.activation_peak_bytes = act;
  *hold_out = hold;
  return absl::OkStatus();
}

// The role of `roles` on w's pipeline stage (the i-th without a pipeline); null if none.
const RoleWork* SameStage(const std::vector<RoleWork>& roles, const RoleWork& w, size_t i) {
  if (w.pp_stage < 0) return i < roles.size() ? &roles[i] : nullptr;
  for (const RoleWork& r : roles) {
    if (r.pp_stage == w.pp_stage) return &r;
  }
  return nullptr;
}

// The profiled roles as the candidate's variant runs them (HeldActivations), and its
// recomputation: the work from req.recompute_estimator; the memory from it too, or, given
// `measured` (MemoryCandidate's roles: profiled with the trainer's own --recompute), from that.
// own: an interleaved candidate's roles profiled with its own schedule (MemoryCandidate without
// recomputation): their memory replaces the 1F1B profile's before recomputation applies.
absl::StatusOr<std::vector<RoleWork>> VariantRoles(const std::vector<RoleWork>& base,
                                                   const Candidate& c, const PlanRequest& req,
                                                   const ModelShape& ms,
                                                   const std::vector<RoleWork>* measured,
                                                   const std::vector<RoleWork>* own = nullptr) {
  const PipelineSpec& ps = c.pipeline;
  const bool piped = ps.stages > 1 || ps.microbatches > 1;
  absl::StatusOr<std::vector<int64_t>> split =
      piped ? SplitLayers(ms.layers, ps.stages)
            : absl::StatusOr<std::vector<int64_t>>(std::vector<int64_t>{ms.layers});
  if (!split.ok()) return split.status();
  if (measured != nullptr && measured->size() != base.size()) {
    return absl::InternalError(absl::StrCat("the recomputing profile of ", c.Name(), " has ",
                                            measured->size(), " roles; the reference has ",
                                            base.size()));
  }
  const PipelineSpec memory_pipeline = MemoryCandidate(c, c.recompute).pipeline;
  std::vector<RoleWork> out;
  for (size_t i = 0; i < base.size(); ++i) {
    RoleWork w = base[i];
    PipelineSpec profiled = ProfiledCandidate(c).pipeline;
    if (own != nullptr) {
      const RoleWork* o = SameStage(*own, w, i);
      if (o == nullptr) {
        return absl::InternalError(absl::StrCat("the profile of ", c.Name(),
                                                " has no role for stage ", w.pp_stage));
      }
      w.activation_peak_bytes = o->activation_peak_bytes;
      w.peak_bytes = o->peak_bytes;
      profiled = memory_pipeline;
    }
    double hold = 0;
    if (absl::Status s = HeldActivations(c, req, ms, *split, req.shape_only_keeps_gathered,
                                         profiled, w, &hold);
        !s.ok()) {
      return s;
    }
    if (c.recompute != Recompute::kNone) {
      RecomputeShape sh;
      sh.config = ms;
      sh.config.seq = ms.seq / c.mesh.size(axis::kCp);
      sh.tp = c.mesh.size(axis::kTp);
      // The block's weights as this mesh splits them (the candidate's own layout).
      absl::StatusOr<std::unique_ptr<Model>> layout = CandidateLayout(c, req);
      if (!layout.ok()) return layout.status();
      sh.block_matmuls = BlockMatmuls(**layout, sh.tp);
      sh.sp = c.sp;
      const int64_t passes = static_cast<int64_t>(ps.microbatches) * c.grad_accum;
      sh.microbatch_rows = std::max<int64_t>(1, LocalBatch(c, req) / passes);
      sh.passes = passes;
      sh.fused_attention = FusedAttention(w);
      absl::StatusOr<RoleWork> r = req.recompute_estimator(w, c.recompute, sh);
      if (!r.ok()) return r.status();
      // The saved activations shrink as the estimator's activations do.
      const double kept = w.activation_peak_bytes > 0
                              ? r->activation_peak_bytes / w.activation_peak_bytes : 1.0;
      r->saved_activation_peak_bytes = w.saved_activation_peak_bytes * kept;
      w = *std::move(r);
    }
    if (measured != nullptr) {
      const RoleWork* mp = SameStage(*measured, base[i], i);
      if (mp == nullptr) {
        return absl::InternalError(absl::StrCat("the recomputing profile of ", c.Name(),
                                                " has no role for stage ", base[i].pp_stage));
      }
      RoleWork m = *mp;
      const bool keeps = req.shape_only_keeps_gathered && c.recompute != Recompute::kFull;
      if (absl::Status s = HeldActivations(c, req, ms, *split, keeps, memory_pipeline, m, &hold);
          !s.ok()) {
        return s;
      }
      w.activation_peak_bytes = m.activation_peak_bytes;
      w.peak_bytes = m.peak_bytes;
      w.saved_activation_peak_bytes = m.saved_activation_peak_bytes;
    }
    w.activation_peak_bytes += hold;
    w.saved_activation_peak_bytes += hold;
    w.peak_bytes += hold;
    out.push_back(std::move(w));
  }
  return out;
}

// The variants of one profiled candidate: recomputation x (FSDP) resharding.
std::vector<Candidate> Variants(const Candidate& c, const PlanRequest& req) {
  std::vector<Recompute> rcs = c.fixed_recompute ? std::vector<Recompute>{c.recompute} : req.recompute;
  if (rcs.empty()) rcs = {Recompute::kNone};
  std::vector<bool> reshards = {c.reshard_after_forward};
  if (!c.fixed_reshard && req.step.overlap && c.mesh.size(axis::kDpShard) > 1 &&
      !req.reshard_after_forward.empty()) {
    reshards = req.reshard_after_forward;
  }
  std::vector<Candidate> out;
  for (Recompute r : rcs) {
    for (bool keep_not : reshards) {
      Candidate v = c;
      v.recompute = r;
      v.reshard_after_forward = keep_not;
      out.push_back(v);
    }
  }
  return out;
}

struct Evaluated {
  std::optional<PlanRow> best_fit, smallest;
  double persistent = 0, activation = 0;  // of the no-recompute variant's largest role
};

// The candidate's roles profiled with the trainer's own recomputation `mode` and its own
// schedule (shape-only, MemoryCandidate).
using RecomputingProfile =
    std::function<const absl::StatusOr<std::vector<RoleWork>>&(Recompute mode)>;

absl::StatusOr<Evaluated> Evaluate(const Candidate& c, const std::vector<RoleWork>& roles,
                                   const PlanRequest& req, const ModelShape& ms,
                                   const HardwareProfile& node,
                                   const Plan& plan, const RecomputingProfile& recomputing) {
  Evaluated e;
  const auto peak = node.peak_flops.find(ms.compute_dtype());
  std::vector<Candidate> variants = Variants(c, req);
  std::stable_partition(variants.begin(), variants.end(),
                        [](const Candidate& v) { return v.recompute == Recompute::kNone; });
  bool every_none_fits = true, any_none = false;
  std::vector<PlanRow> rows;
  std::ptrdiff_t smallest = -1, best_fit = -1;
  for (const Candidate& v : variants) {
    const std::vector<RoleWork>* measured = nullptr;
    const std::vector<RoleWork>* own = nullptr;
    if (Interleaved(v)) {
      const absl::StatusOr<std::vector<RoleWork>>& o = recomputing(Recompute::kNone);
      if (!o.ok()) return o.status();  // PlanGpt refuses the mesh before (its own step failed)
      own = &*o;
    }
    if (v.recompute != Recompute::kNone && req.measure_recompute) {
      // A variant without recomputation that fits beats the same schedule recomputing.
      if (any_none && every_none_fits) continue;
      const absl::StatusOr<std::vector<RoleWork>>& m = recomputing(v.recompute);
      if (!m.ok()) continue;  // the trainer refuses this recomputation here: not a variant
      measured = &*m;
    }
    absl::StatusOr<std::vector<RoleWork>> vr = VariantRoles(roles, v, req, ms, measured, own);
    if (!vr.ok()) continue;  // e.g. recomputation of a role without layers: not a variant
    StepOptions o = req.step;
    o.reshard_after_forward = v.reshard_after_forward;
    o.grad_accum = v.pipeline.stages > 1 || v.pipeline.microbatches > 1 ? 1 : v.grad_accum;
    o.gather_scale = DTypeSize(ms.compute_dtype()) / ElemBytes(ms.dtype);
    absl::StatusOr<StepPrediction> p = PredictStep(*vr, v.mesh, v.pipeline, node, o);
    if (!p.ok()) return p.status();
    PlanRow row{v, *p};
    row.tokens_per_s = plan.tokens_per_step / p->step_s;
    row.mfu = peak == node.peak_flops.end()
                  ? 0
                  : plan.model_flops_per_step / (p->step_s * req.gpus * peak->second);
    row.fits = p->peak_bytes <= node.UsableMemory();
    if (v.recompute == Recompute::kNone) {
      any_none = true;
      every_none_fits = every_none_fits && row.fits;
    }
    row.roles = *std::move(vr);
    if (v.recompute == Recompute::kNone && v.reshard_after_forward) {
      for (const RoleWork& w : row.roles) {
        if (w.peak_bytes > e.persistent + e.activation) {
          e.activation = w.activation_peak_bytes;
          e.persistent = w.peak_bytes - w.activation_peak_bytes;
        }
      }
    }
    // Rows are kept by index and moved out once: their roles are large (a copy per better
    // row cost a long search a quarter of its time).
    const std::ptrdiff_t at = static_cast<std::ptrdiff_t>(rows.size());
    if (smallest < 0 || p->peak_bytes < rows[smallest].prediction.peak_bytes) smallest = at;
    if (row.fits && (best_fit < 0 || p->step_s < rows[best_fit].prediction.step_s)) best_fit = at;
    rows.push_back(std::move(row));
  }
  if (best_fit >= 0 && best_fit == smallest) {
    e.smallest = rows[smallest];
    e.best_fit = std::move(rows[best_fit]);
  } else {
    if (smallest >= 0) e.smallest = std::move(rows[smallest]);
    if (best_fit >= 0) e.best_fit = std::move(rows[best_fit]);
  }
  return e;
}

// The fewest microsteps above `ga` (a divisor of the local batch) whose activations, scaled
// from this profile, fit; 0 when none does.
int NextGradAccum(const Candidate& c, const PlanRequest& req, const Evaluated& e, double usable) {
  const int64_t local = LocalBatch(c, req);
  for (int64_t g = c.grad_accum + 1; g <= local; ++g) {
    if (local % g != 0) continue;
    if (e.persistent + e.activation * c.grad_accum / g <= usable) return static_cast<int>(g);
  }
  return 0;
}

// The plan's header: the question, the model's size and work, the hardware's figures.
void StartPlan(const PlanRequest& req, const HardwareProfile& hw, const Model& model,
               Plan* plan) {
  const ModelShape ms = model.shape();
  plan->gpus = req.gpus;
  plan->gpus_per_node = req.gpus_per_node > 0 ? req.gpus_per_node : hw.gpus_per_node;
  plan->profile_name = hw.name;
  plan->usable_memory = hw.UsableMemory();
  plan->parameters = ModelParameters(model);
  plan->model_flops_per_step = ModelFlopsPerStep(model, req.global_batch);
  plan->tokens_per_step = req.global_batch * ms.seq;
  plan->dtype = absl::StrCat(DTypeName(ms.compute_dtype()), " compute, ", DTypeName(ms.dtype),
                             " parameters, gradients and AdamW state");
  plan->assumptions = PlanAssumptions(req, hw, ms.compute_dtype());
  plan->time_limit_s = req.time_limit_s;
}

// Profiles by what the shape-only step runs (schedule, recomputation and resharding are applied
// afterwards): each distinct one once; many microbatches (or microsteps) from two profiles of
// few (profile_reuse.h), when the request allows. Counts its runs and their time in `plan`.
class ProfileCache {
 public:
  using Work = absl::StatusOr<std::vector<RoleWork>>;
  ProfileCache(const PlanRequest& req, const Profiler& profiler, Plan* plan)
      : req_(req), profiler_(profiler), plan_(plan) {}

  // The candidate's roles as the shape-only step of ProfiledCandidate(c) gives them.
  const Work& Profiled(const Candidate& c) { return ProfiledKey(ProfiledCandidate(c)); }

  const Work& ProfiledKey(const Candidate& key) {
    auto it = cache_.find(key.Name());
    if (it != cache_.end()) return it->second;
    if (std::optional<Repeats> rep = MicrobatchRepeats(key, req_); rep.has_value()) {
      const Work& lo = Run(rep->low, rep->low_batch);
      const Work& hi = Run(rep->high, rep->high_batch);
      if (lo.ok() && hi.ok()) {
        Work w = ExtrapolateMicrobatches(*lo, *hi, rep->n1, rep->n);
        if (w.ok()) {
          ++plan_->extrapolated;
          return cache_.emplace(key.Name(), std::move(w)).first->second;
        }
      }
    }
    return Run(key, req_.global_batch);
  }

 private:
  const Work& Run(const Candidate& key, int64_t batch) {
    const std::string name =
        batch == req_.global_batch ? key.Name() : absl::StrCat(key.Name(), " @batch ", batch);
    auto it = cache_.find(name);
    if (it != cache_.end()) return it->second;
    PlanRequest r = req_;
    r.global_batch = batch;
    const auto t0 = std::chrono::steady_clock::now();
    Work w = profiler_(key, r);
    plan_->profile_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++plan_->profiled;
    return cache_.emplace(name, std::move(w)).first->second;
  }

  const PlanRequest& req_;
  const Profiler& profiler_;
  Plan* plan_;
  std::map<std::string, Work> cache_;
};

// One candidate priced: its fastest fitting row (best), its smallest row (smallest), or why its
// shape-only step failed (failed); `name` is the last candidate tried (its microsteps raised).
struct Priced {
  std::optional<PlanRow> best, smallest;
  absl::Status failed;
  std::string name;
};

// Prices candidate `c` (with more microsteps while that may fit without recomputation). An
// error is a profile that cannot price this work (the user's to fix); `failed` is a mesh the
// shape-only step refuses.
absl::StatusOr<Priced> PriceCandidate(Candidate c, const PlanRequest& req, const ModelShape& ms,
                                      const HardwareProfile& hw, const HardwareProfile& node,
                                      const Plan& plan, ProfileCache& profiles) {
  Priced out;
  std::optional<PlanRow>& best = out.best;
  std::optional<PlanRow>& smallest = out.smallest;
  const bool piped = c.pipeline.stages > 1 || c.pipeline.microbatches > 1;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const absl::StatusOr<std::vector<RoleWork>>& roles = profiles.Profiled(c);
    if (!roles.ok()) {
      out.failed = roles.status();
      break;
    }
    const RecomputingProfile recomputing =
        [&](Recompute mode) -> const absl::StatusOr<std::vector<RoleWork>>& {
      return profiles.ProfiledKey(MemoryCandidate(c, mode));
    };
    // The interleaved schedule's memory is its own step's (MemoryCandidate).
    if (Interleaved(c)) {
      const absl::StatusOr<std::vector<RoleWork>>& own = recomputing(Recompute::kNone);
      if (!own.ok()) {
        out.failed = own.status();
        break;
      }
    }
    absl::StatusOr<Evaluated> e = Evaluate(c, *roles, req, ms, node, plan, recomputing);
    if (!e.ok()) return e.status();
    if (e->best_fit && (!best || e->best_fit->prediction.step_s < best->prediction.step_s)) {
      best = std::move(e->best_fit);
    }
    if (e->smallest && (!smallest || e->smallest->prediction.peak_bytes <
                                         smallest->prediction.peak_bytes)) {
      smallest = std::move(e->smallest);
    }
    // Without a pipeline, fewer activations per microstep may fit without recomputation.
    if (piped || c.fixed_grad_accum ||
        (best && (best->candidate.recompute == Recompute::kNone || c.fixed_recompute))) {
      break;
    }
    const int next = NextGradAccum(c, req, *e, hw.UsableMemory());
    if (next == 0 || e->persistent >= hw.UsableMemory()) break;
    c.grad_accum = next;
  }
  out.name = c.Name();
  return out;
}

// Rows by step time, out-of-memory rows by peak, each mesh once, each refusal once; an error
// when no mesh is left to show.
absl::Status FinishPlan(const PlanRequest& req, Plan& plan) {
  std::stable_sort(plan.rows.begin(), plan.rows.end(), [](const PlanRow& a, const PlanRow& b) {
    return a.prediction.step_s < b.prediction.step_s;
  });
  std::stable_sort(plan.unfit.begin(), plan.unfit.end(), [](const PlanRow& a, const PlanRow& b) {
    return a.prediction.peak_bytes < b.prediction.peak_bytes;
  });
  // Two --mesh specs can end as one row (one leaves recomputation to the search, which picks
  // what the other names): each mesh once.
  for (std::vector<PlanRow>* rows : {&plan.rows, &plan.unfit}) {
    std::set<std::string> seen;
    rows->erase(std::remove_if(rows->begin(), rows->end(),
                               [&seen](const PlanRow& r) {
                                 return !seen.insert(r.candidate.Name()).second;
                               }),
                rows->end());
  }
  std::set<std::pair<std::string, std::string>> said;
  plan.refused.erase(std::remove_if(plan.refused.begin(), plan.refused.end(),
                                    [&said](const Refusal& r) {
                                      return !said.insert({r.candidate, r.reason}).second;
                                    }),
                     plan.refused.end());
  if (!plan.rows.empty() || !plan.unfit.empty()) return absl::OkStatus();
  std::string reasons;
  for (size_t i = 0; i < plan.refused.size() && i < 5; ++i) {
    absl::StrAppend(&reasons, "\n  ", plan.refused[i].candidate, ": ", plan.refused[i].reason);
  }
  return absl::FailedPreconditionError(
      absl::StrCat(plan.stopped
                       ? absl::StrCat("stopped at the time limit (", req.time_limit_s, " s) with ",
                                      plan.unpriced,
                                      " meshes not priced, and none of those priced runs: ")
                       : std::string(),
                   "no mesh of ", req.gpus, " GPUs can run this model (", plan.refused.size(),
                   " refused), e.g.:", reasons));
}

}  // namespace

absl::StatusOr<Plan> PlanGpt(const PlanRequest& request, const HardwareProfile& hw,
                             const Profiler& profiler) {
  // Simulated CPU ranks run their collectives inline (nothing overlaps; the shape-only step's
  // memory is theirs).
  PlanRequest req = request;
  if (hw.cores > 0 && !req.step.simulated_link) req.step.overlap = false;
  Plan plan;
  absl::StatusOr<std::vector<Candidate>> cands = EnumerateCandidates(req, hw, &plan.refused);
  if (!cands.ok()) return cands.status();
  plan.candidates = static_cast<int>(cands->size() + plan.refused.size());
  absl::StatusOr<std::unique_ptr<Model>> model = RequestModel(req);
  if (!model.ok()) return model.status();
  StartPlan(req, hw, **model, &plan);
  const ModelShape ms = (*model)->shape();
  HardwareProfile node = hw;
  node.gpus_per_node = plan.gpus_per_node;
  ProfileCache profiles(req, profiler, &plan);
  int done = 0;
  const auto now = [&req] {
    if (req.clock) return req.clock();
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const double start = now();
  double best_step = std::numeric_limits<double>::infinity();
  for (size_t ci = 0; ci < cands->size(); ++ci) {
    if (req.time_limit_s > 0 && ci > 0 && now() - start > req.time_limit_s) {
      plan.stopped = true;
      plan.unpriced = static_cast<int>(cands->size() - ci);
      break;
    }
    absl::StatusOr<Priced> priced =
        PriceCandidate((*cands)[ci], req, ms, hw, node, plan, profiles);
    if (!priced.ok()) return priced.status();  // a profile that cannot price this work
    std::optional<PlanRow>& best = priced->best;
    std::optional<PlanRow>& smallest = priced->smallest;
    if (req.progress) req.progress(++done, static_cast<int>(cands->size()));
    if (!priced->failed.ok()) {
      plan.refused.push_back(
          {priced->name, absl::StrCat("shape-only run: ", priced->failed.message())});
      continue;
    }
    if (best) {
      if (req.on_best && best->prediction.step_s < best_step) {
        best_step = best->prediction.step_s;
        req.on_best(best->candidate.Name(), best_step);
      }
      plan.rows.push_back(*std::move(best));
      continue;
    }
    if (!smallest) continue;
    plan.refused.push_back(
        {smallest->candidate.Name(),
         absl::StrCat("out of memory: ",
                      PeakOverUsable(smallest->prediction.peak_bytes, hw.UsableMemory()),
                      " (predicted step ", Seconds(smallest->prediction.step_s), ")")});
    plan.unfit.push_back(*std::move(smallest));
  }
  if (absl::Status s = FinishPlan(req, plan); !s.ok()) return s;
  return plan;
}

absl::StatusOr<StepPrediction> PredictOnSimulatedLink(const PlanRequest& request,
                                                      const std::string& mesh,
                                                      const HardwareProfile& cpu, const Link& link,
                                                      const StepOptions& options,
                                                      const Profiler& profiler) {
  if (!(link.busbw > 0) || link.alpha_s < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "simulated link: bandwidth ", link.busbw, " B/s must be > 0 and latency ", link.alpha_s,
        " s >= 0"));
  }
  HardwareProfile hw = cpu;
  hw.intra = link;
  hw.inter = link;
  hw.lane_cpu = std::move(hw.fitted);  // started calls' in-process work, on the ranks' cores
  hw.fitted.clear();  // every collective is the link's alpha + bytes / bandwidth
  hw.gpus_per_node = 1 << 20;
  PlanRequest r = request;
  r.only_meshes = {mesh};
  r.step = options;
  r.step.simulated_link = true;
  r.recompute = {Recompute::kNone};
  r.reshard_after_forward = {options.reshard_after_forward};
  r.gpus_per_node = hw.gpus_per_node;
  absl::StatusOr<Plan> plan = PlanGpt(r, hw, profiler);
  if (!plan.ok()) return plan.status();
  if (!plan->rows.empty()) return plan->rows[0].prediction;
  if (!plan->unfit.empty()) return plan->unfit[0].prediction;
  return absl::FailedPreconditionError(absl::StrCat("mesh ", mesh, " was refused: ",
                                                    plan->refused.empty()
                                                        ? std::string("no reason")
                                                        : plan->refused[0].reason));
}

std::string FormatPlan(const Plan& plan, int top, bool list_refusals) {
  std::ostringstream o;
  o << absl::StrFormat(
      "plan: %.3g B parameters, %lld tokens/step, %.3g PFLOP/step on %d GPUs (%d per node), "
      "profile %s (%.1f GiB usable per GPU), %s\n",
      plan.parameters / 1e9, static_cast<long long>(plan.tokens_per_step),
      plan.model_flops_per_step / 1e15, plan.gpus, plan.gpus_per_node, plan.profile_name,
      GiB(plan.usable_memory), plan.dtype);
  for (const std::string& a : plan.assumptions) o << "assumes: " << a << "\n";
  if (plan.stopped) {
    o << absl::StrFormat(
        "stopped at the time limit (%.4g s): %d meshes not priced; the ranking is the best of "
        "those priced so far (raise --time_limit, or narrow the search: --max_pp, --schedules, "
        "--microbatch_factors, --mesh)\n",
        plan.time_limit_s, plan.unpriced);
  }
  o << absl::StrFormat(
      "%d candidates, %d profiled shape-only in %.2f s%s, %zu ranked, %zu refused\n\n",
      plan.candidates, plan.profiled, plan.profile_seconds,
      plan.extrapolated > 0
          ? absl::StrFormat(" (%d more extrapolated from them)", plan.extrapolated)
          : std::string(),
      plan.rows.size(), plan.refused.size());
  auto header = [&o] {
    o << absl::StrFormat("%4s  %-40s %11s %12s %6s %9s %10s %10s %7s\n", "rank", "mesh", "step",
                         "tokens/s", "MFU", "mem GiB", "compute", "comm exp", "bubble");
  };
  auto line = [&o](const std::string& rank, const PlanRow& r) {
    const StepPrediction& p = r.prediction;
    o << absl::StrFormat("%4s  %-40s %11s %12.4g %5.1f%% %9.2f %10s %10s %6.1f%%\n", rank,
                         r.candidate.Name(), Seconds(p.step_s), r.tokens_per_s, 100 * r.mfu,
                         GiB(p.peak_bytes), Seconds(p.compute_s),
                         Seconds(p.blocking_comm_s + p.exposed_comm_s), 100 * p.bubble);
  };
  if (plan.rows.empty() && !plan.unfit.empty()) {
    o << absl::StrFormat(
        "no mesh fits %s's %.1f GiB: the smallest peak is %.1f GiB per GPU (%s); use more GPUs, "
        "a smaller batch or more microbatches. Their prices, smallest peak first:\n",
        plan.profile_name, GiB(plan.usable_memory), GiB(plan.unfit[0].prediction.peak_bytes),
        plan.unfit[0].candidate.Name());
  }
  header();
  const int n = top <= 0 ? static_cast<int>(plan.rows.size())
                         : std::min<int>(top, static_cast<int>(plan.rows.size()));
  for (int i = 0; i < n; ++i) line(absl::StrCat(i + 1), plan.rows[i]);
  const int nu = std::min<int>(plan.rows.empty() ? std::max(top, 5) : 5,
                               static_cast<int>(plan.unfit.size()));
  if (nu > 0 && !plan.rows.empty()) o << "  does not fit (priced anyway, smallest peak first):\n";
  for (int i = 0; i < nu; ++i) line("OOM", plan.unfit[i]);
  if (n < static_cast<int>(plan.rows.size())) {
    o << absl::StrFormat("      ... %zu more ranked meshes (--top=0 shows all)\n",
                         plan.rows.size() - n);
  }
  // Memory with the trainer summary's parts (the largest role's; FSDP padding included).
  o << "\nmemory per rank of the top meshes (largest role), as the trainer's summary reports it:\n";
  for (int i = 0; i < std::min(n, 5); ++i) {
    o << "  " << plan.rows[i].candidate.Name() << ": " << FormatMemory(plan.rows[i].prediction.memory)
      << "\n";
  }
  o << "\ncollectives per step of the top meshes (bytes one rank sends, by kind and axes; "
       "seconds before overlap):\n";
  for (int i = 0; i < std::min(n, 5); ++i) {
    const PlanRow& r = plan.rows[i];
    o << "  " << r.candidate.Name() << ":";
    if (r.prediction.bytes_by_kind.empty()) o << " none";
    for (const auto& [kind, bytes] : r.prediction.bytes_by_kind) {
      const auto s = r.prediction.seconds_by_kind.find(kind);
      o << "  " << kind << " " << Bytes(bytes) << " ("
        << Seconds(s == r.prediction.seconds_by_kind.end() ? 0 : s->second) << ")";
    }
    o << "\n";
  }
  if (list_refusals && !plan.refused.empty()) {
    // One line per reason (a mesh's schedule / microbatch variants usually share one).
    std::vector<std::pair<std::string, std::vector<std::string>>> by_reason;
    for (const Refusal& r : plan.refused) {
      auto it = std::find_if(by_reason.begin(), by_reason.end(),
                             [&](const auto& g) { return g.first == r.reason; });
      if (it == by_reason.end()) {
        by_reason.push_back({r.reason, {r.candidate}});
      } else {
        it->second.push_back(r.candidate);
      }
    }
    o << "\nrefused (" << plan.refused.size() << "):\n";
    for (const auto& [reason, names] : by_reason) {
      o << "  " << absl::StrJoin(names, "; ") << ": " << reason << "\n";
    }
  }
  return o.str();
}

}  // namespace shardmap::planner
