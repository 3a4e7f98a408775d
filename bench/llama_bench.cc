// Tokens/s of a Llama 3 training step on one CPU rank, 1 thread, by the model-generic trainer
// (models/train/trainer.h: one RunSpmd for the whole run, as in training): forward, backward,
// global-norm clipping 1.0 and AdamW (lr 1e-3, betas 0.9/0.95, wd 0.1 on >= 2-dim tensors), f32.
// Shape: 4 layers, d_model 256, 8 heads, 4 kv heads (GQA, head_dim 32), SwiGLU ffn 768
// (LlamaFfnDim(256, 256), torchtitan's debugmodel rule), vocab 256, seq 256, batch 8, rope theta
// 500000 (gpt_bench's small GPT-2 shape, Llama's blocks). The batches are the trainer's
// sequential BatchAt over bench_tokens' LCG stream, as the PyTorch peer reads them.
//
//   OPENBLAS_NUM_THREADS=1 bazel run -c opt --config=opt //bench:llama_bench
//   bash bench/peers/llama_torch.sh        # this and the same step in PyTorch eager
//
// Counters: tokens_per_s (wall), cpu_ms_per_step (the process's CPU time per measured step:
// unlike the wall time it does not grow when other processes share the cores), loss (last).
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_tokens.h"
#include "benchmark/benchmark.h"
#include "models/llama/llama_model.h"
#include "models/train/trainer.h"

namespace shardmap {
namespace {

constexpr int kWarmup = 1, kMeasured = 4;
constexpr int64_t kBatch = 8;

LlamaConfig BenchConfig() {
  LlamaConfig c;
  c.layers = 4;
  c.d_model = 256;
  c.heads = 8;
  c.kv_heads = 4;
  c.ffn_dim = LlamaFfnDim(256, 256);
  c.vocab = 256;
  c.seq = 256;
  c.rope_theta = 500000;
  c.dtype = DType::kF32;
  return c;
}

double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Measured {
  std::vector<double> seconds, cpu_seconds;
  double loss = 0;
  std::string error;
};

Measured Run() {
  const LlamaConfig cfg = BenchConfig();
  absl::StatusOr<LlamaLayout> layout = LlamaLayout::Create(*ParseMesh("dp=1"), cfg, false);
  Measured m;
  if (!layout.ok()) {
    m.error = std::string(layout.status().message());
    return m;
  }
  TrainOptions o;
  o.steps = kWarmup + kMeasured;
  o.batch = kBatch;
  o.optimizer.adamw = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  o.optimizer.clip = 1.0;
  double cpu = ProcessCpuSeconds();
  o.hooks.on_step = [&](const StepInfo& s) {
    const double now = ProcessCpuSeconds();
    if (s.step >= kWarmup) {
      m.seconds.push_back(s.seconds);
      m.cpu_seconds.push_back(now - cpu);
      m.loss = s.loss;
    }
    cpu = now;
  };
  absl::StatusOr<TrainResult> r =
      TrainGpt(*layout, layout->Init(1), bench::RandomTokens(1 << 16, cfg.vocab), o);
  if (!r.ok()) m.error = std::string(r.status().message());
  return m;
}

void BM_LlamaStep(benchmark::State& state) {
  const Measured m = Run();
  if (!m.error.empty() || m.seconds.empty()) {
    state.SkipWithError(m.error.empty() ? "no measured step" : m.error.c_str());
    for (auto _ : state) {
    }
    return;
  }
  size_t i = 0;
  double cpu = 0;
  for (auto _ : state) {
    state.SetIterationTime(m.seconds[i % m.seconds.size()]);
    cpu += m.cpu_seconds[i % m.seconds.size()];
    ++i;
  }
  const double n = static_cast<double>(std::max<int64_t>(1, state.iterations()));
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(kBatch * BenchConfig().seq) * state.iterations(),
      benchmark::Counter::kIsRate);
  state.counters["cpu_ms_per_step"] = 1e3 * cpu / n;
  state.counters["loss"] = m.loss;
}
BENCHMARK(BM_LlamaStep)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(kMeasured)
    ->UseManualTime();

}  // namespace
}  // namespace shardmap
