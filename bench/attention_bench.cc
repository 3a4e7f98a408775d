// The GPT attention layer (CausalSelfAttention, forward + backward through the tape) with the
// fused causal_attention path against the materialised einsum + causal_softmax path, on the CPU
// and, when a GPU is present, on it (the CUDA cases report "no GPU" otherwise). This is the
// measurement behind AttentionPath::kAuto's choice (models/gpt_layers.h).
//
//   bazel run -c opt //bench:attention_bench -- --benchmark_filter=Cpu
//
// Args: batch, seq, heads, head_dim; counters: tokens/s of the whole layer step.
#include <cmath>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "benchmark/benchmark.h"
#include "models/gpt_layers.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/cuda/runtime.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace shardmap {
namespace {

void RunLayer(benchmark::State& state, AttentionPath path, Device device, DType dtype) {
  const int64_t batch = state.range(0), seq = state.range(1), heads = state.range(2),
                head_dim = state.range(3);
  if (device.is_cuda() && !cuda::Available()) {
    state.SkipWithError(("no GPU: " + cuda::UnavailableReason()).c_str());
    return;
  }
  const int64_t d = heads * head_dim, rows = batch * seq;
  SingleRankContext one{Mesh()};
  std::vector<Value> params;
  for (const Tensor& t : {RandomNormal({rows, d}, 1, 0.0, 1.0, dtype, device),
                          RandomNormal({d, 3, d}, 2, 0.0, 0.05, dtype, device),
                          RandomNormal({3, d}, 3, 0.0, 0.05, dtype, device),
                          RandomNormal({d, d}, 4, 0.0, 0.05, dtype, device),
                          RandomNormal({d}, 5, 0.0, 0.05, dtype, device)}) {
    params.push_back(Value::Replicated(t));
  }
  auto loss = [&](const std::vector<Value>& p) {
    CausalSelfAttention attn{p[1], p[2], RowParallelLinear{p[3], p[4], {}}, head_dim, seq, {},
                             nullptr, "", path};
    Value y = attn(p[0]);
    return sum(y * y, {});
  };
  for (auto _ : state) {
    ValueAndGrad r = value_and_grad(loss, params);
    benchmark::DoNotOptimize(r.grads[0].tensor.raw_data());
    if (device.is_cuda()) cuda::Synchronize(device.index);
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_CpuFused(benchmark::State& s) {
  RunLayer(s, AttentionPath::kFused, Device::Cpu(), DType::kF32);
}
void BM_CpuMaterialised(benchmark::State& s) {
  RunLayer(s, AttentionPath::kMaterialised, Device::Cpu(), DType::kF32);
}
void BM_CudaFusedBf16(benchmark::State& s) {
  RunLayer(s, AttentionPath::kFused, Device::Cuda(0), DType::kBF16);
}
void BM_CudaMaterialisedBf16(benchmark::State& s) {
  RunLayer(s, AttentionPath::kMaterialised, Device::Cuda(0), DType::kBF16);
}

// The demo's block (4 x 64 tokens, 4 heads of 16) and a GPT-2-small head layout at seq 256.
#define SM_CPU_SHAPES ->Args({4, 64, 4, 16})->Args({2, 256, 12, 64})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_CpuFused) SM_CPU_SHAPES;
BENCHMARK(BM_CpuMaterialised) SM_CPU_SHAPES;
// GPT-2 small at seq 1024 (one layer, batch 4 and 16).
#define SM_GPU_SHAPES ->Args({4, 1024, 12, 64})->Args({16, 1024, 12, 64})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_CudaFusedBf16) SM_GPU_SHAPES;
BENCHMARK(BM_CudaMaterialisedBf16) SM_GPU_SHAPES;

}  // namespace
}  // namespace shardmap
