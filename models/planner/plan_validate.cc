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
// same run, and the cost model stretches each rank's time by max(1, world / cores) (a pipeline's
// busy stages share them tick by tick). The machine's neighbours slow its cores by up to 2x for
// seconds to minutes at a time, so every mesh is measured in passes until two passes agree, and
// the profile is measured before the steps and again after them, each rate the faster of the
// two; the prediction with the profile measured at the start alone is reported beside it. The
// report splits the meshes of at most as many ranks as cores (a core each, as a GPU rank has its
// device) from those with more (the OS runs them in turn).
//
// With --link_mb_per_s (and --link_latency_us, --overlap, --bucket_mb) every mesh trains on a
// simulated link (collectives/simulated_link.h: each collective sleeps out alpha + its bytes
// over the bandwidth, started ones on their own lane) and is predicted by PredictOnSimulatedLink
// (issue 34's check that the planner prices the overlapped schedule the trainer runs):
//
//   bazel run -c opt //models/planner:plan_validate -- --d_model=256 --batch=8 --meshes='dp=2;dp_shard=2;dp_replicate=2,dp_shard=2' --link_mb_per_s=100 --bucket_mb=2
//
// Before the rows it measures the framework's cost per recorded op (a tiny GPT step over its op
// count; --framework_op_cost) and each non-GEMM op kind's own speed (one rank's step at a
// quarter of the batch, every op timed; --op_rates), charges both, and reports the fit without
// them from the same run.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "models/gpt/gpt_flags.h"
#include "models/gpt.h"
#include "models/planner/cost_model.h"
#include "models/planner/gpt_request.h"
#include "models/planner/measure_cpu.h"
#include "models/planner/plan.h"
#include "models/planner/shape_only_source.h"
#include "models/train/simulated_link_runner.h"
#include "shardmap/spmd_runner.h"
#include "tensor/op_counter.h"

SHARDMAP_GPT_CONFIG_FLAGS(/*layers=*/4, /*d_model=*/128, /*heads=*/4, /*vocab=*/512, /*seq=*/64,
                          /*dtype=*/"f32");
ABSL_FLAG(int64_t, batch, 16, "global batch");
ABSL_FLAG(int64_t, steps, 8, "steps per mesh and pass (the first is a warm-up)");
ABSL_FLAG(std::string, meshes,
          "single;dp=2;dp_shard=2;tp=2;tp=2 +sp;cp=2;pp=2 1f1b/m1;pp=2 1f1b/m2;pp=2 1f1b/m4;"
          "pp=2 1f1b/m8;pp=2 gpipe/m2;pp=2 gpipe/m4;pp=2 gpipe/m8;"
          "dp=4;dp_shard=4;dp_replicate=2,dp_shard=2;dp=2,tp=2;dp_shard=2,tp=2 +sp;tp=4;tp=4 +sp;"
          "cp=2,dp=2;pp=2,dp=2 1f1b/m2;pp=4 gpipe/m4;pp=4 1f1b/m4;pp=2,tp=2 +sp 1f1b/m4;dp=8",
          "';'-separated meshes, plan_gpt --mesh's form");
ABSL_FLAG(bool, framework_op_cost, true,
          "charge each recorded op the framework's measured per-op cost (a tiny GPT step's time "
          "over its op count) instead of a bare tensor op's");
ABSL_FLAG(bool, op_rates, true,
          "price each non-GEMM op kind at the speed one rank's timed step of the same model (a "
          "quarter of the batch) shows for it, instead of a copy bandwidth");
ABSL_FLAG(std::string, out, "", "also write the report here");
ABSL_FLAG(int, passes, 6,
          "the most times a mesh is measured (at least 2; the fastest step of all is kept)");
ABSL_FLAG(int, min_passes, 3,
          "the fewest times a mesh is measured: two passes can agree within one long slowdown");
ABSL_FLAG(double, agree, 0.04,
          "a mesh is measured again until its two fastest passes are within this fraction");
ABSL_FLAG(std::string, shape_only_device, "cpu", "meta or cpu (plan_gpt's flag)");
ABSL_FLAG(double, link_mb_per_s, 0,
          "> 0: run every mesh on a simulated link of this bus bandwidth (MB/s; "
          "collectives/simulated_link.h) and predict it with PredictOnSimulatedLink");
ABSL_FLAG(double, link_latency_us, 100, "the simulated link's time per collective (us)");
ABSL_FLAG(bool, overlap, true, "with a link: the trainer's --overlap (the schedule predicted)");
ABSL_FLAG(double, bucket_mb, 25, "with a link: the trainer's --bucket_mb");

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

// Everything the predictions read from this CPU: the profile with the framework's per-op cost,
// the step's shape-exact GEMM rates and the ops' own speeds in it; what it replaced (a bare
// op's cost, the copy bandwidth) for the comparison without them.
struct Calibration {
  HardwareProfile hw;
  double bare_op_s = 0, framework_op_s = 0;
  double copy_bandwidth = 0, copy_vector_flops = 0;
  double other_slowdown = 1;
};

// Each rate the faster of two measurements, each cost the smaller: this machine's neighbours
// slow its cores by up to 2x for seconds to minutes at a time, so of two measurements minutes
// apart the faster one is the machine's own speed.
Calibration Faster(const Calibration& a, const Calibration& b) {
  Calibration c = a;
  HardwareProfile& p = c.hw;
  for (auto& [d, pts] : p.gemm) {
    const auto it = b.hw.gemm.find(d);
    if (it == b.hw.gemm.end() || it->second.size() != pts.size()) continue;
    for (size_t i = 0; i < pts.size(); ++i) {
      pts[i].second = std::max(pts[i].second, it->second[i].second);
    }
  }
  for (const auto& [k, r] : b.hw.gemm_exact) p.gemm_exact[k] = std::max(p.gemm_exact[k], r);
  for (const auto& [k, r] : b.hw.op_rate) p.op_rate[k] = std::max(p.op_rate[k], r);
  for (const auto& [k, r] : b.hw.peak_flops) p.peak_flops[k] = std::max(p.peak_flops[k], r);
  for (const auto& [k, f] : b.hw.fitted) {
    auto [it, added] = p.fitted.try_emplace(k, f);
    if (!added) {
      it->second.alpha_s = std::min(it->second.alpha_s, f.alpha_s);
      it->second.seconds_per_byte = std::min(it->second.seconds_per_byte, f.seconds_per_byte);
    }
  }
  p.memory_bandwidth = std::max(p.memory_bandwidth, b.hw.memory_bandwidth);
  p.vector_flops = std::max(p.vector_flops, b.hw.vector_flops);
  p.op_overhead_s = std::min(p.op_overhead_s, b.hw.op_overhead_s);
  p.cores = std::max(p.cores, b.hw.cores);
  for (const auto& [k, r] : b.hw.shared_op_rate) {
    p.shared_op_rate[k] = std::max(p.shared_op_rate[k], r);
  }
  for (const auto& [k, v] : b.hw.oversubscribed_sync) {
    auto [it, added] = p.oversubscribed_sync.try_emplace(k, v);
    if (!added) it->second = std::min(it->second, v);
  }
  c.bare_op_s = std::min(a.bare_op_s, b.bare_op_s);
  c.framework_op_s = std::min(a.framework_op_s, b.framework_op_s);
  c.copy_bandwidth = std::max(a.copy_bandwidth, b.copy_bandwidth);
  c.copy_vector_flops = std::max(a.copy_vector_flops, b.copy_vector_flops);
  c.other_slowdown = c.copy_bandwidth / p.memory_bandwidth;
  return c;
}

// The median of b's rates over a's, over the keys both have (1 when none).
template <typename K>
double MedianRatio(const std::map<K, double>& b, const std::map<K, double>& a) {
  std::vector<double> r;
  for (const auto& [k, v] : b) {
    if (const auto it = a.find(k); it != a.end() && it->second > 0) r.push_back(v / it->second);
  }
  if (r.empty()) return 1;
  std::sort(r.begin(), r.end());
  return r[r.size() / 2];
}

// One mesh of the validation: its measurements over the passes and its prediction at the start.
struct Row {
  std::string text;
  Candidate candidate;
  double measured = 1e30;
  std::vector<double> pass_measured;  // each pass's fastest step
  double static_s = 0;
  bool Agreed(double agree) const {
    std::vector<double> v = pass_measured;
    std::sort(v.begin(), v.end());
    return v.size() >= 2 && v[1] <= (1 + agree) * v[0];
  }
};

// Each mesh's predictions (with the faster profile, the start profile, and without the
// framework per-op cost and the ops' own speeds) beside its measurement, in row order.
struct Predictions {
  std::vector<double> predicted, measured, static_pred, bare_pred;
  int agreed = 0;
};

struct Settings {
  GptConfig cfg;
  int64_t batch = 0, steps = 0;
  Device so_device = Device::Meta();
  int max_passes = 0, min_passes = 0;
  double agree = 0;
  // A simulated link (busbw > 0) and the overlapped schedule the rows train and are priced by.
  Link link{.alpha_s = 0, .busbw = 0};
  StepOptions step;
};

// The flags, checked: nullopt (after saying why on stderr) when they cannot run.
std::optional<Settings> SettingsFromFlags() {
  Settings s;
  absl::StatusOr<GptConfig> cfg = GptConfigFromFlags(SHARDMAP_GPT_CONFIG_FLAG_VALUES());
  if (!cfg.ok()) {
    std::cerr << "plan_validate: " << cfg.status().message() << "\n";
    return std::nullopt;
  }
  s.cfg = *cfg;
  s.batch = absl::GetFlag(FLAGS_batch);
  s.steps = absl::GetFlag(FLAGS_steps);
  if (s.steps < 2) {
    std::cerr << "plan_validate: --steps must be >= 2 (the first is a warm-up)\n";
    return std::nullopt;
  }
  s.max_passes = absl::GetFlag(FLAGS_passes);
  s.min_passes = absl::GetFlag(FLAGS_min_passes);
  s.agree = absl::GetFlag(FLAGS_agree);
  if (s.min_passes < 2 || s.max_passes < s.min_passes || !(s.agree > 0)) {
    std::cerr << "plan_validate: need 2 <= --min_passes <= --passes and --agree > 0 (each mesh "
                 "is measured until two passes agree)\n";
    return std::nullopt;
  }
  s.so_device = absl::GetFlag(FLAGS_shape_only_device) == "meta" ? Device::Meta() : Device::Cpu();
  s.link = {.alpha_s = absl::GetFlag(FLAGS_link_latency_us) * 1e-6,
            .busbw = absl::GetFlag(FLAGS_link_mb_per_s) * 1e6};
  s.step.overlap = absl::GetFlag(FLAGS_overlap);
  s.step.bucket_bytes = absl::GetFlag(FLAGS_bucket_mb) * 1024 * 1024;
  if (s.link.busbw < 0 || s.link.alpha_s < 0 || !(s.step.bucket_bytes > 0)) {
    std::cerr << "plan_validate: --link_mb_per_s and --link_latency_us must be >= 0 and "
                 "--bucket_mb > 0\n";
    return std::nullopt;
  }
  return s;
}

// The validation run: calibrations, the meshes' passes and the report, in that order (Main).
// Failing steps say why on stderr and return a non-OK status.
class Validation {
 public:
  explicit Validation(Settings s) : s_(std::move(s)) {
    const GptConfig& cfg = s_.cfg;
    tokens_.resize((s_.batch * s_.steps + 1) * cfg.seq + 1);
    for (size_t i = 0; i < tokens_.size(); ++i) tokens_[i] = (i * 7919 + 13) % cfg.vocab;
  }

  // The meshes of --meshes, parsed.
  absl::Status ParseRows() {
    for (absl::string_view m :
         absl::StrSplit(absl::GetFlag(FLAGS_meshes), ';', absl::SkipEmpty())) {
      Row row;
      row.text = std::string(m);
      const std::string mesh_text = row.text.substr(0, row.text.find(' '));
      absl::StatusOr<Candidate> parsed = ParseCandidate(mesh_text, false, "1f1b", 1);
      if (!parsed.ok()) {
        std::cerr << "plan_validate: " << row.text << ": " << parsed.status().message() << "\n";
        return parsed.status();
      }
      row.candidate = *parsed;
      rows_.push_back(row);
    }
    return absl::OkStatus();
  }

  void EmitHeader(double load0) {
    const GptConfig& cfg = s_.cfg;
    Emit(absl::StrFormat(
        "# Planner validation on this CPU\n\nGPT: %d layers, d_model %d, %d heads, vocab %d, seq "
        "%d, global batch %d, f32; %d steps per mesh, the fastest of steps 2..%d measured (the "
        "profile's rates are best-of too). %u hardware threads, load average %.2f at the start. "
        "The CPU profile is measured before the meshes' steps and again after them; the planner "
        "takes each rate's faster measurement.\n\n",
        cfg.layers, cfg.d_model, cfg.heads, cfg.vocab, cfg.seq, s_.batch, s_.steps, s_.steps,
        std::thread::hardware_concurrency(), load0));
    if (s_.link.busbw > 0) {
      Emit(absl::StrFormat(
          "Every mesh runs on a simulated link of %.0f MB/s bus bandwidth and %.0f us per "
          "collective, overlap %s (%.1f MiB buckets, FSDP prefetch 1, reshard after forward), and "
          "is predicted by PredictOnSimulatedLink.\n\n",
          s_.link.busbw / 1e6, s_.link.alpha_s * 1e6, s_.step.overlap ? "on" : "off",
          s_.step.bucket_bytes / (1024.0 * 1024.0)));
    }
  }

  // Everything the predictions read from this CPU; `report`: its lines go into the report (the
  // later calibration is summarised in one line beside the results instead).
  absl::StatusOr<Calibration> Calibrate(const char* when, bool report) {
    Calibration c;
    absl::StatusOr<HardwareProfile> hw = MeasureCpuProfile(CpuMeasureOptions{});
    if (!hw.ok()) {
      std::cerr << "plan_validate: " << hw.status().message() << "\n";
      return CalibrationFailed();
    }
    Say(report,
        absl::StrFormat("## The CPU profile measured %s\n\n```\n%s```\n\n", when, hw->ToText()));
    absl::StatusOr<double> framework_op_s = FrameworkOpCost(*hw, report);
    if (!framework_op_s.ok()) return CalibrationFailed();
    c.framework_op_s = *framework_op_s;
    c.bare_op_s = hw->op_overhead_s;
    if (absl::GetFlag(FLAGS_framework_op_cost)) hw->op_overhead_s = c.framework_op_s;
    if (!MeasureStepGemms(&*hw, report).ok()) return CalibrationFailed();
    c.copy_bandwidth = hw->memory_bandwidth;
    c.copy_vector_flops = hw->vector_flops;
    if (absl::GetFlag(FLAGS_op_rates)) {
      absl::StatusOr<double> slowdown = MeasureOpRates(c.bare_op_s, &*hw, report);
      if (!slowdown.ok()) return CalibrationFailed();
      c.other_slowdown = *slowdown;
      if (!MeasureSharedOpRates(c.bare_op_s, &*hw, report).ok()) return CalibrationFailed();
    }
    c.hw = *hw;
    return c;
  }

  // Passes: every mesh measured in turn (the fastest step after the first). A mesh is measured
  // in --min_passes passes and more until its two fastest passes agree within --agree (the
  // machine's neighbours slow a core by up to 2x for seconds to minutes at a time, so one pass's
  // fastest step may still be a slow one), at most --passes times. Every mesh is then predicted
  // with one profile: each rate the faster of its measurements before and after the steps
  // (Faster): the least disturbed steps and the least disturbed machine are the comparable pair.
  absl::Status MeasurePasses(const HardwareProfile& hw) {
    for (int pass = 0; pass < s_.max_passes; ++pass) {
      bool measured_any = false;
      for (Row& row : rows_) {
        if (pass >= s_.min_passes && row.Agreed(s_.agree)) continue;
        measured_any = true;
        absl::Status st = MeasureRow(hw, pass, &row);
        if (!st.ok()) return st;
      }
      if (!measured_any) break;
      passes_run_ = pass + 1;
    }
    return absl::OkStatus();
  }

  // The table of predicted and measured step times, with `quiet` (the faster of the two
  // calibrations, `both`); the predictions behind it.
  absl::StatusOr<Predictions> ReportRows(const Calibration& both) {
    const HardwareProfile& quiet = both.hw;
    Emit("## Predicted and measured step times\n\n"
         "| mesh | ranks | predicted ms | measured ms | error | passes | compute ms (gemm + other "
         "+ per-op) | comm ms | bubble | start profile ms |\n"
         "|---|---|---|---|---|---|---|---|---|---|\n");
    Predictions out;
    for (const Row& row : rows_) {
      absl::StatusOr<StepPrediction> predicted = Predict(row, quiet);
      if (!predicted.ok()) {
        std::cerr << "plan_validate: " << row.text << ": " << predicted.status().message() << "\n";
        return predicted.status();
      }
      const StepPrediction& p = *predicted;
      const Candidate& c = row.candidate;
      out.predicted.push_back(p.step_s);
      out.measured.push_back(row.measured);
      out.static_pred.push_back(row.static_s);
      out.agreed += row.Agreed(s_.agree);
      // The same profile without this run's framework per-op cost and the ops' own speeds (a
      // bare tensor op's cost, the copy bandwidth): what those two change, in the same run.
      HardwareProfile bare = quiet;
      bare.op_overhead_s = both.bare_op_s;
      bare.memory_bandwidth = both.copy_bandwidth;
      bare.vector_flops = both.copy_vector_flops;
      bare.op_rate.clear();
      absl::StatusOr<StepPrediction> bare_pred = Predict(row, bare);
      out.bare_pred.push_back(bare_pred.ok() ? bare_pred->step_s : 0);
      Emit(absl::StrFormat(
          "| %s | %d | %.1f | %.1f | %+.0f%% | %d%s | %.1f (%.0f + %.0f + %.0f) | %.1f | %.0f%% | "
          "%.1f |\n",
          c.Name(), c.mesh.world(), 1e3 * p.step_s, 1e3 * row.measured,
          100 * (p.step_s - row.measured) / row.measured, row.pass_measured.size(),
          row.Agreed(s_.agree) ? "" : " (no two agree)", 1e3 * p.compute_s, 1e3 * p.gemm_s,
          1e3 * p.other_s, 1e3 * p.overhead_s, 1e3 * (p.blocking_comm_s + p.exposed_comm_s),
          100 * p.bubble, 1e3 * row.static_s));
    }
    return out;
  }

  // The fit over all meshes: within 20% and Spearman with each profile, by how the ranks sit on
  // the cores, without the per-op cost and op speeds, and how many meshes' passes agreed.
  void ReportFit(const Calibration& first, const Calibration& second, const Predictions& p) {
    const auto d128 = [](const HardwareProfile& q) { return q.gemm.at(DType::kF32)[4].second; };
    Emit(absl::StrFormat(
        "\nThe profile measured again after the steps: GEMM at d = 128 %.3g flop/s (at the start "
        "%.3g), the ops' own speeds %.2fx the start's (median over kinds), %.2f effective cores "
        "(%.2f). Each rate is the faster of the two.\n\n"
        "With that profile: %d of %zu meshes within 20%%, Spearman rank correlation of predicted "
        "and measured step times %.3f.\n"
        "With the profile as measured at the start: %d of %zu within 20%%, Spearman %.3f. "
        "Load average %.2f at the end.\n",
        d128(second.hw), d128(first.hw), MedianRatio(second.hw.op_rate, first.hw.op_rate),
        second.hw.cores, first.hw.cores, Within(p.predicted, p.measured), p.predicted.size(),
        Spearman(p.predicted, p.measured), Within(p.static_pred, p.measured), p.predicted.size(),
        Spearman(p.static_pred, p.measured), LoadAverage()));
    ReportByCores(p);
    Emit(absl::StrFormat(
        "Without the framework per-op cost and the ops' own speeds (that profile with a bare "
        "tensor op's cost and the copy bandwidth): %d of %zu within 20%%, Spearman %.3f.\n",
        Within(p.bare_pred, p.measured), p.bare_pred.size(), Spearman(p.bare_pred, p.measured)));
    Emit(absl::StrFormat(
        "Measurement: %d to %d passes (%d run); %d of %zu meshes have two passes whose fastest "
        "steps agree within %.0f%%.\n",
        s_.min_passes, s_.max_passes, passes_run_, p.agreed, rows_.size(), 100 * s_.agree));
  }

  // The measurement against itself: how well a row's second fastest pass ranks the meshes as
  // its fastest does. No predictor can rank them more consistently than the measurements agree
  // with each other.
  void ReportSelfAgreement() {
    std::vector<double> first, second, spread;
    for (const Row& row : rows_) {
      std::vector<double> v = row.pass_measured;
      std::sort(v.begin(), v.end());
      first.push_back(v[0]);
      second.push_back(v.size() > 1 ? v[1] : v[0]);
      spread.push_back(second.back() / first.back() - 1);
    }
    std::sort(spread.begin(), spread.end());
    Emit(absl::StrFormat(
        "The measurements against themselves: Spearman of each mesh's fastest and second fastest "
        "pass %.3f; second over fastest: median +%.1f%%, largest +%.0f%%.\n",
        Spearman(first, second), 100 * spread[spread.size() / 2], 100 * spread.back()));
  }

  const std::string& report() const { return report_; }

 private:
  static absl::Status CalibrationFailed() {
    return absl::InternalError("the calibration failed (above)");
  }

  static int Within(const std::vector<double>& pred, const std::vector<double>& measured) {
    int n = 0;
    for (size_t i = 0; i < pred.size(); ++i) {
      n += std::abs(pred[i] - measured[i]) <= 0.2 * measured[i];
    }
    return n;
  }

  void Emit(const std::string& s) {
    std::cout << s << std::flush;
    report_ += s;
  }
  void Say(bool report, const std::string& s) {
    if (report) Emit(s);
  }

  PlanRequest Request(const Row& row) const {
    PlanRequest req;
    // s_.cfg's --dtype was checked (GptConfigFromFlags): one SetGptModel takes.
    SetGptModel(s_.cfg, &req).IgnoreError();
    req.global_batch = s_.batch;
    req.gpus = row.candidate.mesh.world();
    req.gpus_per_node = req.gpus;
    req.only_meshes = {row.text};
    return req;
  }

  // A row's predicted step with `hw`: the planner's (PlanGpt on this mesh), or with a simulated
  // link, PredictOnSimulatedLink (every collective on the link, overlapped per s_.step).
  absl::StatusOr<StepPrediction> Predict(const Row& row, const HardwareProfile& hw) const {
    if (s_.link.busbw > 0) {
      return PredictOnSimulatedLink(Request(row), row.text, hw, s_.link, s_.step,
                                    ShapeOnlyProfiler(s_.so_device));
    }
    absl::StatusOr<Plan> plan = PlanGpt(Request(row), hw, ShapeOnlyProfiler(s_.so_device));
    if (!plan.ok()) return plan.status();
    if (plan->rows.empty()) return absl::FailedPreconditionError("the mesh does not fit");
    return plan->rows[0].prediction;
  }

  // The framework's cost per recorded op: a tiny-shape GPT step (the same layers, so the same
  // kinds of ops through shardmap's type checks, the tape and value wrappers) on one rank, its
  // time less its modelled arithmetic, over its op count.
  absl::StatusOr<double> FrameworkOpCost(const HardwareProfile& hw, bool report) {
    GptConfig tiny = s_.cfg;
    tiny.d_model = s_.cfg.heads * 2;
    tiny.vocab = 16;
    tiny.seq = 4;
    const int64_t tiny_batch = 1, tiny_steps = 12;
    PlanRequest req;
    SetGptModel(tiny, &req).IgnoreError();  // s_.cfg's precision, checked
    req.global_batch = tiny_batch;
    req.gpus = 1;
    req.gpus_per_node = 1;
    req.only_meshes = {"single"};
    absl::StatusOr<Plan> plan = PlanGpt(req, hw, ShapeOnlyProfiler(Device::Cpu()));
    absl::StatusOr<std::vector<RoleWork>> roles =
        plan.ok() ? ShapeOnlyProfiler(Device::Cpu())(plan->rows[0].candidate, req) : plan.status();
    std::vector<int64_t> tiny_tokens((tiny_batch * tiny_steps + 1) * tiny.seq + 1);
    for (size_t i = 0; i < tiny_tokens.size(); ++i) tiny_tokens[i] = (i * 7 + 3) % tiny.vocab;
    TrainOptions o;
    o.steps = tiny_steps;
    o.batch = tiny_batch;
    double best = 1e30;
    o.hooks.on_step = [&](const StepInfo& st) { best = std::min(best, st.seconds); };
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
      return per_op.status();
    }
    Say(report, absl::StrFormat(
        "Framework cost per recorded op: a tiny GPT step (%d layers, d_model %d, seq %d, batch "
        "%d, one rank) of %lld ops took %.3f ms (best of %d), its modelled arithmetic %.3f ms: "
        "%.3g s per op (the bare tensor op of the profile: %.3g s), charged per op below.\n\n",
        tiny.layers, tiny.d_model, tiny.seq, tiny_batch, (long long)(*roles)[0].op_count,
        1e3 * best, tiny_steps,
        1e3 * (plan->rows[0].prediction.gemm_s + plan->rows[0].prediction.other_s), *per_op,
        hw.op_overhead_s));
    return *per_op;
  }

  // The step's own GEMM shapes (every row's, forward and backward, transposed operands and
  // batched attention products included), each timed once on this CPU: each GEMM is priced at
  // its own measured rate. Reports them against the min_dim curve at the machine's d = 128 GEMM
  // rate around them.
  absl::Status MeasureStepGemms(HardwareProfile* hw, bool report) {
    const LoadSample s0 = SampleLoad();
    int timed = 0;
    for (Row& row : rows_) {
      absl::StatusOr<Plan> plan = PlanGpt(Request(row), *hw, ShapeOnlyProfiler(s_.so_device));
      if (!plan.ok()) {
        std::cerr << "plan_validate: " << row.text << ": " << plan.status().message() << "\n";
        return plan.status();
      }
      absl::StatusOr<std::vector<RoleWork>> roles =
          ShapeOnlyProfiler(s_.so_device)(plan->rows[0].candidate, Request(row));
      absl::StatusOr<int> n = roles.ok() ? MeasureGemmShapes(*roles, hw) : roles.status();
      if (!n.ok()) {
        std::cerr << "plan_validate: " << row.text << ": " << n.status().message() << "\n";
        return n.status();
      }
      timed += *n;
    }
    const LoadSample s1 = SampleLoad();
    const double exact_ref = std::max(s0.gemm_rate, s1.gemm_rate);
    Say(report, absl::StrFormat(
        "The step's own GEMM shapes: %d distinct (batch, m, n, k, layouts), each timed once "
        "(best of 3) while the d = 128 GEMM ran at %.3g flop/s. Their measured rates against "
        "the min_dim "
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
      Say(report, absl::StrFormat("| %s | %d | %.2f | %.2f | %.2f |\n", layout, v.size(),
                                  v[v.size() / 2], v.front(), v.back()));
    }
    Say(report, "\n");
    return absl::OkStatus();
  }

  // One rank's real step at a quarter of the batch, every op timed (OpCounter::kTimed): the op
  // records of its fastest step, and that step's seconds.
  // sync: steps that run beside this one (MeasureSharedOpRates) start together (the ranks of a
  // mesh do: their collectives hold them in step); this run leaves it when it ends.
  absl::StatusOr<std::vector<OpCount>> TimedStepOps(int64_t cal_batch, double* best,
                                                    std::barrier<>* sync = nullptr) {
    TrainOptions o;
    o.steps = 6;
    o.batch = cal_batch;
    OpCounter* counter = nullptr;
    size_t at_step = 0;
    std::chrono::steady_clock::time_point t_step;
    std::vector<OpCount> best_ops;
    o.hooks.spmd_runner = [&](const Mesh& m, const std::function<void(RankContext&)>& body) {
      return RunSpmd(m, [&](RankContext& ctx) {
        OpCounter timed(OpCounter::kTimed);
        counter = &timed;
        body(ctx);
        counter = nullptr;
      });
    };
    o.hooks.on_phase = [&](const char* phase) {
      const std::string ph = phase;
      if (ph == "step") {
        if (sync != nullptr) sync->arrive_and_wait();
        at_step = counter->ops().size();
        t_step = std::chrono::steady_clock::now();
      } else if (ph == "end") {
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
        if (s < *best) {
          *best = s;
          best_ops.assign(counter->ops().begin() + at_step, counter->ops().end());
        }
      }
    };
    absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), s_.cfg, false);
    absl::StatusOr<TrainResult> r =
        layout.ok() ? TrainGpt(*layout, InitGpt(s_.cfg, 1), tokens_, o) : layout.status();
    if (sync != nullptr) sync->arrive_and_drop();
    if (!r.ok()) return r.status();
    return best_ops;
  }

  // The non-GEMM ops' own speeds: one rank's real step of the same model at a quarter of the
  // batch (so no row's step), every op timed, the records of its fastest step: each kind at its
  // bytes over its time beyond a bare op's cost (WithOpRates). Kinds without a rate, and the ops
  // one rank alone never runs (a collective's local sum, sequence parallelism's slices), are
  // priced at the copy bandwidth slowed as much as the timed kinds were in all: that slowdown.
  absl::StatusOr<double> MeasureOpRates(double bare_op_s, HardwareProfile* hw, bool report) {
    const int64_t cal_batch = std::max<int64_t>(1, s_.batch / 4);
    double best = 1e30;
    absl::StatusOr<std::vector<OpCount>> ops = TimedStepOps(cal_batch, &best);
    const std::vector<OpCount> best_ops = ops.ok() ? *ops : std::vector<OpCount>{};
    HardwareProfile copy_priced = *hw;
    absl::StatusOr<std::vector<OpRateRow>> kinds =
        ops.ok() ? WithOpRates(best_ops, bare_op_s, hw) : ops.status();
    if (!kinds.ok()) {
      std::cerr << "plan_validate: the ops' own speeds: " << kinds.status().message() << "\n";
      return kinds.status();
    }
    double timed_s = 0, gemm_s = 0, at_copy_s = 0, beyond_s = 0;
    for (const OpCount& op : best_ops) {
      timed_s += op.seconds;
      if (op.gemm.has_value() || IsGemmOpName(op.op)) gemm_s += op.seconds;
    }
    std::string table =
        "| op | dtype | calls | MB | ms | GB/s | vs the copy bandwidth |\n"
        "|---|---|---|---|---|---|---|\n";
    int shown = 0;
    for (const OpRateRow& k : *kinds) {
      if (k.rate <= 0) continue;
      const double copy_s = *copy_priced.OtherSeconds({k.op, k.dtype, 0, k.bytes});
      at_copy_s += copy_s;
      beyond_s += k.bytes / k.rate;
      if (shown++ < 14) {
        absl::StrAppendFormat(&table, "| %s | %s | %d | %.2f | %.2f | %.2f | %.2fx slower |\n",
                              k.op, DTypeName(k.dtype), k.count, k.bytes / 1e6, 1e3 * k.seconds,
                              k.rate / 1e9, copy_priced.memory_bandwidth / k.rate);
      }
    }
    double other_slowdown = 1;
    if (at_copy_s > 0) other_slowdown = beyond_s / at_copy_s;
    hw->memory_bandwidth /= other_slowdown;
    hw->vector_flops /= other_slowdown;
    Say(report, absl::StrFormat(
        "Non-GEMM ops at their own speeds: one rank's step at batch %d, every op timed; its "
        "fastest step took %.1f ms, of which %d ops %.1f ms (GEMMs %.1f ms). Each kind is priced "
        "at its bytes over its time beyond a bare op's cost (%.2g s per call); %zu kinds, the "
        "largest:\n\n%s\nKinds without a rate (and ops one rank alone never runs) at the copy "
        "bandwidth / %.2f, the rated kinds' slowdown in all.\n\n",
        cal_batch, 1e3 * best, best_ops.size(), 1e3 * timed_s, 1e3 * gemm_s, bare_op_s,
        hw->op_rate.size(), table, other_slowdown));
    return other_slowdown;
  }

  // The same kinds' speeds while as many such steps run at once as the machine has hardware
  // threads (each its own thread and OpCounter, their steps started together): what the ranks
  // of a simulated mesh see, sharing the caches and the memory (HardwareProfile::shared_op_rate; the cost model interpolates by
  // the ranks computing at once). Each kind's rate is its bytes over its time summed over the
  // threads' fastest steps.
  absl::Status MeasureSharedOpRates(double bare_op_s, HardwareProfile* hw, bool report) {
    const int threads = static_cast<int>(std::thread::hardware_concurrency());
    if (threads < 2) return absl::OkStatus();  // one rank at a time: op_rate is what it sees
    const int64_t cal_batch = std::max<int64_t>(1, s_.batch / 4);
    std::vector<absl::StatusOr<std::vector<OpCount>>> ops(threads);
    std::vector<double> best(threads, 1e30);
    {
      std::barrier<> sync(threads);
      std::vector<std::thread> runs;
      for (int i = 0; i < threads; ++i) {
        runs.emplace_back([&, i] { ops[i] = TimedStepOps(cal_batch, &best[i], &sync); });
      }
      for (std::thread& t : runs) t.join();
    }
    std::vector<OpCount> all;
    for (const auto& o : ops) {
      if (!o.ok()) return o.status();
      all.insert(all.end(), o->begin(), o->end());
    }
    HardwareProfile shared = *hw;
    shared.op_rate.clear();
    absl::StatusOr<std::vector<OpRateRow>> kinds = WithOpRates(all, bare_op_s, &shared);
    if (!kinds.ok()) return kinds.status();
    hw->shared_op_rate_threads = threads;
    hw->shared_op_rate = shared.op_rate;
    std::vector<double> slower;
    double alone_s = 0, shared_s = 0;
    for (const OpRateRow& k : *kinds) {
      const auto a = hw->op_rate.find({k.op, k.dtype});
      if (k.rate <= 0 || a == hw->op_rate.end()) continue;
      slower.push_back(a->second / k.rate);
      alone_s += k.bytes / a->second;
      shared_s += k.bytes / k.rate;
    }
    std::sort(slower.begin(), slower.end());
    Say(report, absl::StrFormat(
        "The same step on %d threads at once (the ranks of a simulated mesh share the caches and "
        "the memory), every op timed: the rated kinds %.2fx slower in all than one rank alone "
        "(median kind %.2fx, %.2fx to %.2fx); the planner prices a mesh's non-GEMM ops between "
        "the two by the ranks computing at once (shared_op_rate).\n\n",
        threads, alone_s > 0 ? shared_s / alone_s : 1.0,
        slower.empty() ? 1.0 : slower[slower.size() / 2], slower.empty() ? 1.0 : slower.front(),
        slower.empty() ? 1.0 : slower.back()));
    return absl::OkStatus();
  }

  // One pass of one mesh: predicted with `hw` (the start profile), then trained for --steps
  // steps; its fastest step after the first is this pass's measurement.
  absl::Status MeasureRow(const HardwareProfile& hw, int pass, Row* row) {
    absl::StatusOr<Plan> plan = PlanGpt(Request(*row), hw, ShapeOnlyProfiler(s_.so_device));
    if (!plan.ok()) {
      std::cerr << "plan_validate: " << row->text << ": " << plan.status().message() << "\n";
      return plan.status();
    }
    const Candidate& c = plan->rows[0].candidate;
    row->candidate = c;
    row->static_s = plan->rows[0].prediction.step_s;
    if (s_.link.busbw > 0) {  // the plan above priced the mesh without the link
      absl::StatusOr<StepPrediction> on_link = Predict(*row, hw);
      if (!on_link.ok()) {
        std::cerr << "plan_validate: " << row->text << ": " << on_link.status().message() << "\n";
        return on_link.status();
      }
      row->static_s = on_link->step_s;
    }
    absl::StatusOr<Mesh> mesh = c.mesh.axes.empty() ? Mesh() : ParseMesh(c.mesh.ToString());
    absl::StatusOr<GptLayout> layout = GptLayout::Create(*mesh, s_.cfg, c.sp);
    if (!layout.ok()) {
      std::cerr << "plan_validate: " << layout.status().message() << "\n";
      return layout.status();
    }
    TrainOptions o;
    o.steps = s_.steps;
    o.batch = s_.batch;
    o.pipeline.microbatches = c.pipeline.microbatches;
    o.pipeline.schedule = c.pipeline.schedule;
    // Without a link the planner prices simulated CPU ranks' collectives inline, as the
    // reference schedule runs them (cost_model.h): the rows train that schedule (the trainer's
    // default overlaps, which on shared cores only adds its lanes' hand-offs to compute).
    o.overlap.on = false;
    if (s_.link.busbw > 0) {
      o.overlap.on = s_.step.overlap;
      o.overlap.bucket_bytes = static_cast<int64_t>(s_.step.bucket_bytes);
      o.hooks.spmd_runner = SimulatedLinkSpmdRunner(
          {.ring = {.alpha_s = s_.link.alpha_s, .busbw = s_.link.busbw}});
    }
    std::vector<double> secs;
    o.hooks.on_step = [&](const StepInfo& s) { secs.push_back(s.seconds); };
    absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(s_.cfg, 1), tokens_, o);
    if (!r.ok()) {
      std::cerr << "plan_validate: " << row->text << ": " << r.status().message() << "\n";
      return r.status();
    }
    row->pass_measured.push_back(*std::min_element(secs.begin() + 1, secs.end()));
    row->measured = std::min(row->measured, row->pass_measured.back());
    std::cerr << "plan_validate: pass " << pass + 1 << " " << row->text << ": steps (ms)";
    for (double sec : secs) std::cerr << " " << absl::StrFormat("%.1f", 1e3 * sec);
    std::cerr << "\n";
    return absl::OkStatus();
  }

  // By how the ranks sit on the cores: a core each (as a GPU rank has its device) or sharing
  // them (more ranks than cores: the OS runs them in turn).
  void ReportByCores(const Predictions& p) {
    const unsigned hw_threads = std::max(1u, std::thread::hardware_concurrency());
    for (const bool own : {true, false}) {
      std::vector<double> pr, me;
      int in = 0;
      for (size_t i = 0; i < rows_.size(); ++i) {
        if ((rows_[i].candidate.mesh.world() <= static_cast<int>(hw_threads)) != own) continue;
        pr.push_back(p.predicted[i]);
        me.push_back(p.measured[i]);
        in += std::abs(p.predicted[i] - p.measured[i]) <= 0.2 * p.measured[i];
      }
      if (pr.size() < 2) continue;
      Emit(absl::StrFormat(
          "%s: %d of %zu within 20%%, Spearman %.3f.\n",
          own ? absl::StrFormat("Meshes of at most %u ranks (a core each)", hw_threads)
              : absl::StrFormat("Meshes of more than %u ranks (sharing the cores)", hw_threads),
          in, pr.size(), Spearman(pr, me)));
    }
  }

  Settings s_;
  std::vector<int64_t> tokens_;
  std::vector<Row> rows_;
  std::string report_;
  int passes_run_ = 0;
};

int Main() {
  std::optional<Settings> settings = SettingsFromFlags();
  if (!settings.has_value()) return 2;
  const double load0 = LoadAverage();
  Validation v(*settings);
  if (!v.ParseRows().ok()) return 2;
  v.EmitHeader(load0);
  absl::StatusOr<Calibration> first = v.Calibrate("at the start", true);
  if (!first.ok()) return 1;
  if (!v.MeasurePasses(first->hw).ok()) return 1;
  // The profile again, after the steps: each rate the faster of its two measurements.
  absl::StatusOr<Calibration> second = v.Calibrate("after the steps", false);
  if (!second.ok()) return 1;
  const Calibration both = Faster(*first, *second);
  absl::StatusOr<Predictions> predictions = v.ReportRows(both);
  if (!predictions.ok()) return 1;
  v.ReportFit(*first, *second, *predictions);
  v.ReportSelfAgreement();
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    std::ofstream f(out);
    f << v.report();
  }
  return 0;
}

}  // namespace
}  // namespace shardmap::planner

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return shardmap::planner::Main();
}
