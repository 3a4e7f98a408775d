#include "models/planner/shape_only_source.h"

#include <algorithm>
#include <map>
#include <optional>

#include "models/train/gpt_shape_only.h"
#include "models/parallel/parallel_dims.h"
#include "models/parallel/pipeline.h"
#include "models/planner/profile_reuse.h"
#include "models/train/run_plan.h"
#include "models/train/trainer.h"

namespace shardmap::planner {

namespace {
bool Has(const std::vector<std::string>& axes, const char* a) {
  return std::find(axes.begin(), axes.end(), a) != axes.end();
}
}  // namespace

std::string CollectivePhase(const CollectiveTraffic& c) {
  if (Has(c.axes, axis::kDpShard) && (c.op == "all_gather" || c.op == "reduce_scatter")) {
    return "fsdp";
  }
  if (Has(c.axes, axis::kPp)) return c.phase == "optimizer" ? "tied" : "pp";
  if (c.phase == "optimizer") return c.op == "all_reduce" && c.bytes > 64 ? "grad" : "norm";
  if (Has(c.axes, axis::kTp)) return "tp";
  if (Has(c.axes, axis::kCp)) return "cp";
  if (Has(c.axes, axis::kEp)) return "ep";
  return "";
}

RoleWork ToRoleWork(const StepProfile& p, int stage) {
  RoleWork w;
  w.role = p.role;
  w.ranks = static_cast<int>(std::max<size_t>(1, p.ranks_like_this.size()));
  w.pp_stage = stage;
  for (const GemmCount& g : p.gemms) {
    w.gemms.push_back({.batch = g.batch, .m = g.m, .n = g.n, .k = g.k, .dtype = g.dtype,
                       .count = g.count, .trans_a = g.trans_a, .trans_b = g.trans_b});
  }
  for (const OpTotal& o : p.ops) {
    w.op_count += o.count;
    // GEMM ops are priced by their shapes; the rest by their bytes and FLOPs.
    if (IsGemmOpName(o.op)) continue;
    OtherWork ow{o.op, o.dtype, o.flops, o.bytes};
    ow.attention = o.op.find("attention") != std::string::npos;
    w.others.push_back(ow);
  }
  for (const CollectiveTraffic& c : p.collectives) {
    w.collectives.push_back({c.op, c.axes, static_cast<int>(c.group_size),
                             static_cast<double>(c.bytes), c.backward, CollectivePhase(c)});
  }
  w.param_bytes = static_cast<double>(p.parameter_bytes);
  w.grad_bytes = static_cast<double>(p.gradient_bytes);
  w.optimizer_bytes = static_cast<double>(p.optimizer_bytes);
  w.activation_peak_bytes = static_cast<double>(p.activation_peak_bytes);
  w.peak_bytes = static_cast<double>(p.peak_bytes);
  w.saved_activation_peak_bytes = static_cast<double>(p.saved_activation_peak_bytes);
  w.gathered_peak_bytes = static_cast<double>(p.gathered_peak_bytes);
  w.peak_after_backward = p.step_tensor_peak_bytes > p.backprop_tensor_peak_bytes;
  return w;
}

namespace {

// Microbatches each stage holds at its peak in the trainer's schedule (the timetable's).
absl::StatusOr<std::vector<int>> StageInFlights(const TrainOptions& o, int stages) {
  absl::StatusOr<Schedule> sched = ParseSchedule(o.pipeline.schedule);
  if (!sched.ok()) return sched.status();
  // Interleaved: chunk-microbatches in flight (a chunk's activations are the stage's / v).
  absl::StatusOr<Timetable> tt =
      MakeTimetable(*sched, stages, o.pipeline.microbatches, o.pipeline.virtual_stages);
  if (!tt.ok()) return tt.status();
  std::vector<int> f;
  for (int s = 0; s < stages; ++s) f.push_back(tt->MaxInFlight(s));
  return f;
}

// One role per stage of a pipeline: the first and the last stage profiled, and of the middle
// stages of each layer count (more than three) the first two and the last; the others from
// them when those run the same work at one peak (one in-flight count) or at peaks on one line
// through three in-flight counts (profile_reuse.h's StageInFlight), else profiled too.
absl::StatusOr<std::vector<RoleWork>> SharedStageRoles(const Model& layout,
                                                       const TrainOptions& o,
                                                       const std::vector<GptRankRole>& ranks,
                                                       Device device) {
  const int p = static_cast<int>(ranks.size());
  absl::StatusOr<RunPlan> plan = PlanRun(layout, o);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<std::vector<int>> in_flight = StageInFlights(o, p);
  if (!in_flight.ok()) return in_flight.status();
  std::vector<std::optional<RoleWork>> work(p);
  auto profile = [&](int s) -> absl::Status {
    absl::StatusOr<StepProfile> sp =
        ProfileGptRank(layout, o, ranks[s].rank, ranks[s].role, device);
    if (!sp.ok()) return sp.status();
    work[s] = ToRoleWork(*sp, s);
    return absl::OkStatus();
  };
  std::map<int64_t, std::vector<int>> groups;  // middle stages by layer count
  for (int s = 0; s < p; ++s) {
    if (s == 0 || s == p - 1) {
      if (absl::Status st = profile(s); !st.ok()) return st;
    } else {
      groups[plan->stage_plan.layers[s]].push_back(s);
    }
  }
  for (const auto& [layers, stages] : groups) {
    if (stages.size() <= 3) {
      for (int s : stages) {
        if (absl::Status st = profile(s); !st.ok()) return st;
      }
      continue;
    }
    // The first two and the last of the group: in-flight counts fall with the stage.
    const int a = stages[0], b = stages[1], z = stages.back();
    for (int s : {a, b, z}) {
      if (absl::Status st = profile(s); !st.ok()) return st;
    }
    const RoleWork &wa = *work[a], &wb = *work[b], &wz = *work[z];
    const double fa = (*in_flight)[a], fb = (*in_flight)[b], fz = (*in_flight)[z];
    const bool same = SameStageWork(wa, wb) && SameStageWork(wa, wz);
    // All at one in-flight count: the same program in another order, the same peak.
    const bool flat = same && fa == fz && wa.peak_bytes == wz.peak_bytes &&
                      wb.peak_bytes == wa.peak_bytes;
    // Three distinct counts on one line: the peak, a maximum over the step of terms affine in
    // the activations in flight (convex in them), equals the line between the outer two.
    const bool line =
        same && fa > fb && fb > fz &&
        (wa.peak_bytes - wb.peak_bytes) * (fb - fz) == (wb.peak_bytes - wz.peak_bytes) * (fa - fb);
    for (int s : stages) {
      if (work[s].has_value()) continue;
      absl::StatusOr<RoleWork> w = absl::FailedPreconditionError("profiled");
      if (flat) {
        w = wa;
      } else if (line) {
        w = StageInFlight(wa, static_cast<int>(fa), wb, static_cast<int>(fb), (*in_flight)[s],
                          s, ranks[s].role);
      }
      if (w.ok()) {
        w->pp_stage = s;
        w->role = ranks[s].role;
        work[s] = *std::move(w);
      } else if (absl::Status st = profile(s); !st.ok()) {
        return st;
      }
    }
  }
  std::vector<RoleWork> roles;
  for (std::optional<RoleWork>& w : work) roles.push_back(*std::move(w));
  return roles;
}

}  // namespace

Profiler ShapeOnlyProfiler(Device device, bool share_stages) {
  return [device, share_stages](const Candidate& c, const PlanRequest& req)
             -> absl::StatusOr<std::vector<RoleWork>> {
    absl::StatusOr<std::unique_ptr<Model>> made = CandidateLayout(c, req);
    if (!made.ok()) return made.status();
    const Model& layout = **made;
    const Mesh* mesh = &layout.mesh();
    const TrainOptions o = CandidateTrainOptions(c, req);
    absl::StatusOr<std::vector<GptRankRole>> ranks = GptRankRoles(layout, o);
    if (!ranks.ok()) return ranks.status();
    const int pp_axis = mesh->AxisIndex(axis::kPp);
    if (share_stages && pp_axis >= 0 && ranks->size() > 3) {
      return SharedStageRoles(layout, o, *ranks, device);
    }
    std::vector<StepProfile> profiles;
    for (const GptRankRole& r : *ranks) {
      absl::StatusOr<StepProfile> p = ProfileGptRank(layout, o, r.rank, r.role, device);
      if (!p.ok()) return p.status();
      profiles.push_back(*std::move(p));
    }
    std::vector<RoleWork> roles;
    for (const StepProfile& p : profiles) {
      int stage = -1;
      if (pp_axis >= 0) {
        stage = mesh->Coord(p.rank, pp_axis);
      } else if (c.pipeline.microbatches > 1) {
        stage = 0;
      }
      roles.push_back(ToRoleWork(p, stage));
      // Ranks of the same program but other stages (middle stages share one profile).
      if (pp_axis >= 0) {
        std::vector<int> stages;
        for (int r : p.ranks_like_this) {
          const int s = mesh->Coord(r, pp_axis);
          if (s != stage && std::find(stages.begin(), stages.end(), s) == stages.end()) {
            stages.push_back(s);
          }
        }
        for (int s : stages) {
          roles.push_back(roles.back());
          roles.back().pp_stage = s;
        }
      }
    }
    return roles;
  };
}

}  // namespace shardmap::planner
