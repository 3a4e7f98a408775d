// CUDA backend microbenchmarks, timed with CUDA events on the GPU (manual time): our ops against
// the raw thing they wrap, interleaved iteration by iteration in one benchmark.
//
//   bazel build -c opt --config=opt //bench:cuda_bench   # then, on the GPU machine:
//   ./cuda_bench --benchmark_filter='^gemm/' --benchmark_repetitions=3
//   ./cuda_bench --benchmark_filter='dtype:bf16'      # every bf16 case
//   ./cuda_bench --benchmark_list_tests               # the names (works without a GPU too)
//
// Names: <what>/dtype:<f32|bf16>/<sizes>, e.g. gemm/dtype:bf16/m:8192/k:8192/n:8192,
// add_vs_copy/dtype:f32/elems:67108864, mlp_step/mode:graph/dtype:bf16/batch:64/d:256/h:1024.
//
// Counters and targets (H100/H200):
//   gemm              TFLOPs (ours), raw_TFLOPs (cuBLASLt called directly with a preallocated
//                     output and the heuristic's first answer), ratio = raw time / our time
//                     (>= 0.95; above 1 where our autotuning found a faster algorithm than the
//                     heuristic's first); bf16 8192^3: TFLOPs >= 700.
//   linear_bias_gelu  the fused bias+GELU linear layer vs the plain raw GEMM (epilogue cost);
//                     fused = 1 when no cuBLASLt epilogue was refused.
//   add_vs_copy       GB/s of Add (2 reads + 1 write) and of a device-to-device cudaMemcpyAsync
//                     moving the same bytes; ratio = copy time / Add time (>= 0.8).
//   layer_norm_vs_copy  the same for LayerNorm over the last dim (1 read + 1 write of x).
// Without a GPU (or built without CUDA) it prints why and exits 0.
//
// The MLP training step, eager vs CUDA-graph replay, is registered by //bench:cuda_bench_mlp
// (a separate alwayslink cc_library linked into this binary from bench/BUILD.bazel).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "benchmark/benchmark.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

#if SHARDMAP_HAS_CUDA

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "tensor/cuda/device_memory.h"
#include "tensor/cuda/gemm/internal/cublaslt_check.h"
#include "tensor/cuda/gemm/ops.h"
#include "tensor/cuda/internal/cuda_check.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace shardmap {
namespace {

constexpr int kDevice = 0;
constexpr int kWarmup = 3;

cudaStream_t Stream() { return static_cast<cudaStream_t>(cuda::CurrentStream(kDevice)); }

// GPU time between two events on the current stream. Any host overhead between Start and Stop
// that leaves the GPU idle is counted too (it would starve a real training step).
class EventTimer {
 public:
  EventTimer() {
    SM_CUDA_CHECK(cudaEventCreate(&start_));
    SM_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void Start() { SM_CUDA_CHECK(cudaEventRecord(start_, Stream())); }
  double StopSeconds() {
    SM_CUDA_CHECK(cudaEventRecord(stop_, Stream()));
    SM_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    SM_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

std::string DTypePart(DType dt) { return std::string("/dtype:") + DTypeName(dt); }

cudaDataType_t CudaType(DType t) {
  return t == DType::kF32 ? CUDA_R_32F : t == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
}

Tensor RandomOnGpu(absl::Span<const int64_t> shape, DType dt, uint64_t seed) {
  return RandomUniform(shape, seed, -1.0, 1.0, dt, Device::Cuda(kDevice));  // on the GPU
}

// The baseline: row-major C[m,n] = A[m,k] B[k,n] (batched with strides) through cuBLASLt
// directly, descriptors and algorithm set up once, output and workspace preallocated.
class RawGemm {
 public:
  RawGemm(int64_t m, int64_t n, int64_t k, int64_t batch, DType dt) {
    SM_CUBLASLT_CHECK(cublasLtCreate(&handle_));
    SM_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cudaDataType_t t = CudaType(dt);
    // Column-major C^T[n,m] = B^T[n,k] A^T[k,m]: cuBLAS's A is our B.
    SM_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&la_, t, n, k, n));
    SM_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&lb_, t, k, m, k));
    SM_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&lc_, t, n, m, n));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      const int64_t strides[3] = {n * k, k * m, n * m};
      cublasLtMatrixLayout_t layouts[3] = {la_, lb_, lc_};
      for (int i = 0; i < 3; ++i) {
        SM_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(
            layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
        SM_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(
            layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
            sizeof(strides[i])));
      }
    }
    SM_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspace));
    cublasLtMatmulPreference_t pref = nullptr;
    SM_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspace;
    SM_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    SM_CUBLASLT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, desc_, la_, lb_, lc_, lc_, pref, 1,
                                                     &result, &returned));
    cublasLtMatmulPreferenceDestroy(pref);
    if (returned == 0) OpFail("raw cuBLASLt: no algorithm");
    algo_ = result.algo;
  }
  ~RawGemm() {
    cudaFree(workspace_);
    cublasLtMatrixLayoutDestroy(la_);
    cublasLtMatrixLayoutDestroy(lb_);
    cublasLtMatrixLayoutDestroy(lc_);
    cublasLtMatmulDescDestroy(desc_);
    cublasLtDestroy(handle_);
  }
  void Run(const void* a, const void* b, void* c) {
    const float alpha = 1, beta = 0;
    SM_CUBLASLT_CHECK(cublasLtMatmul(handle_, desc_, &alpha, b, la_, a, lb_, &beta, c, lc_, c,
                                     lc_, &algo_, workspace_, kWorkspace, Stream()));
  }

 private:
  static constexpr size_t kWorkspace = size_t{32} << 20;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  void* workspace_ = nullptr;
};

// Matmul through the framework (allocating its output from the caching allocator each call) vs
// RawGemm, `reps` products between each pair of events.
struct GemmCase {
  int64_t m, k, n, batch;
  DType dt;
  int reps;  // products per timed interval
};

void Gemm(benchmark::State& state, GemmCase c) {
  const int64_t m = c.m, k = c.k, n = c.n, batch = c.batch;
  const DType dt = c.dt;
  const int reps = c.reps;
  try {
    const Tensor a = batch > 1 ? RandomOnGpu({batch, m, k}, dt, 1) : RandomOnGpu({m, k}, dt, 1);
    const Tensor b = batch > 1 ? RandomOnGpu({batch, k, n}, dt, 2) : RandomOnGpu({k, n}, dt, 2);
    Tensor c_raw = Tensor::Empty(batch > 1 ? Shape{batch, m, n} : Shape{m, n}, dt,
                                 Device::Cuda(kDevice));
    RawGemm raw(m, n, k, batch, dt);
    for (int i = 0; i < kWarmup; ++i) {
      benchmark::DoNotOptimize(Matmul(a, b).raw_data());
      raw.Run(a.raw_data(), b.raw_data(), c_raw.raw_data());
    }
    cuda::Synchronize(kDevice);
    EventTimer timer;
    double ours = 0, theirs = 0;
    for (auto _ : state) {
      timer.Start();
      for (int r = 0; r < reps; ++r) benchmark::DoNotOptimize(Matmul(a, b).raw_data());
      const double t_ours = timer.StopSeconds();
      timer.Start();
      for (int r = 0; r < reps; ++r) raw.Run(a.raw_data(), b.raw_data(), c_raw.raw_data());
      const double t_raw = timer.StopSeconds();
      ours += t_ours;
      theirs += t_raw;
      state.SetIterationTime(t_ours / reps);
    }
    const double flops = 2.0 * batch * m * n * k * reps * state.iterations();
    state.counters["TFLOPs"] = flops / ours / 1e12;
    state.counters["raw_TFLOPs"] = flops / theirs / 1e12;
    state.counters["ratio"] = theirs / ours;
  } catch (const OpError& e) {
    state.SkipWithError(e.what());
  }
}

void RegisterGemm(GemmCase c) {
  std::string name = "gemm" + DTypePart(c.dt) + "/m:" + std::to_string(c.m) +
                     "/k:" + std::to_string(c.k) + "/n:" + std::to_string(c.n);
  if (c.batch > 1) name += "/batch:" + std::to_string(c.batch);
  benchmark::RegisterBenchmark(name.c_str(), Gemm, c)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

// The fused linear layer Linear(x, w, b, kBiasGelu) (one cuBLASLt call with the GELU_AUX_BIAS
// epilogue, writing y and the GELU input) vs the plain raw GEMM of the same shape: the ratio is
// what the epilogue costs (1.0 = free; the extra [m,n] output write is part of it).
void LinearBiasGelu(benchmark::State& state, int64_t m, int64_t k, int64_t n) {
  const DType dt = DType::kBF16;
  const int reps = 5;
  try {
    const Tensor x = RandomOnGpu({m, k}, dt, 4);
    const Tensor w = RandomOnGpu({k, n}, dt, 5);
    const Tensor b = RandomOnGpu({n}, dt, 6);
    Tensor c_raw = Tensor::Empty({m, n}, dt, Device::Cuda(kDevice));
    RawGemm raw(m, n, k, 1, dt);
    auto ours = [&] {
      LinearResult r = Linear(x, w, b, LinearEpilogue::kBiasGelu);
      benchmark::DoNotOptimize(r.y.raw_data());
    };
    for (int i = 0; i < kWarmup; ++i) {
      ours();
      raw.Run(x.raw_data(), w.raw_data(), c_raw.raw_data());
    }
    cuda::Synchronize(kDevice);
    EventTimer timer;
    double t_ours = 0, t_raw = 0;
    for (auto _ : state) {
      timer.Start();
      for (int r = 0; r < reps; ++r) ours();
      const double a = timer.StopSeconds();
      timer.Start();
      for (int r = 0; r < reps; ++r) raw.Run(x.raw_data(), w.raw_data(), c_raw.raw_data());
      const double c = timer.StopSeconds();
      t_ours += a;
      t_raw += c;
      state.SetIterationTime(a / reps);
    }
    const double flops = 2.0 * m * n * k * reps * state.iterations();
    state.counters["TFLOPs"] = flops / t_ours / 1e12;
    state.counters["raw_gemm_TFLOPs"] = flops / t_raw / 1e12;
    state.counters["ratio"] = t_raw / t_ours;
    state.counters["fused"] = cuda::GetGemmStats().unsupported == 0 ? 1 : 0;
  } catch (const OpError& e) {
    state.SkipWithError(e.what());
  }
}

// `ours` vs a device-to-device copy of `copy_bytes` (same traffic: bytes read + written).
template <typename Op>
void VsCopy(benchmark::State& state, Op op, size_t traffic_bytes, int reps) {
  const size_t copy_bytes = traffic_bytes / 2;  // a copy reads and writes each byte
  void* src = cuda::DeviceAllocate(kDevice, copy_bytes);
  void* dst = cuda::DeviceAllocate(kDevice, copy_bytes);
  SM_CUDA_CHECK(cudaMemsetAsync(src, 0, copy_bytes, Stream()));
  for (int i = 0; i < kWarmup; ++i) {
    op();
    SM_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, Stream()));
  }
  cuda::Synchronize(kDevice);
  EventTimer timer;
  double ours = 0, theirs = 0;
  for (auto _ : state) {
    timer.Start();
    for (int r = 0; r < reps; ++r) op();
    const double t_ours = timer.StopSeconds();
    timer.Start();
    for (int r = 0; r < reps; ++r) {
      SM_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, Stream()));
    }
    const double t_copy = timer.StopSeconds();
    ours += t_ours;
    theirs += t_copy;
    state.SetIterationTime(t_ours / reps);
  }
  const double bytes = static_cast<double>(traffic_bytes) * reps * state.iterations();
  state.counters["GBs"] = bytes / ours / 1e9;
  state.counters["copy_GBs"] = bytes / theirs / 1e9;
  state.counters["ratio"] = theirs / ours;
  cuda::DeviceFree(kDevice, src);
  cuda::DeviceFree(kDevice, dst);
}

// Add of two 256 MiB tensors: reads 512 MiB, writes 256 MiB.
void AddVsCopy(benchmark::State& state, DType dt, int64_t n) {
  try {
    const Tensor a = Tensor::Full({n}, 1.0, dt, Device::Cuda(kDevice));
    const Tensor b = Tensor::Full({n}, 2.0, dt, Device::Cuda(kDevice));
    VsCopy(
        state, [&] { benchmark::DoNotOptimize(Add(a, b).raw_data()); }, 3 * a.nbytes(),
        /*reps=*/5);
  } catch (const OpError& e) {
    state.SkipWithError(e.what());
  }
}

// LayerNorm of [16384, 4096] over the last dim: reads x, writes y (gamma, beta, mean and rstd
// are under 0.1% of the traffic and not counted).
void LayerNormVsCopy(benchmark::State& state, DType dt, int64_t rows, int64_t h) {
  try {
    const Tensor x = RandomOnGpu({rows, h}, dt, 3);
    const Tensor gamma = Tensor::Full({h}, 1.0, dt, Device::Cuda(kDevice));
    const Tensor beta = Tensor::Full({h}, 0.0, dt, Device::Cuda(kDevice));
    VsCopy(
        state,
        [&] { benchmark::DoNotOptimize(LayerNorm(x, gamma, beta, 1e-5).y.raw_data()); },
        2 * x.nbytes(), /*reps=*/5);
  } catch (const OpError& e) {
    state.SkipWithError(e.what());
  }
}
const bool kRegistered = [] {
  // The shapes of issue 26, in bf16, f16 and f32 (f32: CUBLAS_COMPUTE_32F, no TF32).
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    const int reps = dt == DType::kF32 ? 1 : 5;
    RegisterGemm({8192, 8192, 8192, 1, dt, reps});       // bf16 TFLOP/s target: >= 700
    RegisterGemm({8192, 4096, 4 * 4096, 1, dt, reps});   // MLP up-projection: h -> 4h
  }
  RegisterGemm({4096, 4096, 4096, 1, DType::kF32, 5});
  RegisterGemm({2048, 128, 2048, 32, DType::kBF16, 20});   // attention scores, 32 heads
  // GPT-2 / Megatron layers, 8192 tokens (batch 8 x 1024), bf16: qkv, attention output, MLP up
  // and down, for d 768 (GPT-2 small) to 8192; and GPT-2's batched attention (96 = 8 x 12 heads
  // of 64): scores q k^T and the weighted values p v.
  for (int64_t d : {768, 1600, 4096, 8192}) {
    const int reps = d <= 1600 ? 20 : 5;
    RegisterGemm({8192, d, 3 * d, 1, DType::kBF16, reps});   // qkv
    RegisterGemm({8192, d, d, 1, DType::kBF16, reps});       // attention output
    RegisterGemm({8192, d, 4 * d, 1, DType::kBF16, reps});   // MLP up
    RegisterGemm({8192, 4 * d, d, 1, DType::kBF16, reps});   // MLP down
  }
  RegisterGemm({1024, 64, 1024, 96, DType::kBF16, 20});    // scores
  RegisterGemm({1024, 1024, 64, 96, DType::kBF16, 20});    // p @ v
  benchmark::RegisterBenchmark("linear_bias_gelu/dtype:bf16/m:8192/k:4096/n:16384",
                               LinearBiasGelu, 8192, 4096, 4 * 4096)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t n = (int64_t{256} << 20) / static_cast<int64_t>(DTypeSize(dt));  // 256 MiB
    benchmark::RegisterBenchmark(
        ("add_vs_copy" + DTypePart(dt) + "/elems:" + std::to_string(n)).c_str(), AddVsCopy, dt,
        n)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(
        ("layer_norm_vs_copy" + DTypePart(dt) + "/rows:16384/h:4096").c_str(), LayerNormVsCopy,
        dt, 16384, 4096)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace
}  // namespace shardmap

#endif  // SHARDMAP_HAS_CUDA

int main(int argc, char** argv) {
  bool list_only = false;  // listing the names needs no GPU
  for (int i = 1; i < argc; ++i) {
    list_only |= std::strncmp(argv[i], "--benchmark_list_tests", 22) == 0;
  }
  if (!list_only && !shardmap::cuda::Available()) {
    std::printf("cuda_bench: no GPU (%s); nothing to measure\n",
                shardmap::cuda::UnavailableReason().c_str());
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
