// Generation tokens/s with and without the KV cache (models/gpt/gpt_generate.h), one CPU rank,
// f32, for both registered models: the cached run prefills the prompt once and then feeds one
// token per step; the uncached one recomputes the whole seq-token window for every new token.
// The figure to read is kv_speedup, the ratio of the two measured in the same run (on a shared
// machine the absolute tokens/s move, the ratio much less).
//
//   OPENBLAS_NUM_THREADS=1 bazel run -c opt //bench:generate_bench
//
// Shapes: 4 layers, d_model 256, 8 heads (Llama: 4 kv heads), vocab 256, seq 128; a 16-token
// prompt and 112 new tokens (the window fills exactly, so both runs attend over the same
// positions at the end).
#include <chrono>
#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "models/gpt.h"
#include "models/gpt/gpt_generate.h"
#include "models/llama/llama_model.h"
#include "models/parallel/parallel_dims.h"

namespace shardmap {
namespace {

constexpr int64_t kPrompt = 16, kNew = 112, kSeq = 128;

std::vector<int64_t> Prompt() {
  std::vector<int64_t> p(kPrompt);
  for (int64_t i = 0; i < kPrompt; ++i) p[i] = (i * 37 + 11) % 256;
  return p;
}

// Seconds for one generation of kNew greedy tokens.
double GenerateSeconds(const Model& m, const std::vector<NamedTensor>& params, KvCacheMode mode,
                       std::vector<int64_t>* tokens) {
  SampleOptions o{.tokens = kNew};
  o.kv_cache = mode;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<int64_t>> r = GenerateGpt(m, params, Prompt(), o);
  const auto t1 = std::chrono::steady_clock::now();
  if (!r.ok()) return -1;
  *tokens = *r;
  return std::chrono::duration<double>(t1 - t0).count();
}

// Both modes alternately in each iteration; counters: tokens/s of each and their ratio, and
// whether the greedy tokens agreed (1) or not (0).
void RunPair(benchmark::State& state, const Model& m, const std::vector<NamedTensor>& params) {
  double cached = 0, uncached = 0;
  bool same = true;
  for (auto _ : state) {
    std::vector<int64_t> a, b;
    const double sa = GenerateSeconds(m, params, KvCacheMode::kOn, &a);
    const double sb = GenerateSeconds(m, params, KvCacheMode::kOff, &b);
    if (sa < 0 || sb < 0) {
      state.SkipWithError("generation failed");
      return;
    }
    cached += sa;
    uncached += sb;
    same = same && a == b;
  }
  const double n = static_cast<double>(state.iterations()) * kNew;
  state.counters["cached_tokens_per_s"] = n / cached;
  state.counters["uncached_tokens_per_s"] = n / uncached;
  state.counters["kv_speedup"] = uncached / cached;
  state.counters["same_tokens"] = same ? 1 : 0;
}

void BM_GenerateGpt2(benchmark::State& state) {
  const GptConfig c{.layers = 4, .d_model = 256, .heads = 8, .vocab = 256, .seq = kSeq};
  const GptLayout l = *GptLayout::Create(*ParseMesh("dp=1"), c, false);
  RunPair(state, l, InitGpt(c, 1));
}
BENCHMARK(BM_GenerateGpt2)->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();

void BM_GenerateLlama3(benchmark::State& state) {
  const LlamaConfig c{.layers = 4, .d_model = 256, .heads = 8, .kv_heads = 4, .ffn_dim = 768,
                      .vocab = 256, .seq = kSeq};
  const LlamaLayout l = *LlamaLayout::Create(*ParseMesh("dp=1"), c, false);
  RunPair(state, l, InitLlama(c, 1));
}
BENCHMARK(BM_GenerateLlama3)->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();

}  // namespace
}  // namespace shardmap
