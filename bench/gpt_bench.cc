// Tokens/s of a GPT-2 training step (4 layers, d_model 256, 8 heads, seq 256, vocab 256, batch 8,
// f32, AdamW + clipping) on 1 device and on dp2, tp2, fsdp2, cp2 (ring attention), pp2 (1F1B, 4
// microbatches, the trainer's pipeline strategy) over 2 simulated CPU devices; and the same model with MoE
// MLPs (4 experts, top-2, capacity factor 1.25) on 1 device and with the experts over ep2 (moe
// rows: speedup_vs_1dev is over the 1-device MoE step, dropped_pct the share of assignments over
// capacity).
//
//   bazel run -c opt --config=opt //bench:gpt_bench
//   bash bench/peers/gpt_torch.sh        # the same model in PyTorch eager, side by side
//
// Each case runs one TrainGpt (one RunSpmd) of warm-up + measured steps and reports each measured
// step's wall time (manual time). Counters: tokens/s; fwd_collective_ms, the forward ops that
// were collectives (from the per-rank trace; backward collectives are not timed separately);
// comm_KiB per step (rank 0); and speedup_vs_1dev, this step's rate over the 1-device step's.
// The pipeline trainer records no trace, so pp2's fwd_collective_ms is 0 (not measured).
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "bench/bench_tokens.h"
#include "models/gpt.h"

namespace shardmap {
namespace {

constexpr int kWarmup = 1, kMeasured = 4;

GptConfig BenchConfig() {
  GptConfig c;
  c.layers = 4;
  c.d_model = 256;
  c.heads = 8;
  c.vocab = 256;
  c.seq = 256;
  c.dtype = DType::kF32;
  return c;
}

std::vector<int64_t> Tokens() { return bench::RandomTokens(1 << 16, 256); }

struct Measured {
  std::vector<double> seconds;
  double fwd_collective_s = 0;  // per step, rank 0
  double comm_bytes = 0;        // per step, rank 0
  double dropped_pct = 0;       // MoE: mean share of assignments dropped
};

GptConfig MoeConfigFor(bool moe) {
  GptConfig c = BenchConfig();
  if (moe) c.moe = MoeConfig{.experts = 4, .topk = 2, .capacity_factor = 1.25, .aux_loss_coef = 0.01};
  return c;
}

Measured Run(const std::string& mesh, bool moe) {
  const GptConfig cfg = MoeConfigFor(moe);
  GptLayout layout = *GptLayout::Create(*ParseMesh(mesh), cfg, false);
  TrainOptions o;
  o.steps = kWarmup + kMeasured;
  o.batch = 8;
  const bool pp = mesh.rfind("pp=", 0) == 0;
  o.trace = !pp;
  if (pp) {
    o.microbatches = 4;
    o.schedule = "1f1b";
  }
  Measured m;
  o.on_step = [&](const StepInfo& s) {
    if (s.step < kWarmup) return;
    m.seconds.push_back(s.seconds);
    if (s.moe_assignments > 0) m.dropped_pct += 100.0 * s.moe_dropped / s.moe_assignments / kMeasured;
    for (const CollectiveRecord& r : *s.log) m.comm_bytes += r.bytes;
  };
  TrainResult r = *TrainGpt(layout, InitGpt(cfg, 1), Tokens(), o);
  for (const TraceEvent& e : r.trace) {
    if (e.rank == 0 && e.category == "collective") m.fwd_collective_s += e.duration_us * 1e-6;
  }
  // Collective spans of the warm-up steps are included: scale to the measured share.
  m.fwd_collective_s /= (kWarmup + kMeasured);
  m.comm_bytes /= kMeasured;
  return m;
}

double MeanRate(const Measured& m) {
  double s = 0;
  for (double x : m.seconds) s += x;
  return m.seconds.size() * 8.0 * 256 / s;
}

void BM_GptStep(benchmark::State& state, const std::string& mesh, bool moe = false) {
  static std::map<std::string, Measured>* cache = new std::map<std::string, Measured>();
  const std::string base = moe ? "moe:" : "", key = base + mesh;
  if (!cache->count(base)) (*cache)[base] = Run("", moe);
  if (!cache->count(key)) (*cache)[key] = Run(mesh, moe);
  const Measured& m = (*cache)[key];
  size_t i = 0;
  for (auto _ : state) {
    state.SetIterationTime(m.seconds[i++ % m.seconds.size()]);
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      8.0 * 256 * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["fwd_collective_ms"] = m.fwd_collective_s * 1e3;
  state.counters["comm_KiB"] = m.comm_bytes / 1024;
  state.counters["speedup_vs_1dev"] = MeanRate(m) / MeanRate((*cache)[base]);
  if (moe) state.counters["dropped_pct"] = m.dropped_pct;
}

BENCHMARK_CAPTURE(BM_GptStep, "mesh:1/d:256", std::string(""))
    ->Name("gpt_step/mesh:1/d:256")->UseManualTime()->Iterations(kMeasured)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GptStep, "mesh:dp2/d:256", std::string("dp=2"))
    ->Name("gpt_step/mesh:dp2/d:256")->UseManualTime()->Iterations(kMeasured)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GptStep, "mesh:tp2/d:256", std::string("tp=2"))
    ->Name("gpt_step/mesh:tp2/d:256")->UseManualTime()->Iterations(kMeasured)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GptStep, "mesh:fsdp2/d:256", std::string("dp_shard=2"))
    ->Name("gpt_step/mesh:fsdp2/d:256")->UseManualTime()->Iterations(kMeasured)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GptStep, "mesh:cp2/d:256", std::string("cp=2"))
    ->Name("gpt_step/mesh:cp2/d:256")->UseManualTime()->Iterations(kMeasured)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GptStep, "mesh:pp2/d:256", std::string("pp=2"))
    ->Name("gpt_step/mesh:pp2/d:256")->UseManualTime()->Iterations(kMeasured)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GptStep, "moe4/mesh:1/d:256", std::string(""), true)
    ->Name("gpt_step/moe4/mesh:1/d:256")->UseManualTime()->Iterations(kMeasured)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GptStep, "moe4/mesh:ep2/d:256", std::string("ep=2"), true)
    ->Name("gpt_step/moe4/mesh:ep2/d:256")->UseManualTime()->Iterations(kMeasured)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace shardmap
