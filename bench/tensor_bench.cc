// Tensor runtime microbenchmarks: our ops against the raw thing they wrap, measured in the same
// benchmark, interleaved iteration by iteration so machine noise hits both sides alike.
//
//   bazel run -c opt --config=opt //bench:tensor_bench -- --benchmark_repetitions=5
//
// Counters: `ratio` = raw time / our time (1.0 = no overhead; targets: matmul >= 0.95,
// add >= 0.7), `ours_*` and `raw_*` are the two throughputs (GFLOP/s or GB/s).
#include <cblas.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/reduce.h"
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

// A copy baseline's buffer of `bytes`, in tensor storage so that the copy gets the same pages as
// the op it is compared with (the allocator maps blocks of 2 MiB and more on huge pages).
Tensor CopyBuffer(size_t bytes, int fill) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(bytes / 4 + 1)}, DType::kI32);
  std::memset(t.raw_data(), fill, bytes);
  return t;
}

// Add of two 16 MiB f32 tensors (reads 32 MiB, writes 16 MiB) vs memcpy of 24 MiB (the same
// 48 MiB of traffic). Bandwidth counts bytes read plus bytes written.
void BM_AddVsMemcpy(benchmark::State& state) {
  const int64_t n = state.range(0) / 4;
  const Tensor a = RandomUniform({n}, 1), b = RandomUniform({n}, 2);
  const size_t copy_bytes = static_cast<size_t>(n) * 4 * 3 / 2;
  Tensor src = CopyBuffer(copy_bytes, 1), dst = CopyBuffer(copy_bytes, 0);
  double ours = 0, raw = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    Tensor out = Add(a, b);
    benchmark::DoNotOptimize(out.raw_data());
    const auto t1 = Clock::now();
    std::memcpy(dst.raw_data(), src.raw_data(), copy_bytes);
    benchmark::DoNotOptimize(dst.raw_data());
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
  Tensor dst = CopyBuffer(a.nbytes(), 0);
  double ours = 0, raw = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    Tensor out = Transpose(a, 0, 1);
    benchmark::DoNotOptimize(out.raw_data());
    const auto t1 = Clock::now();
    std::memcpy(dst.raw_data(), a.raw_data(), a.nbytes());
    benchmark::DoNotOptimize(dst.raw_data());
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
  Tensor dst = CopyBuffer(a.nbytes(), 0);
  double ours = 0, raw = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    Tensor out = Permute(a, {0, 1, 3, 2});
    benchmark::DoNotOptimize(out.raw_data());
    const auto t1 = Clock::now();
    std::memcpy(dst.raw_data(), a.raw_data(), a.nbytes());
    benchmark::DoNotOptimize(dst.raw_data());
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

// One row per CPU op of issue 15, named like `exp/f32/elems:4194304` or
// `softmax/f32/rows:4096/cols:1024`, timed interleaved with a memcpy of the same traffic:
// copy_ratio = memcpy time / op time, where the memcpy moves (bytes read + bytes written) / 2 in
// each direction. Targets: elementwise ops >= 0.5; bench/peers/torch_ops.sh prints PyTorch's
// times for the same ops and shapes beside these.
struct OpRow {
  std::string name;
  Shape shape;
  int reads, writes;  // full-size tensors read and written
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::function<std::vector<Tensor>(const Shape&)> inputs;
};

std::vector<Tensor> Normal1(const Shape& s) { return {RandomNormal(s, 1, 0.0, 2.0)}; }
std::vector<Tensor> Normal2(const Shape& s) {
  return {RandomNormal(s, 1, 0.0, 2.0), RandomNormal(s, 2)};
}
std::vector<Tensor> Positive1(const Shape& s) { return {RandomUniform(s, 1, 0.01, 10.0)}; }
std::vector<Tensor> SoftmaxOut(const Shape& s) {
  return {Softmax(RandomNormal(s, 1, 0.0, 2.0), -1), RandomNormal(s, 2)};
}
std::vector<Tensor> LogSoftmaxOut(const Shape& s) {
  return {LogSoftmax(RandomNormal(s, 1, 0.0, 2.0), -1), RandomNormal(s, 2)};
}
// x, gamma, beta, mean, rstd, dy for the norms.
std::vector<Tensor> NormInputs(const Shape& s) {
  const Tensor x = RandomNormal(s, 1, 0.5, 2.0);
  const int64_t h = s.back();
  const LayerNormResult ln = LayerNorm(x, RandomNormal({h}, 3), RandomNormal({h}, 4), 1e-5);
  return {x, RandomNormal({h}, 3), RandomNormal({h}, 4), ln.mean, ln.rstd, RandomNormal(s, 2),
          RmsNorm(x, RandomNormal({h}, 3), 1e-5).rstd};
}
std::vector<Tensor> Logits(const Shape& s) {
  return {RandomNormal(s, 1, 0.0, 2.0), RandomInts({s[0]}, s[1], 5),
          RandomUniform({s[0]}, 6, 0.5, 1.5)};
}

std::vector<OpRow> OpRows() {
  using V = const std::vector<Tensor>&;
  std::vector<OpRow> rows;
  for (const Shape& s : {Shape{4194304}, Shape{512, 2048}}) {
    rows.push_back({"exp", s, 1, 1, [](V t) { return Exp(t[0]); }, Normal1});
    rows.push_back({"log", s, 1, 1, [](V t) { return Log(t[0]); }, Positive1});
    rows.push_back({"tanh", s, 1, 1, [](V t) { return Tanh(t[0]); }, Normal1});
    rows.push_back({"silu", s, 1, 1, [](V t) { return Silu(t[0]); }, Normal1});
    rows.push_back(
        {"gelu_erf", s, 1, 1, [](V t) { return Gelu(t[0], GeluApprox::kNone); }, Normal1});
    rows.push_back(
        {"gelu_tanh", s, 1, 1, [](V t) { return Gelu(t[0], GeluApprox::kTanh); }, Normal1});
    rows.push_back({"gelu_erf_grad", s, 2, 1,
                    [](V t) { return GeluGrad(t[0], t[1], GeluApprox::kNone); }, Normal2});
    rows.push_back({"gelu_tanh_grad", s, 2, 1,
                    [](V t) { return GeluGrad(t[0], t[1], GeluApprox::kTanh); }, Normal2});
    rows.push_back({"silu_grad", s, 2, 1, [](V t) { return SiluGrad(t[0], t[1]); }, Normal2});
  }
  for (const Shape& s : {Shape{4096, 1024}, Shape{512, 8192}}) {
    rows.push_back({"softmax", s, 1, 1, [](V t) { return Softmax(t[0], -1); }, Normal1});
    rows.push_back({"log_softmax", s, 1, 1, [](V t) { return LogSoftmax(t[0], -1); }, Normal1});
    rows.push_back({"softmax_backward", s, 2, 1,
                    [](V t) { return SoftmaxBackward(t[0], t[1], -1); }, SoftmaxOut});
    rows.push_back({"log_softmax_backward", s, 2, 1,
                    [](V t) { return LogSoftmaxBackward(t[0], t[1], -1); }, LogSoftmaxOut});
    rows.push_back({"layer_norm", s, 1, 1,
                    [](V t) { return LayerNorm(t[0], t[1], t[2], 1e-5).y; }, NormInputs});
    rows.push_back({"layer_norm_backward", s, 2, 1,
                    [](V t) { return LayerNormBackward(t[0], t[1], t[3], t[4], t[5]).dx; },
                    NormInputs});
    rows.push_back(
        {"rms_norm", s, 1, 1, [](V t) { return RmsNorm(t[0], t[1], 1e-5).y; }, NormInputs});
    rows.push_back({"rms_norm_backward", s, 2, 1,
                    [](V t) { return RmsNormBackward(t[0], t[1], t[6], t[5]).dx; },
                    NormInputs});
    rows.push_back(
        {"cross_entropy", s, 1, 0, [](V t) { return CrossEntropy(t[0], t[1]); }, Logits});
    rows.push_back({"cross_entropy_backward", s, 1, 1,
                    [](V t) { return CrossEntropyBackward(t[0], t[1], t[2]); }, Logits});
    rows.push_back({"sum", s, 1, 0, [](V t) { return Sum(t[0], {-1}); }, Normal1});
    rows.push_back({"mean", s, 1, 0, [](V t) { return Mean(t[0], {-1}); }, Normal1});
    rows.push_back({"max", s, 1, 0, [](V t) { return Max(t[0], {-1}); }, Normal1});
    rows.push_back({"transpose", s, 1, 1, [](V t) { return Transpose(t[0], 0, 1); }, Normal1});
  }
  return rows;
}

// Thread CPU seconds: this 2-core box is shared, so wall time mostly measures the other tenants.
double ClockSeconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
double ThreadSeconds() { return ClockSeconds(CLOCK_THREAD_CPUTIME_ID); }
double ProcessSeconds() { return ClockSeconds(CLOCK_PROCESS_CPUTIME_ID); }

// The median of per-iteration seconds, in ms: the statistic bench/peers/torch_ops.py takes on
// both sides (a mean would let a few iterations slowed by other tenants decide).
double MedianMs(std::vector<double> s) {
  if (s.empty()) return 0;
  std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
  return 1e3 * s[s.size() / 2];
}

void RunOpRow(benchmark::State& state, const OpRow& row) {
  const std::vector<Tensor> in = row.inputs(row.shape);
  int64_t numel = 1;
  for (int64_t d : row.shape) numel *= d;
  const size_t copy_bytes = static_cast<size_t>(numel) * 4 * (row.reads + row.writes) / 2;
  Tensor src = CopyBuffer(copy_bytes, 1), dst = CopyBuffer(copy_bytes, 0);
  std::vector<double> ours, raw;
  for (auto _ : state) {
    const double t0 = ThreadSeconds();
    Tensor out = row.fn(in);
    benchmark::DoNotOptimize(out.raw_data());
    const double t1 = ThreadSeconds();
    std::memcpy(dst.raw_data(), src.raw_data(), copy_bytes);
    benchmark::DoNotOptimize(dst.raw_data());
    const double t2 = ThreadSeconds();
    ours.push_back(t1 - t0);
    raw.push_back(t2 - t1);
    state.SetIterationTime(t1 - t0);
  }
  const double median_ms = MedianMs(ours);
  state.counters["median_ms"] = median_ms;
  state.counters["GBps"] = 2.0 * copy_bytes / (median_ms * 1e-3) / 1e9;
  state.counters["copy_ratio"] = MedianMs(raw) / median_ms;
}

std::string RowName(const OpRow& r) {
  std::string name = r.name + "/f32";
  if (r.shape.size() == 1) return name + "/elems:" + std::to_string(r.shape[0]);
  return name + "/rows:" + std::to_string(r.shape[0]) + "/cols:" + std::to_string(r.shape[1]);
}

const bool kOpRowsRegistered = [] {
  for (const OpRow& r : OpRows()) {
    benchmark::RegisterBenchmark(RowName(r).c_str(),
                                 [r](benchmark::State& st) { RunOpRow(st, r); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

// The Megatron MLP block at TP 1 on the tensor ops, f32, forward + backward: h = gelu(x w1 + b1)
// (fused epilogue), y = h w2 + b2; then dh = (dy w2^T) gelu'(pre) with db1 fused, and the four
// weight/bias gradients. bench/peers/torch_ops.py times the same block with torch.nn + autograd.
void BM_MegatronMlp(benchmark::State& state) {
  const int64_t tokens = state.range(0), hidden = state.range(1), ffn = state.range(2);
  PinBlasToOneThread();
  const Tensor x = RandomNormal({tokens, hidden}, 1), dy = RandomNormal({tokens, hidden}, 2);
  const Tensor w1 = RandomNormal({hidden, ffn}, 3, 0.0, 0.05), b1 = RandomNormal({ffn}, 4);
  const Tensor w2 = RandomNormal({ffn, hidden}, 5, 0.0, 0.05), b2 = RandomNormal({hidden}, 6);
  std::vector<double> seconds;
  for (auto _ : state) {
    const double t0 = ProcessSeconds();
    const LinearResult h = Linear(x, w1, b1, LinearEpilogue::kBiasGelu, GeluApprox::kTanh);
    const LinearResult y = Linear(h.y, w2, b2, LinearEpilogue::kBias);
    const LinearWeightGrads g2 = LinearWeightGrad(h.y, dy);
    const LinearGeluGrads gh = LinearGeluBackward(dy, w2, h.pre, true, GeluApprox::kTanh);
    const LinearWeightGrads g1 = LinearWeightGrad(x, gh.dpre, false);
    const Tensor dx = Matmul(gh.dpre, w1, false, true);
    benchmark::DoNotOptimize(y.y.raw_data());
    benchmark::DoNotOptimize(dx.raw_data());
    benchmark::DoNotOptimize(g1.dw.raw_data());
    benchmark::DoNotOptimize(g2.dw.raw_data());
    seconds.push_back(ProcessSeconds() - t0);
  }
  state.counters["median_ms"] = MedianMs(seconds);
}
BENCHMARK(BM_MegatronMlp)
    ->Name("mlp/f32/tokens:512/hidden:512/ffn:2048")
    ->Args({512, 512, 2048})
    ->MeasureProcessCPUTime()
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
