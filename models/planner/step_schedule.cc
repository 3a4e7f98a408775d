#include "models/planner/step_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "models/parallel/pipeline.h"

namespace shardmap::planner {

absl::StatusOr<TwoLaneTimes> RunTwoLanes(const std::vector<LaneTask>& compute,
                                         const std::vector<LaneTask>& comm) {
  const int nc = static_cast<int>(compute.size()), nm = static_cast<int>(comm.size());
  for (int i = 0; i < nc; ++i) {
    if (compute[i].after < -1 || compute[i].after >= nm) {
      return absl::InvalidArgumentError(absl::StrCat("compute task ", i, " waits for comm task ",
                                                     compute[i].after, " of ", nm));
    }
  }
  for (int j = 0; j < nm; ++j) {
    if (comm[j].after < -1 || comm[j].after >= nc) {
      return absl::InvalidArgumentError(absl::StrCat("comm task ", j, " waits for compute task ",
                                                     comm[j].after, " of ", nc));
    }
  }
  std::vector<double> cend(nc, -1), mend(nm, -1);
  int i = 0, j = 0;
  double tc = 0, tm = 0;
  TwoLaneTimes out;
  while (i < nc || j < nm) {
    bool moved = false;
    while (i < nc && (compute[i].after < 0 || mend[compute[i].after] >= 0)) {
      const double ready = compute[i].after < 0 ? 0 : mend[compute[i].after];
      tc = std::max(tc, ready) + compute[i].seconds;
      out.busy += compute[i].seconds;
      cend[i++] = tc;
      moved = true;
    }
    while (j < nm && (comm[j].after < 0 || cend[comm[j].after] >= 0)) {
      const double ready = comm[j].after < 0 ? 0 : cend[comm[j].after];
      tm = std::max(tm, ready) + comm[j].seconds;
      mend[j++] = tm;
      moved = true;
    }
    if (!moved) {
      return absl::InvalidArgumentError(absl::StrCat(
          "two-lane schedule: compute task ", i, " and comm task ", j,
          " wait for each other (a cycle in the dependencies)"));
    }
  }
  out.compute_end = tc;
  out.end = std::max(tc, tm);
  return out;
}

absl::StatusOr<double> BucketedBackwardSeconds(
    double backward_s, double grad_bytes, double bucket_bytes,
    const std::function<double(double)>& bucket_seconds) {
  if (!(bucket_bytes > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket size ", bucket_bytes, " bytes must be > 0 (e.g. 25 MiB)"));
  }
  if (grad_bytes <= 0) return backward_s;
  const int k = static_cast<int>(std::ceil(grad_bytes / bucket_bytes));
  std::vector<LaneTask> compute, comm;
  for (int b = 0; b < k; ++b) {
    const double bytes = b + 1 < k ? bucket_bytes : grad_bytes - bucket_bytes * (k - 1);
    compute.push_back({backward_s * bytes / grad_bytes, -1});
    comm.push_back({bucket_seconds(bytes), b});
  }
  absl::StatusOr<TwoLaneTimes> t = RunTwoLanes(compute, comm);
  if (!t.ok()) return t.status();
  return t->end;
}

namespace {

absl::Status CheckPass(const FsdpPass& p) {
  if (p.layers < 1 || p.prefetch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("FSDP pass with ", p.layers,
                                                   " layers and prefetch ", p.prefetch,
                                                   ": both must be >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> FsdpForwardSeconds(const FsdpPass& p) {
  if (absl::Status s = CheckPass(p); !s.ok()) return s;
  const int L = p.layers, d = p.prefetch;
  const bool gather = p.gather_s > 0;
  std::vector<LaneTask> compute, comm;
  for (int i = 0; i < L; ++i) {
    compute.push_back({p.compute_s / L, gather ? i : -1});
    // At most d + 1 gathered layers: layer i's gather waits for layer i - d - 1 to finish.
    if (gather) comm.push_back({p.gather_s / L, i - d - 1 >= 0 ? i - d - 1 : -1});
  }
  absl::StatusOr<TwoLaneTimes> t = RunTwoLanes(compute, comm);
  if (!t.ok()) return t.status();
  return t->end;
}

absl::StatusOr<double> FsdpBackwardSeconds(const FsdpPass& p) {
  if (absl::Status s = CheckPass(p); !s.ok()) return s;
  const int L = p.layers, d = p.prefetch;
  const bool gather = p.gather_s > 0;
  std::vector<LaneTask> compute(L), comm;
  std::vector<int> gather_index(L, -1);
  auto add_gather = [&](int k) {
    gather_index[k] = static_cast<int>(comm.size());
    comm.push_back({p.gather_s / L, k - d - 1 >= 0 ? k - d - 1 : -1});
  };
  // Program order on the lane: the first d + 1 gathers, then after each layer's backward its
  // reduce-scatter (and HSDP all-reduce), then the gather of the layer d + 1 ahead.
  if (gather) {
    for (int k = 0; k <= d && k < L; ++k) add_gather(k);
  }
  for (int k = 0; k < L; ++k) {
    if (p.reduce_s > 0) comm.push_back({p.reduce_s / L, k});
    if (p.replicate_s > 0) comm.push_back({p.replicate_s / L, k});
    if (gather && k + d + 1 < L) add_gather(k + d + 1);
  }
  for (int k = 0; k < L; ++k) compute[k] = {p.compute_s / L, gather_index[k]};
  absl::StatusOr<TwoLaneTimes> t = RunTwoLanes(compute, comm);
  if (!t.ok()) return t.status();
  return t->end;
}

absl::StatusOr<double> AsyncPipelineSeconds(const std::string& schedule_name, int p, int m, int v,
                                            const std::vector<double>& forward_s,
                                            const std::vector<double>& backward_s,
                                            double boundary_s, double* bubble) {
  absl::StatusOr<Schedule> schedule = ParseSchedule(schedule_name);
  if (!schedule.ok()) return schedule.status();
  if (static_cast<int>(forward_s.size()) != p || static_cast<int>(backward_s.size()) != p) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline times for ", forward_s.size(),
                                                   " stages; the pipeline has ", p));
  }
  std::vector<std::vector<PipeAction>> order(p);
  for (int s = 0; s < p; ++s) {
    absl::StatusOr<std::vector<PipeAction>> o = StageActions(*schedule, p, m, s, v);
    if (!o.ok()) return o.status();
    order[s] = *std::move(o);
  }
  const int last = p * v - 1;
  const double hop = p > 1 ? boundary_s : 0.0;  // consecutive virtual stages sit on other ranks
  std::vector<std::vector<double>> fin_f(p * v, std::vector<double>(m, -1)), fin_b = fin_f;
  std::vector<size_t> next(p, 0);
  std::vector<double> free(p, 0);
  double busy = 0, end = 0;
  size_t left = 0;
  for (const auto& o : order) left += o.size();
  while (left > 0) {
    bool moved = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < order[s].size()) {
        const PipeAction& a = order[s][next[s]];
        const int vs = a.chunk * p + s;
        double ready = 0;
        if (a.kind == PipeAction::kForward) {
          if (vs > 0) {
            if (fin_f[vs - 1][a.microbatch] < 0) break;
            ready = fin_f[vs - 1][a.microbatch] + hop;
          }
        } else if (vs == last) {
          if (fin_f[vs][a.microbatch] < 0) break;
          ready = fin_f[vs][a.microbatch];
        } else {
          if (fin_b[vs + 1][a.microbatch] < 0) break;
          ready = fin_b[vs + 1][a.microbatch] + hop;
        }
        const double d = (a.kind == PipeAction::kForward ? forward_s[s] : backward_s[s]) / v;
        free[s] = std::max(free[s], ready) + d;
        (a.kind == PipeAction::kForward ? fin_f : fin_b)[vs][a.microbatch] = free[s];
        busy += d;
        end = std::max(end, free[s]);
        ++next[s];
        --left;
        moved = true;
      }
    }
    if (!moved) {
      return absl::InternalError("asynchronous pipeline: no stage can go on (a schedule bug)");
    }
  }
  if (bubble != nullptr) *bubble = end > 0 ? 1.0 - busy / (p * end) : 0.0;
  return end;
}

absl::StatusOr<double> PredictOverlappedStep(const OverlappedStepInput& in) {
  if (in.layers < 1 || in.microsteps < 1 || in.prefetch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layers (", in.layers, "), microsteps (", in.microsteps, ") and prefetch (", in.prefetch,
        ") must be >= 1"));
  }
  if (!(in.bucket_bytes > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket size ", in.bucket_bytes, " bytes must be > 0 (--bucket_mb)"));
  }
  if (in.grad_bytes > 0 && !in.grad_bucket_seconds) {
    return absl::InvalidArgumentError("gradient bytes without a bucket cost function");
  }
  const bool fsdp = in.fsdp_gather_s > 0 || in.fsdp_reduce_s > 0;
  double total = 0;
  for (int u = 0; u < in.microsteps; ++u) {
    const bool last = u + 1 == in.microsteps;
    // Parameters gathered in this microstep's forward: every one with reshard (or on the first
    // microstep), and again in its backward with reshard.
    const double gather_f = fsdp && (in.reshard_after_forward || u == 0) ? in.fsdp_gather_s : 0;
    const double gather_b = fsdp && in.reshard_after_forward ? in.fsdp_gather_s : 0;
    // HSDP's replicate all-reduce and DDP's buckets run once, in the last microstep.
    const double replicate = last ? in.hsdp_replicate_s : 0;
    const double grads = last ? in.grad_bytes : 0;
    if (!in.overlap) {
      total += in.forward_s + gather_f + in.backward_s + gather_b + in.fsdp_reduce_s + replicate;
      if (grads > 0) {
        const int k = static_cast<int>(std::ceil(grads / in.bucket_bytes));
        for (int b = 0; b < k; ++b) {
          total += in.grad_bucket_seconds(b + 1 < k ? in.bucket_bytes
                                                    : grads - in.bucket_bytes * (k - 1));
        }
      }
      continue;
    }
    FsdpPass f{.layers = in.layers, .compute_s = in.forward_s, .gather_s = gather_f,
               .prefetch = in.prefetch};
    absl::StatusOr<double> fwd = FsdpForwardSeconds(f);
    if (!fwd.ok()) return fwd.status();
    FsdpPass b{.layers = in.layers, .compute_s = in.backward_s, .gather_s = gather_b,
               .reduce_s = in.fsdp_reduce_s, .replicate_s = replicate, .prefetch = in.prefetch};
    absl::StatusOr<double> bwd = FsdpBackwardSeconds(b);
    if (!bwd.ok()) return bwd.status();
    double backward = *bwd;
    if (grads > 0) {
      absl::StatusOr<double> with = BucketedBackwardSeconds(in.backward_s, grads,
                                                            in.bucket_bytes,
                                                            in.grad_bucket_seconds);
      if (!with.ok()) return with.status();
      backward += *with - in.backward_s;
    }
    total += *fwd + backward;
  }
  return total + in.optimizer_s;
}

}  // namespace shardmap::planner
