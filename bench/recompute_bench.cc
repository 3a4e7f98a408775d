// Activation recomputation (--recompute, models/parallel/recompute.h) at GPT-2-small shapes
// (d 768, 12 heads, vocab 50304, seq 1024, f32, batch 1, one rank) with a few layers: the step's
// peak activation memory (MemoryTracker: the step's peak less parameters, gradients and AdamW
// moments) and its FLOPs (OpCounter) under none, selective and full.
//
//   bazel run -c opt //bench:recompute_bench                       # meta device: exact, instant
//   bazel run -c opt //bench:recompute_bench -- --benchmark_filter=Cpu   # real CPU steps (slow)
//
// BM_Meta/<mode>/<layers>: the shape-only step (the trainer's step on the meta device; its op and
// memory counts equal a CPU run's exactly, shardmap/shape_only.h). BM_Cpu/<mode>/<layers>: the
// same step computed on this CPU (zero parameters), timed, with its MemoryTracker peak.
// Counters: act_MiB (activation peak), flops_G, flops_vs_none (the step's FLOPs over none's),
// extra_vs_fwd (the extra FLOPs over one forward of the blocks, counted on its own),
// and for full: expected_act_MiB, the prediction "none's peak less every block's saved
// activations plus the block inputs plus one block's working set", where one block's saved
// activations are measured as none's peak at L layers less none's peak at L-1 layers.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "benchmark/benchmark.h"
#include "models/gpt/gpt_model.h"
#include "models/train/gpt_shape_only.h"
#include "shardmap/context.h"
#include "tensor/op_counter.h"

namespace shardmap {
namespace {

GptConfig Gpt2Small(int64_t layers) {
  return GptConfig{.layers = layers, .d_model = 768, .heads = 12, .vocab = 50304, .seq = 1024,
                   .dtype = DType::kF32};
}

constexpr int64_t kBatch = 1;

absl::StatusOr<StepProfile> Step(RecomputeMode mode, int64_t layers, Device device) {
  absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), Gpt2Small(layers), false);
  if (!layout.ok()) return layout.status();
  TrainOptions o;
  o.batch = kBatch;
  o.recompute = mode;
  return ProfileGptRank(*layout, o, 0, "", device);
}

// The meta profile of (mode, layers), computed once.
const StepProfile& MetaStep(RecomputeMode mode, int64_t layers) {
  static auto* cache = new std::map<std::pair<int, int64_t>, StepProfile>;
  auto key = std::make_pair(static_cast<int>(mode), layers);
  auto it = cache->find(key);
  if (it == cache->end()) {
    absl::StatusOr<StepProfile> p = Step(mode, layers, Device::Meta());
    if (!p.ok()) {
      std::fprintf(stderr, "%s\n", std::string(p.status().message()).c_str());
      std::abort();
    }
    it = cache->emplace(key, *p).first;
  }
  return it->second;
}

// FLOPs of one forward of the blocks alone (no tape, no trainer), on the meta device.
double BlocksForwardFlops(int64_t layers) {
  const GptConfig c = Gpt2Small(layers);
  GptLayout layout = *GptLayout::Create(Mesh(), c, false);
  SingleRankContext one{Mesh()};
  std::vector<Value> params;
  for (const ParamInfo& p : layout.params()) {
    params.push_back(Value(Tensor::Zeros(p.global_shape, c.dtype, Device::Meta()), SpmdType()));
  }
  const ParamFn use = GptParamUse(layout, params);
  Value x(Tensor::Zeros({kBatch * c.seq, c.d_model}, c.dtype, Device::Meta()), SpmdType());
  OpCounter counter;
  for (int64_t i = 0; i < layers; ++i) x = GptBlock(layout, use, i, x);
  return counter.flops();
}

void Report(benchmark::State& state, RecomputeMode mode, int64_t layers, const StepProfile& p) {
  const StepProfile& none = MetaStep(RecomputeMode::kNone, layers);
  const double mib = 1 << 20;
  state.counters["act_MiB"] = p.activation_peak_bytes / mib;
  state.counters["peak_MiB"] = p.peak_bytes / mib;
  state.counters["flops_G"] = p.flops / 1e9;
  state.counters["flops_vs_none"] = p.flops / none.flops;
  state.counters["extra_vs_fwd"] = (p.flops - none.flops) / BlocksForwardFlops(layers);
  if (mode == RecomputeMode::kFull && layers >= 2) {
    const GptConfig c = Gpt2Small(layers);
    const double block = none.activation_peak_bytes -
                         MetaStep(RecomputeMode::kNone, layers - 1).activation_peak_bytes;
    const double inputs = static_cast<double>(layers) * kBatch * c.seq * c.d_model * 4;
    state.counters["block_MiB"] = block / mib;
    state.counters["expected_act_MiB"] =
        (none.activation_peak_bytes - layers * block + inputs + block) / mib;
  }
}

void BM_Meta(benchmark::State& state) {
  const auto mode = static_cast<RecomputeMode>(state.range(0));
  const int64_t layers = state.range(1);
  state.SetLabel(RecomputeModeName(mode));
  for (auto _ : state) benchmark::DoNotOptimize(MetaStep(mode, layers));
  Report(state, mode, layers, MetaStep(mode, layers));
}

void BM_Cpu(benchmark::State& state) {
  const auto mode = static_cast<RecomputeMode>(state.range(0));
  const int64_t layers = state.range(1);
  state.SetLabel(RecomputeModeName(mode));
  StepProfile p;
  for (auto _ : state) {
    absl::StatusOr<StepProfile> r = Step(mode, layers, Device::Cpu());
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    p = *r;
  }
  Report(state, mode, layers, p);
  // The CPU run's memory and op counts are the meta run's (shape-only execution's promise).
  state.counters["same_as_meta"] =
      p.peak_bytes == MetaStep(mode, layers).peak_bytes && p.flops == MetaStep(mode, layers).flops;
}

void Modes(benchmark::internal::Benchmark* b, std::vector<int64_t> layers) {
  for (int64_t l : layers) {
    for (RecomputeMode m : {RecomputeMode::kNone, RecomputeMode::kSelective, RecomputeMode::kFull}) {
      b->Args({static_cast<int64_t>(m), l});
    }
  }
}

BENCHMARK(BM_Meta)
    ->Apply([](benchmark::internal::Benchmark* b) { Modes(b, {2, 4}); })
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Cpu)
    ->Apply([](benchmark::internal::Benchmark* b) { Modes(b, {2}); })
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace shardmap
