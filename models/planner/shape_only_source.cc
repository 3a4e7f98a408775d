#include "models/planner/shape_only_source.h"

#include <algorithm>

#include "models/train/gpt_shape_only.h"
#include "models/parallel/parallel_dims.h"
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
  return w;
}

Profiler ShapeOnlyProfiler(Device device) {
  return [device](const Candidate& c,
                  const PlanRequest& req) -> absl::StatusOr<std::vector<RoleWork>> {
    absl::StatusOr<GptLayout> layout = CandidateLayout(c, req);
    if (!layout.ok()) return layout.status();
    const Mesh* mesh = &layout->mesh();
    const TrainOptions o = CandidateTrainOptions(c, req);
    absl::StatusOr<std::vector<GptRankRole>> ranks = GptRankRoles(*layout, o);
    if (!ranks.ok()) return ranks.status();
    std::vector<StepProfile> profiles;
    for (const GptRankRole& r : *ranks) {
      absl::StatusOr<StepProfile> p = ProfileGptRank(*layout, o, r.rank, r.role, device);
      if (!p.ok()) return p.status();
      profiles.push_back(*std::move(p));
    }
    const int pp_axis = mesh->AxisIndex(axis::kPp);
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
