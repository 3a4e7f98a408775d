// Tensor runtime microbenchmarks: our ops against the raw thing they wrap, measured in the same
// benchmark, interleaved iteration by iteration so machine noise hits both sides alike.
//
//   bazel run -c opt --config=opt //bench:tensor_bench -- --benchmark_repetitions=5
//
// Counters: `ratio` = raw time / our time (1.0 = no overhead; targets: matmul >= 0.95,
// add >= 0.7), `ours_*` and `raw_*` are the two throughputs (GFLOP/s or GB/s).
#include <cblas.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "benchmark/benchmark.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/shape_ops.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace shardmap {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Matmul [m,k] @ [k,n] through Tensor vs cblas_sgemm into a preallocated buffer. With batch > 1
// the lhs is [batch, m/batch, k] (the x[b,s,k] @ w[k,n] case, folded without a copy).
void BM_MatmulVsSgemm(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const int64_t batch = state.range(3);
  PinBlasToOneThread();
  const Tensor a = RandomNormal({batch, m / batch, k}, 1).Reshape(
      batch == 1 ? std::vector<int64_t>{m, k} : std::vector<int64_t>{batch, m / batch, k});
  const Tensor b = RandomNormal({k, n}, 2);
  std::vector<float> c(m * n);
  double ours = 0, raw = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    Tensor out = Matmul(a, b);
    benchmark::DoNotOptimize(out.raw_data());
    const auto t1 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data<float>(), k,
                b.data<float>(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    const auto t2 = Clock::now();
    ours += Seconds(t0, t1);
    raw += Seconds(t1, t2);
    state.SetIterationTime(Seconds(t0, t1));
  }
  const double flops = 2.0 * m * n * k * state.iterations();
  state.counters["ours_GFLOPs"] = flops / ours / 1e9;
  state.counters["raw_GFLOPs"] = flops / raw / 1e9;
  state.counters["ratio"] = raw / ours;
}
BENCHMARK(BM_MatmulVsSgemm)
    ->ArgNames({"m", "k", "n", "batch"})
    ->Args({512, 2048, 512, 1})
    ->Args({1024, 1024, 1024, 1})
    ->Args({1024, 1024, 1024, 4})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Add of two 16 MiB f32 tensors (reads 32 MiB, writes 16 MiB) vs memcpy of 24 MiB (the same
// 48 MiB of traffic). Bandwidth counts bytes read plus bytes written.
void BM_AddVsMemcpy(benchmark::State& state) {
  const int64_t n = state.range(0) / 4;
  const Tensor a = RandomUniform({n}, 1), b = RandomUniform({n}, 2);
  const size_t copy_bytes = static_cast<size_t>(n) * 4 * 3 / 2;
  std::vector<char> src(copy_bytes, 1), dst(copy_bytes, 0);
  double ours = 0, raw = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    Tensor out = Add(a, b);
    benchmark::DoNotOptimize(out.raw_data());
    const auto t1 = Clock::now();
    std::memcpy(dst.data(), src.data(), copy_bytes);
    benchmark::DoNotOptimize(dst.data());
    const auto t2 = Clock::now();
    ours += Seconds(t0, t1);
    raw += Seconds(t1, t2);
    state.SetIterationTime(Seconds(t0, t1));
  }
  const double bytes = 3.0 * n * 4 * state.iterations();
  state.counters["ours_GBps"] = bytes / ours / 1e9;
  state.counters["raw_GBps"] = bytes / raw / 1e9;
  state.counters["ratio"] = raw / ours;
}
BENCHMARK(BM_AddVsMemcpy)
    ->Arg(16 << 20)
    ->Arg(64 << 20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// A rows x cols f32 transpose ([m,n] -> [n,m]) vs memcpy of the same bytes into a preallocated
// buffer; `ratio` >= 0.5 is the target on [4096,4096] and [8192,2048].
void BM_Transpose2DVsMemcpy(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1);
  const Tensor a = RandomUniform({m, n}, 1);
  std::vector<float> dst(m * n);
  double ours = 0, raw = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    Tensor out = Transpose(a, 0, 1);
    benchmark::DoNotOptimize(out.raw_data());
    const auto t1 = Clock::now();
    std::memcpy(dst.data(), a.raw_data(), a.nbytes());
    benchmark::DoNotOptimize(dst.data());
    const auto t2 = Clock::now();
    ours += Seconds(t0, t1);
    raw += Seconds(t1, t2);
    state.SetIterationTime(Seconds(t0, t1));
  }
  const double bytes = 2.0 * a.nbytes() * state.iterations();
  state.counters["ours_GBps"] = bytes / ours / 1e9;
  state.counters["raw_GBps"] = bytes / raw / 1e9;
  state.counters["ratio"] = raw / ours;
}
BENCHMARK(BM_Transpose2DVsMemcpy)
    ->ArgNames({"m", "n"})
    ->Args({1024, 1024})
    ->Args({2048, 2048})
    ->Args({4096, 4096})
    ->Args({8192, 2048})
    ->Args({2048, 8192})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// [b,s,h,d] -> [b,s,d,h]-style permute swapping the last two dims (a batched transpose) vs memcpy.
void BM_PermuteLast2VsMemcpy(benchmark::State& state) {
  const int64_t b = state.range(0), s = state.range(1), h = state.range(2), d = state.range(3);
  const Tensor a = RandomUniform({b, s, h, d}, 1);
  std::vector<float> dst(a.numel());
  double ours = 0, raw = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    Tensor out = Permute(a, {0, 1, 3, 2});
    benchmark::DoNotOptimize(out.raw_data());
    const auto t1 = Clock::now();
    std::memcpy(dst.data(), a.raw_data(), a.nbytes());
    benchmark::DoNotOptimize(dst.data());
    const auto t2 = Clock::now();
    ours += Seconds(t0, t1);
    raw += Seconds(t1, t2);
    state.SetIterationTime(Seconds(t0, t1));
  }
  state.counters["ratio"] = raw / ours;
}
BENCHMARK(BM_PermuteLast2VsMemcpy)
    ->ArgNames({"b", "s", "h", "d"})
    ->Args({4, 256, 128, 128})
    ->Args({8, 64, 256, 64})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Per-op cost on tiny tensors (framework overhead dominates). Raw reference: the same arithmetic
// on preallocated buffers.
void BM_TinyAdd(benchmark::State& state) {
  const Tensor a = Tensor::Full({1}, 1.0), b = Tensor::Full({1}, 2.0);
  for (auto _ : state) {
    Tensor c = Add(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
}
BENCHMARK(BM_TinyAdd);

void BM_TinyAddRaw(benchmark::State& state) {
  float a = 1, b = 2, c;
  for (auto _ : state) {
    benchmark::DoNotOptimize(a);
    c = a + b;
    benchmark::DoNotOptimize(c);
  }
}
BENCHMARK(BM_TinyAddRaw);

// Small square matmuls: ours (a plain loop below a size threshold, BLAS above) vs raw sgemm.
void BM_SmallMatmul(benchmark::State& state) {
  const int64_t s = state.range(0);
  const Tensor a = RandomNormal({s, s}, 1), b = RandomNormal({s, s}, 2);
  for (auto _ : state) {
    Tensor c = Matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
}
BENCHMARK(BM_SmallMatmul)->Arg(4)->Arg(8)->Arg(16)->Arg(32);

void BM_SmallMatmulSgemm(benchmark::State& state) {
  PinBlasToOneThread();
  const int64_t s = state.range(0);
  const Tensor a = RandomNormal({s, s}, 1), b = RandomNormal({s, s}, 2);
  std::vector<float> c(s * s);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s, s, s, 1.0f, a.data<float>(), s,
                b.data<float>(), s, 0.0f, c.data(), s);
    benchmark::DoNotOptimize(c.data());
  }
}
BENCHMARK(BM_SmallMatmulSgemm)->Arg(4)->Arg(8)->Arg(16)->Arg(32);

void BM_EmptyTensorAlloc(benchmark::State& state) {
  for (auto _ : state) {
    Tensor c = Tensor::Empty({1}, DType::kF32);
    benchmark::DoNotOptimize(c.raw_data());
  }
}
BENCHMARK(BM_EmptyTensorAlloc);

}  // namespace
}  // namespace shardmap
