// Tokens/s of a GPT-2 training step on CPU ranks or GPUs.
//   --model=small (default): 4 layers, d_model 256, 8 heads, seq 256, vocab 256, batch 8, f32,
//     AdamW + clipping, on 1 device and on dp2, tp2, fsdp2, cp2 (ring attention), pp2 (1F1B, 4
//     microbatches, the trainer's pipeline strategy) over 2 ranks; and the same model with MoE
//     MLPs (4 experts, top-2, capacity factor 1.25) on 1 device and with the experts over ep2
//     (moe rows: speedup_vs_1dev is over the 1-device MoE step, dropped_pct the share of
//     assignments over capacity).
//   --model=gpt2: GPT-2 124M (12 layers, d 768, 12 heads, vocab 50304, seq 1024, batch 16) on
//     1 rank and tp2, the shape of bench/peers' PyTorch reference.
//   --device=cpu (default) or cuda: every mesh's ranks as virtual ranks sharing GPU 0 (a stream
//     each), so tp2's cost over the 1-rank step is the virtual-rank overhead.
//   --dtype=f32 (default) or bf16 (mixed precision: f32 master weights, bf16 compute).
//
//   bazel run -c opt --config=opt //bench:gpt_bench
//   gpt_bench --device=cuda --model=gpt2 --dtype=bf16     # on the GPU machine (tools/gpu_bundle.sh)
//   bash bench/peers/gpt_torch.sh        # the same model in PyTorch eager, side by side
//
// Each case runs one TrainGpt (one RunSpmd) of warm-up + measured steps and reports each measured
// step's wall time (manual time; on a GPU the step ends with a stream synchronisation). Counters:
// tokens_per_s; step_ms; fwd_collective_ms, the forward ops that were collectives (from the
// per-rank trace, CPU only; backward collectives are not timed separately); comm_KiB per step
// (rank 0); speedup_vs_1dev, this step's rate over the 1-device step's; on a GPU peak_mem_MiB
// (the caching allocator's peak on GPU 0, all virtual ranks) and mfu (bench/gpt_mfu.h: 6N +
// attention FLOPs over the card's dense bf16 peak, when the card is in its table).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <cstdio>
#include <cstring>

#include "absl/flags/usage.h"
#include "bench/bench_help.h"
#include "benchmark/benchmark.h"
#include "bench/bench_tokens.h"
#include "bench/gpt_mfu.h"
#include "models/gpt.h"
#include "tensor/cuda/runtime.h"

namespace shardmap {
namespace {

constexpr int kWarmup = 1, kMeasured = 4;

// The command line's choices (main).
bool g_cuda = false;
bool g_gpt2 = false;
bool g_bf16 = false;

GptConfig BenchConfig() {
  GptConfig c;
  c.layers = g_gpt2 ? 12 : 4;
  c.d_model = g_gpt2 ? 768 : 256;
  c.heads = g_gpt2 ? 12 : 8;
  c.vocab = g_gpt2 ? 50304 : 256;
  c.seq = g_gpt2 ? 1024 : 256;
  c.dtype = DType::kF32;
  if (g_bf16) c.compute = DType::kBF16;
  return c;
}
int64_t Batch() { return g_gpt2 ? 16 : 8; }
int64_t TokensPerStep() { return Batch() * BenchConfig().seq; }

std::vector<int64_t> Tokens() {
  const GptConfig c = BenchConfig();
  return bench::RandomTokens(std::max<int64_t>(1 << 16, 2 * TokensPerStep() + 1), c.vocab);
}

struct Measured {
  std::vector<double> seconds;
  double fwd_collective_s = 0;  // per step, rank 0
  double comm_bytes = 0;        // per step, rank 0
  double dropped_pct = 0;       // MoE: mean share of assignments dropped
  int64_t peak_device_bytes = -1;
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
  o.batch = Batch();
  const bool pp = mesh.rfind("pp=", 0) == 0;
  o.tracing.keep_events = !pp && !g_cuda;
  if (g_cuda) o.runtime.placement = DevicePlacement::SharedGpu(0);
  if (pp) {
    o.pipeline.microbatches = 4;
    o.pipeline.schedule = "1f1b";
  }
  Measured m;
  o.hooks.on_step = [&](const StepInfo& s) {
    if (s.step < kWarmup) return;
    m.seconds.push_back(s.seconds);
    if (s.moe_assignments > 0) m.dropped_pct += 100.0 * s.moe_dropped / s.moe_assignments / kMeasured;
    for (const CollectiveRecord& r : *s.log) m.comm_bytes += r.bytes;
  };
  absl::StatusOr<TrainResult> trained = TrainGpt(layout, InitGpt(cfg, 1), Tokens(), o);
  if (!trained.ok()) {
    std::fprintf(stderr, "gpt_bench %s: %s\n", mesh.c_str(),
                 std::string(trained.status().message()).c_str());
    return m;  // no seconds: the case reports the error
  }
  const TrainResult& r = *trained;
  m.peak_device_bytes = r.peak_device_bytes_per_rank;
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
  return m.seconds.size() * static_cast<double>(TokensPerStep()) / s;
}

void BM_GptStep(benchmark::State& state, const std::string& mesh, bool moe) {
  static std::map<std::string, Measured>* cache = new std::map<std::string, Measured>();
  const std::string base = moe ? "moe:" : "", key = base + mesh;
  if (!cache->count(base)) (*cache)[base] = Run("", moe);
  if (!cache->count(key)) (*cache)[key] = Run(mesh, moe);
  const Measured& m = (*cache)[key];
  if (m.seconds.empty()) {
    state.SkipWithError("training failed (the message is on stderr)");
    for (auto _ : state) {
    }
    return;
  }
  size_t i = 0;
  double total = 0;
  for (auto _ : state) {
    const double s = m.seconds[i++ % m.seconds.size()];
    total += s;
    state.SetIterationTime(s);
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(TokensPerStep()) * state.iterations(), benchmark::Counter::kIsRate);
  const double step_s = total / std::max<int64_t>(1, state.iterations());
  state.counters["step_ms"] = step_s * 1e3;
  if (m.peak_device_bytes >= 0) state.counters["peak_mem_MiB"] = m.peak_device_bytes / 1048576.0;
  if (g_cuda) {
    const double peak = bench::DenseBf16PeakFlops(bench::CudaDeviceName(0));
    if (peak > 0) {
      state.counters["mfu"] = bench::GptStepFlops(BenchConfig(), TokensPerStep()) / step_s / peak;
    }
  }
  state.counters["fwd_collective_ms"] = m.fwd_collective_s * 1e3;
  state.counters["comm_KiB"] = m.comm_bytes / 1024;
  state.counters["speedup_vs_1dev"] = MeanRate(m) / MeanRate((*cache)[base]);
  if (moe) state.counters["dropped_pct"] = m.dropped_pct;
}

void Register() {
  struct Case {
    const char* name;
    std::string mesh;
    bool moe;
  };
  std::vector<Case> cases;
  if (g_gpt2) {
    cases = {{"gpt2_124m/mesh:1", "", false}, {"gpt2_124m/mesh:tp2", "tp=2", false}};
  } else {
    cases = {{"mesh:1/d:256", "", false},        {"mesh:dp2/d:256", "dp=2", false},
             {"mesh:tp2/d:256", "tp=2", false},  {"mesh:fsdp2/d:256", "dp_shard=2", false},
             {"mesh:cp2/d:256", "cp=2", false},  {"mesh:pp2/d:256", "pp=2", false}};
    cases.push_back({"moe4/mesh:1/d:256", "", true});
    cases.push_back({"moe4/mesh:ep2/d:256", "ep=2", true});
  }
  const std::string prefix = std::string("gpt_step/") + (g_cuda ? "cuda/" : "") +
                             (g_bf16 ? "bf16/" : "");
  for (const Case& c : cases) {
    const std::string mesh = c.mesh;
    const bool moe = c.moe;
    benchmark::RegisterBenchmark((prefix + c.name).c_str(),
                                 [mesh, moe](benchmark::State& st) { BM_GptStep(st, mesh, moe); })
        ->UseManualTime()
        ->Iterations(kMeasured)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace
}  // namespace shardmap

// Our flags (--device, --model, --dtype) first; the rest go to Google Benchmark.
int main(int argc, char** argv) {
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--device=")) {
      if (std::strcmp(v, "cpu") != 0 && std::strcmp(v, "cuda") != 0) {
        std::fprintf(stderr, "gpt_bench: --device %s: use cpu or cuda\n", v);
        return 2;
      }
      shardmap::g_cuda = std::strcmp(v, "cuda") == 0;
    } else if (const char* v = value("--model=")) {
      if (std::strcmp(v, "small") != 0 && std::strcmp(v, "gpt2") != 0) {
        std::fprintf(stderr, "gpt_bench: --model %s: use small or gpt2\n", v);
        return 2;
      }
      shardmap::g_gpt2 = std::strcmp(v, "gpt2") == 0;
    } else if (const char* v = value("--dtype=")) {
      if (std::strcmp(v, "f32") != 0 && std::strcmp(v, "bf16") != 0) {
        std::fprintf(stderr, "gpt_bench: --dtype %s: use f32 or bf16\n", v);
        return 2;
      }
      shardmap::g_bf16 = std::strcmp(v, "bf16") == 0;
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (shardmap::g_cuda && !shardmap::cuda::Available()) {
    std::fprintf(stderr, "gpt_bench: --device=cuda: no usable GPU (%s); use --device=cpu\n",
                 shardmap::cuda::UnavailableReason().c_str());
    return 2;
  }
  int n = static_cast<int>(rest.size());
  absl::SetProgramUsageMessage(
      "gpt_bench: the whole GPT-2 training step (forward, backward, AdamW), ours against "
      "PyTorch's in bench/peers; our flags first, the rest go to Google Benchmark");
  shardmap::bench::InitializeBenchmark(
      &n, rest.data(), "gpt_bench",
      "  --device (cpu or cuda) default: cpu\n"
      "  --model (small, or gpt2: GPT-2 124M shapes) default: small\n"
      "  --dtype (f32, or bf16 mixed precision) default: f32\n");
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  shardmap::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
