// plan_validate: the planner against measurements on this machine. Measures a CPU hardware
// profile (planner/measure_cpu.h), then for each of a list of meshes of a small GPT on simulated
// CPU ranks (threads of this process sharing its cores) predicts the step time (shape-only
// profile + cost model) and measures it (TrainGpt, the fastest of the steps after the first), and
// prints a markdown report: per mesh predicted vs measured, the error, and over all meshes the
// share within 20% and the Spearman rank correlation of predicted and measured times.
//
//   bazel run -c opt //models/planner:plan_validate -- --out=/tmp/report.md
//
// Ranks share the cores: the CPU profile's `cores` is the effective core count measured in the
// same run, and the cost model stretches each rank's time by max(1, world / cores). The machine
// is shared with other jobs whose load changes by the minute, so the profile's compute part
// (GEMM rates, bandwidth, per-op cost, effective cores) is measured again right before and right
// after each row's steps, every mesh is measured in several passes, and each row compares its
// fastest step with the prediction from its least disturbed profile (the fastest rates, the
// most effective cores among its samples); the
// prediction with the profile measured once at the start is reported beside it.
//
// Before the rows it measures the framework's cost per recorded op (a tiny GPT step over its op
// count; --framework_op_cost) and the non-GEMM ops' speed with the step's own op mix (one rank's
// step at a quarter of the batch; --step_other_rate), charges both, and reports the fit without
// them from the same run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "models/gpt.h"
#include "models/planner/cost_model.h"
#include "models/planner/measure_cpu.h"
#include "models/planner/plan.h"
#include "models/planner/shape_only_source.h"

ABSL_FLAG(int64_t, layers, 4, "transformer blocks");
ABSL_FLAG(int64_t, d_model, 128, "model width");
ABSL_FLAG(int64_t, heads, 4, "attention heads");
ABSL_FLAG(int64_t, vocab, 512, "vocabulary");
ABSL_FLAG(int64_t, seq, 64, "tokens per sequence");
ABSL_FLAG(int64_t, batch, 16, "global batch");
ABSL_FLAG(int64_t, steps, 5, "steps per mesh (the first is a warm-up)");
ABSL_FLAG(std::string, meshes,
          "single;dp=2;dp_shard=2;tp=2;tp=2 +sp;cp=2;pp=2 1f1b/m2;pp=2 gpipe/m4;dp=4;dp_shard=4;"
          "dp_replicate=2,dp_shard=2;dp=2,tp=2;dp_shard=2,tp=2 +sp;tp=4;cp=2,dp=2;"
          "pp=2,dp=2 1f1b/m2;pp=4 gpipe/m4;pp=2,tp=2 +sp 1f1b/m4",
          "';'-separated meshes, plan_gpt --mesh's form");
ABSL_FLAG(bool, framework_op_cost, true,
          "charge each recorded op the framework's measured per-op cost (a tiny GPT step's time "
          "over its op count) instead of a bare tensor op's");
ABSL_FLAG(bool, step_other_rate, true,
          "price non-GEMM ops at the speed one rank's step of the same model (a quarter of the "
          "batch) shows for them, instead of a copy bandwidth");
ABSL_FLAG(std::string, out, "", "also write the report here");
ABSL_FLAG(int, passes, 2, "times each mesh is measured (the fastest kept)");
ABSL_FLAG(std::string, shape_only_device, "cpu", "meta or cpu (plan_gpt's flag)");

namespace shardmap::planner {
namespace {

std::vector<double> Ranks(const std::vector<double>& v) {
  std::vector<size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[idx[k]] = (i + j) / 2.0 + 1;
    i = j + 1;
  }
  return r;
}

double Spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const std::vector<double> ra = Ranks(a), rb = Ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n;
  const double mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double l = -1;
  in >> l;
  return l;
}

int Main() {
  GptConfig cfg{.layers = absl::GetFlag(FLAGS_layers), .d_model = absl::GetFlag(FLAGS_d_model),
                .heads = absl::GetFlag(FLAGS_heads), .vocab = absl::GetFlag(FLAGS_vocab),
                .seq = absl::GetFlag(FLAGS_seq)};
  const int64_t batch = absl::GetFlag(FLAGS_batch), steps = absl::GetFlag(FLAGS_steps);
  if (steps < 2) {
    std::cerr << "plan_validate: --steps must be >= 2 (the first is a warm-up)\n";
    return 2;
  }
  std::string report;
  auto emit = [&](const std::string& s) {
    std::cout << s << std::flush;
    report += s;
  };
  const double load0 = LoadAverage();
  absl::StatusOr<HardwareProfile> hw = MeasureCpuProfile(CpuMeasureOptions{});
  if (!hw.ok()) {
    std::cerr << "plan_validate: " << hw.status().message() << "\n";
    return 1;
  }
  emit(absl::StrFormat(
      "# Planner validation on this CPU\n\nGPT: %d layers, d_model %d, %d heads, vocab %d, seq %d, "
      "global batch %d, f32; %d steps per mesh, the fastest of steps 2..%d measured (the profile's rates are best-of too). "
      "%u hardware threads, load average %.2f at the start.\n\n"
      "## The CPU profile measured in this run\n\n```\n%s```\n\n",
      cfg.layers, cfg.d_model, cfg.heads, cfg.vocab, cfg.seq, batch, steps, steps,
      std::thread::hardware_concurrency(), load0, hw->ToText()));
  // The framework's cost per recorded op: a tiny-shape GPT step (the same layers, so the same
  // kinds of ops through shardmap's type checks, the tape and value wrappers) on one rank, its
  // time less its modelled arithmetic, over its op count.
  double framework_op_s = 0;
  {
    GptConfig tiny = cfg;
    tiny.d_model = cfg.heads * 2;
    tiny.vocab = 16;
    tiny.seq = 4;
    const int64_t tiny_batch = 1, tiny_steps = 12;
    PlanRequest req;
    req.config = tiny;
    req.global_batch = tiny_batch;
    req.gpus = 1;
    req.gpus_per_node = 1;
    req.only_meshes = {"single"};
    absl::StatusOr<Plan> plan = PlanGpt(req, *hw, ShapeOnlyProfiler(Device::Cpu()));
    absl::StatusOr<std::vector<RoleWork>> roles =
        plan.ok() ? ShapeOnlyProfiler(Device::Cpu())(plan->rows[0].candidate, req) : plan.status();
    std::vector<int64_t> tiny_tokens((tiny_batch * tiny_steps + 1) * tiny.seq + 1);
    for (size_t i = 0; i < tiny_tokens.size(); ++i) tiny_tokens[i] = (i * 7 + 3) % tiny.vocab;
    TrainOptions o;
    o.steps = tiny_steps;
    o.batch = tiny_batch;
    double best = 1e30;
    o.on_step = [&](const StepInfo& st) { best = std::min(best, st.seconds); };
    absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), tiny, false);
    absl::StatusOr<TrainResult> r =
        layout.ok() ? TrainGpt(*layout, InitGpt(tiny, 1), tiny_tokens, o) : layout.status();
    absl::StatusOr<double> per_op = !roles.ok() ? roles.status()
                                     : !r.ok()   ? r.status()
                                                 : FrameworkOpSeconds(
                                                       best,
                                                       plan->rows[0].prediction.gemm_s +
                                                           plan->rows[0].prediction.other_s,
                                                       (*roles)[0].op_count);
    if (!per_op.ok()) {
      std::cerr << "plan_validate: framework per-op cost: " << per_op.status().message() << "\n";
      return 1;
    }
    framework_op_s = *per_op;
    emit(absl::StrFormat(
        "Framework cost per recorded op: a tiny GPT step (%d layers, d_model %d, seq %d, batch "
        "%d, one rank) of %lld ops took %.3f ms (best of %d), its modelled arithmetic %.3f ms: "
        "%.3g s per op (the bare tensor op of the profile: %.3g s), charged per op below.\n\n",
        tiny.layers, tiny.d_model, tiny.seq, tiny_batch, (long long)(*roles)[0].op_count,
        1e3 * best, tiny_steps,
        1e3 * (plan->rows[0].prediction.gemm_s + plan->rows[0].prediction.other_s), framework_op_s,
        hw->op_overhead_s));
  }
  const double bare_op_s = hw->op_overhead_s;
  if (absl::GetFlag(FLAGS_framework_op_cost)) hw->op_overhead_s = framework_op_s;
  std::vector<int64_t> tokens((batch * steps + 1) * cfg.seq + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 7919 + 13) % cfg.vocab;
  const Device so_device =
      absl::GetFlag(FLAGS_shape_only_device) == "meta" ? Device::Meta() : Device::Cpu();
  // Pass 1..passes: every mesh measured in turn (the fastest step after the first), with the
  // profile's compute part measured again right before and after it. Then each mesh is predicted
  // with the fastest of its profiles: on a shared machine the least disturbed step and the least
  // disturbed profile are the comparable pair.
  struct Row {
    std::string text;
    Candidate candidate;
    double measured = 1e30;
    std::vector<HardwareProfile> profiles;
    double static_s = 0;
  };
  std::vector<Row> rows;
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_meshes), ';', absl::SkipEmpty())) {
    Row row;
    row.text = std::string(m);
    const std::string mesh_text = row.text.substr(0, row.text.find(' '));
    absl::StatusOr<Candidate> parsed = ParseCandidate(mesh_text, false, "1f1b", 1);
    if (!parsed.ok()) {
      std::cerr << "plan_validate: " << row.text << ": " << parsed.status().message() << "\n";
      return 2;
    }
    row.candidate = *parsed;
    rows.push_back(row);
  }
  auto request = [&](const Row& row) {
    PlanRequest req;
    req.config = cfg;
    req.global_batch = batch;
    req.gpus = row.candidate.mesh.world();
    req.gpus_per_node = req.gpus;
    req.only_meshes = {row.text};
    return req;
  };
  // The step's own GEMM shapes (every row's, forward and backward, transposed operands and
  // batched attention products included), each timed once on this CPU: each GEMM is priced at
  // its own measured rate. `exact_ref` is the d = 128 GEMM rate while they were timed, to put
  // them at each row's load below.
  double exact_ref = 0;
  {
    const LoadSample s0 = SampleLoad();
    int timed = 0;
    for (Row& row : rows) {
      absl::StatusOr<Plan> plan = PlanGpt(request(row), *hw, ShapeOnlyProfiler(so_device));
      if (!plan.ok()) {
        std::cerr << "plan_validate: " << row.text << ": " << plan.status().message() << "\n";
        return 1;
      }
      absl::StatusOr<std::vector<RoleWork>> roles =
          ShapeOnlyProfiler(so_device)(plan->rows[0].candidate, request(row));
      absl::StatusOr<int> n = roles.ok() ? MeasureGemmShapes(*roles, &*hw) : roles.status();
      if (!n.ok()) {
        std::cerr << "plan_validate: " << row.text << ": " << n.status().message() << "\n";
        return 1;
      }
      timed += *n;
    }
    const LoadSample s1 = SampleLoad();
    exact_ref = std::max(s0.gemm_rate, s1.gemm_rate);
    emit(absl::StrFormat(
        "The step's own GEMM shapes: %d distinct (batch, m, n, k, layouts), each timed once "
        "(best of 3) at a d = 128 GEMM rate of %.3g flop/s; each row's profile carries them "
        "scaled by its own d = 128 rate / that. Their measured rates against the min_dim "
        "curve's rate for the same shape, by layout:\n\n"
        "| layout | shapes | measured / curve: median | min | max |\n|---|---|---|---|---|\n",
        timed, exact_ref));
    std::map<std::string, std::vector<double>> ratios;
    HardwareProfile curve = *hw;
    curve.gemm_exact.clear();
    for (const auto& [k, r] : hw->gemm_exact) {
      GemmWork g{.batch = k.batch, .m = k.m, .n = k.n, .k = k.k, .dtype = k.dtype,
                 .trans_a = k.trans_a, .trans_b = k.trans_b};
      const std::string layout = absl::StrCat(k.batch > 1 ? "batched " : "", k.trans_a ? "T" : "N",
                                              k.trans_b ? "T" : "N");
      ratios[layout].push_back(r / (g.flops() / *curve.GemmSeconds(g)));
    }
    for (auto& [layout, v] : ratios) {
      std::sort(v.begin(), v.end());
      emit(absl::StrFormat("| %s | %d | %.2f | %.2f | %.2f |\n", layout, v.size(), v[v.size() / 2],
                           v.front(), v.back()));
    }
    emit("\n");
  }
  // The non-GEMM ops' speed with the step's own op mix: one rank's step of the same model at a
  // quarter of the batch (so no row's step), less its modelled GEMMs and per-op cost, over its
  // modelled other ops; every profile below prices other ops at that speed.
  double other_slowdown = 1;
  if (absl::GetFlag(FLAGS_step_other_rate)) {
    PlanRequest req;
    req.config = cfg;
    req.global_batch = std::max<int64_t>(1, batch / 4);
    req.gpus = 1;
    req.gpus_per_node = 1;
    req.only_meshes = {"single"};
    absl::StatusOr<Plan> plan = PlanGpt(req, *hw, ShapeOnlyProfiler(so_device));
    absl::StatusOr<std::vector<RoleWork>> roles =
        plan.ok() ? ShapeOnlyProfiler(so_device)(plan->rows[0].candidate, req) : plan.status();
    if (roles.ok()) {
      if (absl::StatusOr<int> n = MeasureGemmShapes(*roles, &*hw); !n.ok()) roles = n.status();
    }
    absl::StatusOr<ComputeParts> parts =
        roles.ok() ? ComputeBreakdown((*roles)[0], *hw) : roles.status();
    TrainOptions o;
    o.steps = 6;
    o.batch = req.global_batch;
    double best = 1e30;
    o.on_step = [&](const StepInfo& st) { best = std::min(best, st.seconds); };
    absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), cfg, false);
    absl::StatusOr<TrainResult> r =
        layout.ok() ? TrainGpt(*layout, InitGpt(cfg, 1), tokens, o) : layout.status();
    absl::StatusOr<HardwareProfile> fit =
        !parts.ok() ? parts.status()
        : !r.ok()   ? r.status()
                    : WithStepOtherOpRate(*hw, best, parts->gemm_s, parts->other_s,
                                          parts->overhead_s, &other_slowdown);
    if (!fit.ok()) {
      std::cerr << "plan_validate: the step's other-op rate: " << fit.status().message() << "\n";
      return 1;
    }
    *hw = *fit;
    emit(absl::StrFormat(
        "Non-GEMM ops with the step's own mix: one rank's step at batch %d took %.1f ms (best of "
        "5 after a warm-up); modelled GEMMs %.1f ms, per-op %.1f ms, other ops %.1f ms at the "
        "copy bandwidth: they took %.2fx that, so every profile below prices other ops at "
        "memory_bandwidth and vector_flops / %.2f.\n\n",
        req.global_batch, 1e3 * best, 1e3 * parts->gemm_s, 1e3 * parts->overhead_s,
        1e3 * parts->other_s, other_slowdown, other_slowdown));
  }
  const int passes = absl::GetFlag(FLAGS_passes);
  for (int pass = 0; pass < passes; ++pass) {
    for (Row& row : rows) {
      absl::StatusOr<Plan> plan = PlanGpt(request(row), *hw, ShapeOnlyProfiler(so_device));
      if (!plan.ok()) {
        std::cerr << "plan_validate: " << row.text << ": " << plan.status().message() << "\n";
        return 1;
      }
      const Candidate& c = plan->rows[0].candidate;
      row.candidate = c;
      row.static_s = plan->rows[0].prediction.step_s;
      absl::StatusOr<Mesh> mesh =
          c.mesh.axes.empty() ? Mesh() : ParseMesh(c.mesh.ToString());
      absl::StatusOr<GptLayout> layout = GptLayout::Create(*mesh, cfg, c.sp);
      if (!layout.ok()) {
        std::cerr << "plan_validate: " << layout.status().message() << "\n";
        return 1;
      }
      TrainOptions o;
      o.steps = steps;
      o.batch = batch;
      o.microbatches = c.pipeline.microbatches;
      o.schedule = c.pipeline.schedule;
      std::vector<double> secs;
      o.on_step = [&](const StepInfo& s) { secs.push_back(s.seconds); };
      CpuMeasureOptions quick;
      quick.collectives = false;
      absl::StatusOr<HardwareProfile> before = MeasureCpuProfile(quick);
      absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(cfg, 1), tokens, o);
      absl::StatusOr<HardwareProfile> after = MeasureCpuProfile(quick);
      if (!r.ok() || !before.ok() || !after.ok()) {
        const absl::Status& bad = !r.ok() ? r.status() : !before.ok() ? before.status() : after.status();
        std::cerr << "plan_validate: " << row.text << ": " << bad.message() << "\n";
        return 1;
      }
      row.measured = std::min(row.measured, *std::min_element(secs.begin() + 1, secs.end()));
      for (HardwareProfile* q : {&*before, &*after}) {
        q->fitted = hw->fitted;
        const double f = q->gemm.at(DType::kF32)[4].second / exact_ref;
        for (const auto& [k, r] : hw->gemm_exact) q->gemm_exact[k] = r * f;
        q->memory_bandwidth /= other_slowdown;
        q->vector_flops /= other_slowdown;
        // The framework's per-op cost at this sample's load: the bare op's re-measured change.
        if (absl::GetFlag(FLAGS_framework_op_cost) && bare_op_s > 0) {
          q->op_overhead_s = framework_op_s * q->op_overhead_s / bare_op_s;
        }
        row.profiles.push_back(*q);
      }
      std::cerr << "plan_validate: pass " << pass + 1 << " " << row.text << " "
                << 1e3 * row.measured << " ms\n";
    }
  }
  emit("## Predicted and measured step times\n\n"
       "| mesh | ranks | predicted ms | measured ms | error | cores | GEMM speed vs start | "
       "compute ms (gemm + other + per-op) | comm ms | bubble | start profile ms |\n"
       "|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<double> predicted, measured, static_pred, bare_pred;
  auto speed = [](const HardwareProfile& q) { return q.gemm.at(DType::kF32)[4].second; };
  for (const Row& row : rows) {
    // The least disturbed machine the row saw: the fastest profile's rates, the most cores any
    // of its samples found.
    HardwareProfile best = *std::max_element(
        row.profiles.begin(), row.profiles.end(),
        [&](const HardwareProfile& a, const HardwareProfile& b) { return speed(a) < speed(b); });
    for (const HardwareProfile& q : row.profiles) best.cores = std::max(best.cores, q.cores);
    absl::StatusOr<Plan> plan = PlanGpt(request(row), best, ShapeOnlyProfiler(so_device));
    if (!plan.ok()) {
      std::cerr << "plan_validate: " << row.text << ": " << plan.status().message() << "\n";
      return 1;
    }
    const StepPrediction& p = plan->rows[0].prediction;
    const Candidate& c = row.candidate;
    predicted.push_back(p.step_s);
    measured.push_back(row.measured);
    static_pred.push_back(row.static_s);
    // The same profile without this run's framework per-op cost and step-mix other-op rate (a
    // bare tensor op's cost, the copy bandwidth): what those two change, in the same run.
    HardwareProfile bare = best;
    if (absl::GetFlag(FLAGS_framework_op_cost) && framework_op_s > 0) {
      bare.op_overhead_s *= bare_op_s / framework_op_s;
    }
    bare.memory_bandwidth *= other_slowdown;
    bare.vector_flops *= other_slowdown;
    absl::StatusOr<Plan> bare_plan = PlanGpt(request(row), bare, ShapeOnlyProfiler(so_device));
    bare_pred.push_back(bare_plan.ok() ? bare_plan->rows[0].prediction.step_s : 0);
    emit(absl::StrFormat(
        "| %s | %d | %.1f | %.1f | %+.0f%% | %.2f | %.2f | %.1f (%.0f + %.0f + %.0f) | %.1f | "
        "%.0f%% | %.1f |\n",
        c.Name(), c.mesh.world(), 1e3 * p.step_s, 1e3 * row.measured,
        100 * (p.step_s - row.measured) / row.measured, best.cores, speed(best) / speed(*hw),
        1e3 * p.compute_s, 1e3 * p.gemm_s, 1e3 * p.other_s, 1e3 * p.overhead_s,
        1e3 * (p.blocking_comm_s + p.exposed_comm_s), 100 * p.bubble, 1e3 * row.static_s));
  }
  auto within = [&](const std::vector<double>& pred) {
    int n = 0;
    for (size_t i = 0; i < pred.size(); ++i) n += std::abs(pred[i] - measured[i]) <= 0.2 * measured[i];
    return n;
  };
  emit(absl::StrFormat(
      "\nWith each row's least disturbed re-measured profile (%d passes; compute rates and "
      "effective cores measured before and after each row's steps: the fastest rates, the most "
      "cores): %d of %zu meshes within 20%%, "
      "Spearman rank correlation of predicted and measured step times %.3f.\n"
      "With the profile as measured once at the start: %d of %zu within 20%%, Spearman %.3f. "
      "Load average %.2f at the end.\n",
      passes, within(predicted), predicted.size(), Spearman(predicted, measured),
      within(static_pred), predicted.size(), Spearman(static_pred, measured), LoadAverage()));
  emit(absl::StrFormat(
      "Without the framework per-op cost and the step-mix other-op rate (the least disturbed "
      "profiles with a bare tensor op's cost and the copy bandwidth): %d of %zu within 20%%, "
      "Spearman %.3f.\n",
      within(bare_pred), bare_pred.size(), Spearman(bare_pred, measured)));
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    std::ofstream f(out);
    f << report;
  }
  return 0;
}

}  // namespace
}  // namespace shardmap::planner

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return shardmap::planner::Main();
}
