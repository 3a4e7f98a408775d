// Shape-only GPT step profiles (models/train/gpt_shape_only.h): the time to profile every rank role
// of one optimizer step of a large GPT on a large mesh, nothing computed. The target (issue 28):
// a GPT with billions of parameters on thousands of ranks in seconds on a 2-core machine.
//
//   bazel run -c opt //bench:shape_only_bench
//
// Counters: roles (distinct programs run), params_per_rank, peak_GiB (the largest role's
// MemoryTracker peak), TFLOP_per_rank (the largest role's step), collectives (per rank).
#include <algorithm>
#include <string>

#include "benchmark/benchmark.h"
#include "models/train/gpt_shape_only.h"
#include "models/parallel/parallel_dims.h"

namespace shardmap {
namespace {

// 48 layers, d 6144, 48 heads (a 22B GPT), seq 2048, f32 master weights with bf16 compute.
GptConfig Big() {
  return GptConfig{.layers = 48, .d_model = 6144, .heads = 48, .vocab = 50304, .seq = 2048,
                   .dtype = DType::kF32, .compute = DType::kBF16};
}

void Profile(benchmark::State& state, const std::string& mesh, bool sp, int64_t batch,
             int64_t microbatches) {
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*ParseMesh(mesh), Big(), sp);
  if (!layout.ok()) {
    state.SkipWithError(std::string(layout.status().message()).c_str());
    return;
  }
  TrainOptions o;
  o.batch = batch;
  o.pipeline.microbatches = microbatches;
  absl::StatusOr<std::vector<StepProfile>> roles;
  for (auto _ : state) {
    roles = ProfileGptStep(*layout, o);
    if (!roles.ok()) {
      state.SkipWithError(std::string(roles.status().message()).c_str());
      return;
    }
  }
  double peak = 0, flops = 0, params = 0, collectives = 0;
  for (const StepProfile& p : *roles) {
    peak = std::max(peak, static_cast<double>(p.peak_bytes));
    flops = std::max(flops, p.flops);
    params = std::max(params, static_cast<double>(p.parameter_bytes) / 4);
    collectives = std::max(collectives, static_cast<double>(p.collectives.size()));
  }
  state.counters["ranks"] = layout->mesh().size();
  state.counters["roles"] = roles->size();
  state.counters["params_per_rank"] = params;
  state.counters["peak_GiB"] = peak / (1 << 30);
  state.counters["TFLOP_per_rank"] = flops / 1e12;
  state.counters["collectives"] = collectives;
}

// 4096 ranks: FSDP x TP (+SP), one program.
void BM_Gpt22B_Fsdp512Tp8(benchmark::State& state) {
  Profile(state, "dp_shard=512,tp=8", true, 1024, 1);
}
// 4096 ranks: 8 pipeline stages (1F1B, 16 microbatches) x FSDP 64 x TP 8: 8 programs.
void BM_Gpt22B_Pp8Fsdp64Tp8(benchmark::State& state) {
  Profile(state, "pp=8,dp_shard=64,tp=8", true, 1024, 16);
}
// 4096 ranks: HSDP (replicate 16 x shard 32) x TP 8.
void BM_Gpt22B_Hsdp16x32Tp8(benchmark::State& state) {
  Profile(state, "dp_replicate=16,dp_shard=32,tp=8", true, 1024, 1);
}

BENCHMARK(BM_Gpt22B_Fsdp512Tp8)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();
BENCHMARK(BM_Gpt22B_Pp8Fsdp64Tp8)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();
BENCHMARK(BM_Gpt22B_Hsdp16x32Tp8)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();

}  // namespace
}  // namespace shardmap
