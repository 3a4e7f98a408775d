// The GPT attention layer (CausalSelfAttention, forward + backward through the tape) with the
// fused causal_attention path against the materialised einsum + causal_softmax path, on the CPU
// and, when a GPU is present, on it (the CUDA cases report "no GPU" otherwise). This is the
// measurement behind AttentionPath::kAuto's choice (models/parallel/layers.h).
//
//   bazel run -c opt //bench:attention_bench -- --benchmark_filter=Cpu
//
// Args: batch, seq, heads, head_dim; counters: tokens/s of the whole layer step. The CUDA rows
// compare the fused path on its tensor-core kernels (bf16, head_dim 64/128: the default), the
// same layer with SHARDMAP_ATTENTION_KERNEL=simt, and the materialised path; the Kernel rows time
// only the fused attention's forward + backward (tensor cores vs SIMT) with the TFLOP/s of its
// causal products (2 forward + 5 backward [t, t, d] GEMMs, halved by causality).
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "benchmark/benchmark.h"
#include "models/parallel/layers.h"
#include "shardmap/context.h"
#include "shardmap/ops.h"
#include "tensor/cuda/attention/attention_ops.h"
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
// The fused layer with the SIMT kernels (the environment switch the ops layer reads per call).
void BM_CudaFusedSimtBf16(benchmark::State& s) {
  const char* old = std::getenv("SHARDMAP_ATTENTION_KERNEL");
  const std::string saved = old == nullptr ? "" : old;
  setenv("SHARDMAP_ATTENTION_KERNEL", "simt", 1);
  RunLayer(s, AttentionPath::kFused, Device::Cuda(0), DType::kBF16);
  if (old == nullptr) {
    unsetenv("SHARDMAP_ATTENTION_KERNEL");
  } else {
    setenv("SHARDMAP_ATTENTION_KERNEL", saved.c_str(), 1);
  }
}

// The fused attention alone, forward + backward on [b, t, h, d] bf16, with one kernel family.
void RunKernel(benchmark::State& state, cuda::AttentionKernel kernel) {
  const int64_t batch = state.range(0), seq = state.range(1), heads = state.range(2),
                head_dim = state.range(3);
  if (!cuda::Available()) {
    state.SkipWithError(("no GPU: " + cuda::UnavailableReason()).c_str());
    return;
  }
  const Device gpu = Device::Cuda(0);
  const std::vector<int64_t> shape = {batch, seq, heads, head_dim};
  const Tensor q = RandomNormal(shape, 1, 0.0, 1.0, DType::kBF16, gpu);
  const Tensor k = RandomNormal(shape, 2, 0.0, 1.0, DType::kBF16, gpu);
  const Tensor v = RandomNormal(shape, 3, 0.0, 1.0, DType::kBF16, gpu);
  const Tensor dout = RandomNormal(shape, 4, 0.0, 1.0, DType::kBF16, gpu);
  const double scale = 1 / std::sqrt(static_cast<double>(head_dim));
  for (auto _ : state) {
    const cuda::AttentionOutputs f = cuda::CausalAttention(q, k, v, scale, 0, kernel);
    const cuda::AttentionGrads g =
        cuda::CausalAttentionBackward(q, k, v, f.out, f.lse, dout, scale, 0, kernel);
    benchmark::DoNotOptimize(g.dq.raw_data());
    cuda::Synchronize(gpu.index);
  }
  // Causal halves the 2 forward and 5 backward [t, t, d] products of 2 t^2 d flops each.
  const double flops = 7.0 * batch * heads * seq * seq * head_dim;
  state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
void BM_CudaKernelTcBf16(benchmark::State& s) { RunKernel(s, cuda::AttentionKernel::kTensorCore); }
void BM_CudaKernelSimtBf16(benchmark::State& s) { RunKernel(s, cuda::AttentionKernel::kSimt); }

// The demo's block (4 x 64 tokens, 4 heads of 16) and a GPT-2-small head layout at seq 256.
#define SM_CPU_SHAPES ->Args({4, 64, 4, 16})->Args({2, 256, 12, 64})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_CpuFused) SM_CPU_SHAPES;
BENCHMARK(BM_CpuMaterialised) SM_CPU_SHAPES;
// GPT-2 small at seq 1024 (one layer, batch 4 and 16).
#define SM_GPU_SHAPES ->Args({4, 1024, 12, 64})->Args({16, 1024, 12, 64})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_CudaFusedBf16) SM_GPU_SHAPES;
BENCHMARK(BM_CudaFusedSimtBf16) SM_GPU_SHAPES;
BENCHMARK(BM_CudaMaterialisedBf16) SM_GPU_SHAPES;
// GPT-2 124M's attention per layer (batch 16, seq 1024, 12 heads of 64) and a head_dim-128 one.
#define SM_KERNEL_SHAPES \
  ->Args({16, 1024, 12, 64})->Args({8, 1024, 6, 128})->Unit(benchmark::kMillisecond)
BENCHMARK(BM_CudaKernelTcBf16) SM_KERNEL_SHAPES;
BENCHMARK(BM_CudaKernelSimtBf16) SM_KERNEL_SHAPES;

}  // namespace
}  // namespace shardmap
