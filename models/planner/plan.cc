#include "models/planner/plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/parallel/parallel_dims.h"
#include "models/parallel/pipeline.h"
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

absl::StatusOr<GptLayout> CandidateLayout(const Candidate& c, const PlanRequest& req) {
  absl::StatusOr<Mesh> mesh = c.mesh.axes.empty() ? Mesh() : ParseMesh(c.mesh.ToString());
  if (!mesh.ok()) return mesh.status();
  return GptLayout::Create(*mesh, req.config, c.sp);
}

TrainOptions CandidateTrainOptions(const Candidate& c, const PlanRequest& req) {
  TrainOptions o;
  o.batch = req.global_batch;
  o.pipeline.microbatches = c.pipeline.microbatches;
  o.pipeline.schedule = c.pipeline.schedule;
  o.grad_accum = c.grad_accum;
  return o;
}

namespace {

// The framework's checks for one candidate, without running anything: the layout's
// (GptLayout::Create) and the trainer's own plan of the run (PlanRun: its option checks, the
// batch's divisibility, SP's split of the rows, the stage split). OK or the framework's message.
absl::Status FrameworkChecks(const Candidate& c, const PlanRequest& req) {
  absl::StatusOr<GptLayout> layout = CandidateLayout(c, req);
  if (!layout.ok()) return layout.status();
  return PlanRun(*layout, CandidateTrainOptions(c, req)).status();
}

double ElemBytes(DType t) { return static_cast<double>(DTypeSize(t)); }

}  // namespace

std::string Candidate::Name() const {
  std::string s = mesh.ToString();
  if (sp) absl::StrAppend(&s, " +sp");
  if (pipeline.stages > 1 || pipeline.microbatches > 1) {
    absl::StrAppend(&s, " ", pipeline.schedule, "/m", pipeline.microbatches);
  }
  if (grad_accum > 1) absl::StrAppend(&s, " ga", grad_accum);
  return s;
}

double ModelParameters(const GptConfig& c) {
  const double d = c.d_model, L = c.layers;
  // c_attn + attention c_proj (4d^2 + 4d), c_fc + mlp c_proj (8d^2 + 5d), two LayerNorms (4d).
  const double per_block_dense = 12 * d * d + 13 * d;
  double n = c.vocab * d + c.seq * d + 2 * d;
  if (c.moe.on()) {
    const double mlp = 8 * d * d + 5 * d;
    n += L * (per_block_dense - mlp + d * c.moe.experts + c.moe.experts * mlp);
  } else {
    n += L * per_block_dense;
  }
  return n;
}

double ModelFlopsPerStep(const GptConfig& c, int64_t batch) {
  const double d = c.d_model, L = c.layers, tokens = static_cast<double>(batch) * c.seq;
  double n = ModelParameters(c) - c.seq * d;  // wpe is a lookup, not a product
  if (c.moe.on()) {
    const double mlp = 8 * d * d + 5 * d;
    n -= L * c.moe.experts * mlp * (1.0 - static_cast<double>(c.moe.topk) / c.moe.experts);
  }
  return 6 * n * tokens + 12 * L * d * c.seq * tokens;
}

absl::StatusOr<Candidate> ParseCandidate(const std::string& mesh_text, bool sp,
                                         const std::string& schedule, int microbatches) {
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
  return c;
}

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
  std::vector<Candidate> raw;
  if (!req.only_meshes.empty()) {
    for (const std::string& text : req.only_meshes) {
      std::vector<std::string> f = absl::StrSplit(text, absl::ByAnyChar(" :"), absl::SkipEmpty());
      if (f.empty()) return absl::InvalidArgumentError("an empty mesh");
      bool sp = false;
      std::string schedule = "1f1b";
      int m = 1, ga = 1;
      for (size_t i = 1; i < f.size(); ++i) {
        if (f[i] == "+sp") {
          sp = true;
        } else if (f[i].rfind("ga", 0) == 0 && absl::SimpleAtoi(f[i].substr(2), &ga) && ga >= 1) {
          continue;
        } else if (std::vector<std::string> sm = absl::StrSplit(f[i], "/m");
                   sm.size() == 2 && absl::SimpleAtoi(sm[1], &m) && m >= 1) {
          schedule = sm[0];
        } else {
          return absl::InvalidArgumentError(absl::StrCat(
              "mesh '", text, "': '", f[i],
              "' is neither +sp, <schedule>/m<microbatches> nor ga<microsteps>"));
        }
      }
      absl::StatusOr<Candidate> c = ParseCandidate(f[0], sp, schedule, m);
      if (!c.ok()) return c.status();
      c->grad_accum = ga;
      if (c->mesh.world() != req.gpus) {
        return absl::InvalidArgumentError(
            absl::StrCat("mesh ", f[0], " has ", c->mesh.world(), " ranks; --gpus is ", req.gpus,
                         ": the mesh's sizes must multiply to the GPU count"));
      }
      raw.push_back(*c);
    }
  } else {
    const bool moe = req.config.moe.on();
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
            if (data == 1) {
              forms.push_back({1, 1, 1});
            } else {
              forms.push_back({1, 1, data});
              forms.push_back({1, data, 1});
              for (int r : Divisors(data)) {
                if (r > 1 && r < data) forms.push_back({r, data / r, 1});
              }
            }
            for (const auto& f : forms) {
              Candidate c;
              c.mesh = MakeMesh(pp, f[0], f[1], f[2], ep, cp, tp);
              c.pipeline.stages = pp;
              std::vector<bool> sps = {false};
              if (tp > 1 && req.sp_variants) sps.push_back(true);
              if (tp > 1 && !req.sp_variants) sps = {true};
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
  std::vector<Candidate> out;
  const double elem = ElemBytes(req.config.dtype);
  const double n_params = ModelParameters(req.config);
  for (const Candidate& c : raw) {
    const int tp = c.mesh.size(axis::kTp);
    if (tp > gpn && !req.tp_across_nodes && req.only_meshes.empty()) {
      refused->push_back({c.Name(), absl::StrCat("tp=", tp, " spans more than a node of ", gpn,
                                                 " GPUs (--tp_across_nodes allows it)")});
      continue;
    }
    if (absl::Status s = FrameworkChecks(c, req); !s.ok()) {
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

absl::StatusOr<Plan> PlanGpt(const PlanRequest& req, const HardwareProfile& hw,
                             const Profiler& profiler) {
  Plan plan;
  absl::StatusOr<std::vector<Candidate>> cands = EnumerateCandidates(req, hw, &plan.refused);
  if (!cands.ok()) return cands.status();
  plan.candidates = static_cast<int>(cands->size() + plan.refused.size());
  plan.gpus = req.gpus;
  plan.gpus_per_node = req.gpus_per_node > 0 ? req.gpus_per_node : hw.gpus_per_node;
  plan.profile_name = hw.name;
  plan.usable_memory = hw.UsableMemory();
  plan.parameters = ModelParameters(req.config);
  plan.model_flops_per_step = ModelFlopsPerStep(req.config, req.global_batch);
  plan.tokens_per_step = req.global_batch * req.config.seq;
  HardwareProfile node = hw;
  node.gpus_per_node = plan.gpus_per_node;
  const DType compute = req.config.compute_dtype();
  const auto peak = hw.peak_flops.find(compute);
  double smallest_need = -1;
  std::string smallest_mesh;
  int done = 0;
  for (Candidate c : *cands) {
    absl::StatusOr<std::vector<RoleWork>> roles;
    absl::StatusOr<StepPrediction> p;
    for (int attempt = 0;; ++attempt) {
      const auto t0 = std::chrono::steady_clock::now();
      roles = profiler(c, req);
      plan.profile_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++plan.profiled;
      if (!roles.ok()) break;
      p = PredictStep(*roles, c.mesh, c.pipeline, node);
      if (!p.ok()) return p.status();  // a profile that cannot price this work: the user's to fix
      if (p->peak_bytes <= hw.UsableMemory() || c.pipeline.stages > 1 ||
          c.pipeline.microbatches > 1 || attempt == 2) {
        break;
      }
      // Without a pipeline: accumulate gradients over the fewest microsteps whose activations
      // (the largest role's, scaled by the microstep's share of the local batch) fit.
      double persistent = 0, act = 0;
      for (const RoleWork& w : *roles) {
        if (w.peak_bytes > persistent + act) {
          act = w.activation_peak_bytes;
          persistent = w.peak_bytes - act;
        }
      }
      int ways = 1;
      for (const char* a : axis::kBatch) ways *= c.mesh.size(a);
      const int64_t local = req.global_batch / ways;
      int next = c.grad_accum;
      while (act > 0 && persistent + act * c.grad_accum / next > hw.UsableMemory() &&
             local % (2 * next) == 0) {
        next *= 2;
      }
      if (next == c.grad_accum || persistent >= hw.UsableMemory()) break;
      c.grad_accum = next;
    }
    if (req.progress) req.progress(++done, static_cast<int>(cands->size()));
    if (!roles.ok()) {
      plan.refused.push_back({c.Name(), absl::StrCat("shape-only run: ", roles.status().message())});
      continue;
    }
    PlanRow row{c, *p};
    row.tokens_per_s = plan.tokens_per_step / p->step_s;
    row.mfu = peak == hw.peak_flops.end()
                  ? 0
                  : plan.model_flops_per_step / (p->step_s * req.gpus * peak->second);
    row.fits = p->peak_bytes <= hw.UsableMemory();
    if (!row.fits) {
      if (smallest_need < 0 || p->peak_bytes < smallest_need) {
        smallest_need = p->peak_bytes;
        smallest_mesh = c.Name();
      }
      plan.refused.push_back(
          {c.Name(), absl::StrFormat("out of memory: peak %.1f GiB per GPU > %.1f GiB usable "
                                     "(predicted step %s)",
                                     GiB(p->peak_bytes), GiB(hw.UsableMemory()),
                                     Seconds(p->step_s))});
      continue;
    }
    plan.rows.push_back(row);
  }
  std::stable_sort(plan.rows.begin(), plan.rows.end(), [](const PlanRow& a, const PlanRow& b) {
    return a.prediction.step_s < b.prediction.step_s;
  });
  if (plan.rows.empty()) {
    if (smallest_need > 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "no mesh of %d GPUs fits %s's %.1f GiB: the smallest peak is %.1f GiB per GPU (%s); "
          "use more GPUs, a smaller batch or more microbatches",
          req.gpus, hw.name, GiB(hw.UsableMemory()), GiB(smallest_need), smallest_mesh));
    }
    std::string reasons;
    for (size_t i = 0; i < plan.refused.size() && i < 5; ++i) {
      absl::StrAppend(&reasons, "\n  ", plan.refused[i].candidate, ": ", plan.refused[i].reason);
    }
    return absl::FailedPreconditionError(
        absl::StrCat("no mesh of ", req.gpus, " GPUs can run this model (", plan.refused.size(),
                     " refused), e.g.:", reasons));
  }
  return plan;
}

std::string FormatPlan(const Plan& plan, int top, bool list_refusals) {
  std::ostringstream o;
  o << absl::StrFormat(
      "plan: %.3g B parameters, %lld tokens/step, %.3g PFLOP/step on %d GPUs (%d per node), "
      "profile %s (%.1f GiB usable per GPU)\n",
      plan.parameters / 1e9, static_cast<long long>(plan.tokens_per_step),
      plan.model_flops_per_step / 1e15, plan.gpus, plan.gpus_per_node, plan.profile_name,
      GiB(plan.usable_memory));
  o << absl::StrFormat(
      "%d candidates, %d profiled shape-only in %.2f s, %zu ranked, %zu refused\n\n",
      plan.candidates, plan.profiled, plan.profile_seconds, plan.rows.size(),
      plan.refused.size());
  o << absl::StrFormat("%4s  %-40s %11s %12s %6s %9s %10s %10s %7s\n", "rank", "mesh", "step",
                       "tokens/s", "MFU", "mem GiB", "compute", "comm exp", "bubble");
  const int n = top <= 0 ? static_cast<int>(plan.rows.size())
                         : std::min<int>(top, static_cast<int>(plan.rows.size()));
  for (int i = 0; i < n; ++i) {
    const PlanRow& r = plan.rows[i];
    const StepPrediction& p = r.prediction;
    o << absl::StrFormat("%4d  %-40s %11s %12.4g %5.1f%% %9.2f %10s %10s %6.1f%%\n", i + 1,
                         r.candidate.Name(), Seconds(p.step_s), r.tokens_per_s, 100 * r.mfu,
                         GiB(p.peak_bytes), Seconds(p.compute_s),
                         Seconds(p.blocking_comm_s + p.exposed_comm_s), 100 * p.bubble);
  }
  if (n < static_cast<int>(plan.rows.size())) {
    o << absl::StrFormat("      ... %zu more ranked meshes (--top=0 shows all)\n",
                         plan.rows.size() - n);
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
