// Activation recomputation (--recompute, models/parallel/recompute.h) at GPT-2-small shapes
// (d 768, 12 heads, vocab 50304, seq 1024, f32, batch 1, one rank) with a few layers: the step's
// peak activation memory (MemoryTracker: the step's peak less parameters, gradients and AdamW
// moments) and its FLOPs (OpCounter) under none, selective and full.
//
//   bazel run -c opt //bench:recompute_bench                       # meta device: exact, instant
//   bazel run -c opt //bench:recompute_bench -- --benchmark_filter=Cpu   # real CPU steps (slow)
//
// BM_Meta/<mode>/<layers>: one optimizer step through TrainGpt on the meta device (the
// shape-only runner: its op and memory counts equal a CPU run's exactly, shardmap/shape_only.h).
// BM_Cpu/<mode>/<layers>: the same step computed on this CPU (zero parameters).
// Counters: tape_MiB (TrainResult's peak of saved activations: what the summary reports),
// fwdbwd_MiB (MemoryTracker: the forward + backward's peak of live tensors above the step's
// start: activations, gradients, temporaries), step_MiB (MemoryTracker: the whole step's peak,
// parameters, AdamW moments and the optimizer's temporaries included), flops_G, flops_vs_none
// (the step's FLOPs over none's), extra_vs_fwd (the extra FLOPs over one forward of the blocks,
// counted on its own), fwdbwd_s (CPU: the forward + backward's wall time), and for full:
// block_MiB (one block's saved activations: none's tape peak at L less at L-1 layers),
// inputs_MiB (the blocks' inputs) and expected_tape_MiB = none's - L blocks + inputs + 1 block.
#include <chrono>
#include <cstdio>
#include <functional>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "benchmark/benchmark.h"
#include "models/gpt/gpt_model.h"
#include "models/train/trainer.h"
#include "shardmap/context.h"
#include "shardmap/shape_only.h"
#include "tensor/memory_tracker.h"
#include "tensor/op_counter.h"

namespace shardmap {
namespace {

GptConfig Gpt2Small(int64_t layers) {
  return GptConfig{.layers = layers, .d_model = 768, .heads = 12, .vocab = 50304, .seq = 1024,
                   .dtype = DType::kF32};
}

constexpr int64_t kBatch = 1;

// One optimizer step of one rank, through TrainGpt itself (the shape-only runner, as
// models/train/gpt_shape_only.h does), measured.
struct Measured {
  int64_t tape_peak = 0;      // TrainResult::peak_activation_bytes_per_rank (saved activations)
  int64_t backprop_peak = 0;  // MemoryTracker: forward + backward peak above the step's start
  int64_t step_peak = 0;      // MemoryTracker: the whole step's peak (optimizer included)
  double flops = 0;           // OpCounter: the whole step
  double seconds = 0;
};

absl::StatusOr<Measured> Step(RecomputeMode mode, int64_t layers, Device device) {
  const GptConfig c = Gpt2Small(layers);
  absl::StatusOr<GptLayout> layout = GptLayout::Create(Mesh(), c, false);
  if (!layout.ok()) return layout.status();
  std::vector<NamedTensor> init;
  for (const ParamInfo& pi : layout->params()) {
    init.push_back({pi.name, Tensor::Zeros(pi.global_shape, c.dtype, device)});
  }
  TrainOptions o;
  o.batch = kBatch;
  o.recompute = mode;
  o.hooks.only_rank = 0;
  Measured m;
  MemoryTracker* mem = nullptr;
  OpCounter* ops = nullptr;
  int64_t start_live = 0;
  std::chrono::steady_clock::time_point t0;
  o.hooks.spmd_runner = [&](const Mesh& mesh, const std::function<void(RankContext&)>& body) {
    ShapeOnlyOptions so;
    so.device = device;
    return RunShapeOnly(mesh, 0, [&](RankContext& ctx) {
      MemoryTracker tracker;
      OpCounter counter;
      mem = &tracker;
      ops = &counter;
      body(ctx);
      m.flops = counter.flops();
      m.step_peak = tracker.peak_bytes();
      mem = nullptr;
      ops = nullptr;
    }, so);
  };
  o.hooks.on_phase = [&](const char* phase) {
    const std::string ph = phase;
    if (ph == "step") {
      ops->Clear();
      start_live = mem->live_bytes();
      mem->ResetPeak();
      t0 = std::chrono::steady_clock::now();
    } else if (ph == "optimizer") {
      m.backprop_peak = mem->peak_bytes() - start_live;
      m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  };
  const std::vector<int64_t> tokens(static_cast<size_t>(c.seq) + 1, 0);
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, init, tokens, o);
  if (!r.ok()) return r.status();
  m.tape_peak = r->peak_activation_bytes_per_rank;
  return m;
}

// The meta measurement of (mode, layers), computed once.
const Measured& MetaStep(RecomputeMode mode, int64_t layers) {
  static auto* cache = new std::map<std::pair<int, int64_t>, Measured>;
  auto key = std::make_pair(static_cast<int>(mode), layers);
  auto it = cache->find(key);
  if (it == cache->end()) {
    absl::StatusOr<Measured> p = Step(mode, layers, Device::Meta());
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

void Report(benchmark::State& state, RecomputeMode mode, int64_t layers, const Measured& p) {
  const Measured& none = MetaStep(RecomputeMode::kNone, layers);
  const double mib = 1 << 20;
  state.counters["tape_MiB"] = p.tape_peak / mib;
  state.counters["fwdbwd_MiB"] = p.backprop_peak / mib;
  state.counters["step_MiB"] = p.step_peak / mib;
  state.counters["flops_G"] = p.flops / 1e9;
  state.counters["flops_vs_none"] = p.flops / none.flops;
  state.counters["extra_vs_fwd"] = (p.flops - none.flops) / BlocksForwardFlops(layers);
  if (mode == RecomputeMode::kFull && layers >= 2) {
    // One block's saved activations (none's tape peak at L less at L-1 layers), the blocks'
    // inputs, and the prediction for full: none's less every block's plus the inputs plus one.
    const GptConfig c = Gpt2Small(layers);
    const double block = static_cast<double>(none.tape_peak) -
                         static_cast<double>(MetaStep(RecomputeMode::kNone, layers - 1).tape_peak);
    const double inputs = static_cast<double>(layers) * kBatch * c.seq * c.d_model * 4;
    state.counters["block_MiB"] = block / mib;
    state.counters["inputs_MiB"] = inputs / mib;
    state.counters["expected_tape_MiB"] = (none.tape_peak - layers * block + inputs + block) / mib;
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
  Measured p;
  for (auto _ : state) {
    absl::StatusOr<Measured> r = Step(mode, layers, Device::Cpu());
    if (!r.ok()) {
      state.SkipWithError(std::string(r.status().message()).c_str());
      return;
    }
    p = *r;
  }
  Report(state, mode, layers, p);
  // The CPU run's memory and op counts are the meta run's (shape-only execution's promise).
  const Measured& meta = MetaStep(mode, layers);
  state.counters["same_as_meta"] = p.step_peak == meta.step_peak &&
                                   p.backprop_peak == meta.backprop_peak &&
                                   p.tape_peak == meta.tape_peak && p.flops == meta.flops;
  state.counters["fwdbwd_s"] = p.seconds;
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
