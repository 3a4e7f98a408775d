// AdamW's update over one GPT-2 (124M) block's parameters (7.1M f32 elements: c_attn, c_proj,
// c_fc, mlp c_proj with their biases, two LayerNorms), one thread: the fused in-place CPU pass
// (models/components/adamw_update.h) per step. bench/peers/adamw_torch.py times
// torch.optim.AdamW(foreach=True) on the same shapes and prints the ratio.
//
//   bazel run -c opt --config=opt //bench:adamw_bench -- --benchmark_format=json
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "models/components/optimizer.h"
#include "tensor/ops/matmul.h"
#include "tensor/random.h"

namespace shardmap {
namespace {

// One GPT-2 block's parameters (d = 768), as bench/peers/adamw_torch.py lists them.
std::vector<std::vector<int64_t>> BlockShapes() {
  return {{768},  {768},       {768, 2304}, {2304}, {768, 768}, {768},
          {768},  {768},       {768, 3072}, {3072}, {3072, 768}, {768}};
}

void BM_AdamWStepGpt2Block(benchmark::State& state) {
  PinBlasToOneThread();
  std::vector<NamedTensor> params, grads;
  int64_t n = 0;
  int k = 0;
  for (const std::vector<int64_t>& shape : BlockShapes()) {
    const std::string name = "p" + std::to_string(k);
    params.push_back({name, RandomNormal(shape, 10 + k, 0.0, 0.02, DType::kF32)});
    grads.push_back({name, RandomNormal(shape, 100 + k, 0.0, 1e-3, DType::kF32)});
    n += params.back().tensor.numel();
    ++k;
  }
  AdamW opt({.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  if (!opt.Step(params, grads).ok()) state.SkipWithError("AdamW step failed");  // the moments
  for (auto _ : state) {
    if (!opt.Step(params, grads).ok()) state.SkipWithError("AdamW step failed");
  }
  state.counters["elements"] = static_cast<double>(n);
  // p, g, m, v read and p, m, v written: 28 bytes per f32 element.
  state.SetBytesProcessed(state.iterations() * n * 28);
}
BENCHMARK(BM_AdamWStepGpt2Block)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime();

}  // namespace
}  // namespace shardmap
