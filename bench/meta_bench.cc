// Shape-only execution speed: the cost of one op on the meta device (the target is ~1 us, so a
// GPT step of hundreds of thousands of ops runs in well under a second), with and without an
// OpCounter and a MemoryTracker recording, and the cost accounting adds to a real CPU op when off.
//
//   bazel run -c opt //bench:meta_bench
#include "benchmark/benchmark.h"
#include "tensor/memory_tracker.h"
#include "tensor/op_counter.h"
#include "tensor/ops/attention.h"
#include "tensor/ops/elementwise.h"
#include "tensor/ops/linear.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/nn.h"
#include "tensor/ops/shape_ops.h"

namespace shardmap {
namespace {

const Device kMeta = Device::Meta();

// A 7B-sized GEMM in bf16: on meta its cost does not depend on the size.
void BM_MetaMatmul(benchmark::State& state) {
  const Tensor a = Tensor::Empty({8, 4096, 4096}, DType::kBF16, kMeta);
  const Tensor b = Tensor::Empty({4096, 11008}, DType::kBF16, kMeta);
  for (auto _ : state) {
    Tensor c = Matmul(a, b);
    benchmark::DoNotOptimize(c);
  }
}
BENCHMARK(BM_MetaMatmul);

void BM_MetaLayerNorm(benchmark::State& state) {
  const Tensor x = Tensor::Empty({8, 4096, 4096}, DType::kBF16, kMeta);
  const Tensor g = Tensor::Empty({4096}, DType::kBF16, kMeta);
  for (auto _ : state) {
    LayerNormResult r = LayerNorm(x, g, g, 1e-5);
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_MetaLayerNorm);

// The same two ops with an OpCounter and a MemoryTracker live (cleared now and then so the
// record list stays small).
void BM_MetaMatmulLayerNormCounted(benchmark::State& state) {
  const Tensor a = Tensor::Empty({8, 4096, 4096}, DType::kBF16, kMeta);
  const Tensor b = Tensor::Empty({4096, 4096}, DType::kBF16, kMeta);
  const Tensor g = Tensor::Empty({4096}, DType::kBF16, kMeta);
  MemoryTracker mem;
  OpCounter counter;
  int64_t n = 0;
  for (auto _ : state) {
    Tensor c = Matmul(a, b);
    LayerNormResult r = LayerNorm(c, g, g, 1e-5);
    benchmark::DoNotOptimize(r);
    if (++n % 4096 == 0) counter.Clear();
  }
  state.SetItemsProcessed(2 * state.iterations());
}
BENCHMARK(BM_MetaMatmulLayerNormCounted);

// One GPT-2 XL-sized transformer block, forward and backward (about 25 ops), counted: items are
// ops.
void BM_MetaTransformerBlockCounted(benchmark::State& state) {
  const int64_t b = 8, s = 1024, d = 1600, h = 25;
  auto M = [](absl::Span<const int64_t> shape, DType t = DType::kBF16) {
    return Tensor::Empty(shape, t, kMeta);
  };
  const Tensor x = M({b, s, d}), g = M({d}), wqkv = M({d, 3 * d}), bqkv = M({3 * d});
  const Tensor wo = M({d, d}), w1 = M({d, 4 * d}), b1 = M({4 * d}), w2 = M({4 * d, d});
  MemoryTracker mem;
  OpCounter counter;
  int64_t ops = 0;
  const int64_t dh = d / h;
  for (auto _ : state) {
    LayerNormResult ln1 = LayerNorm(x, g, g, 1e-5);
    LinearResult qkv = Linear(ln1.y, wqkv, bqkv, LinearEpilogue::kBias);
    std::vector<Tensor> parts = Split(qkv.y, -1, {d, d, d});  // q, k, v
    const Tensor q = parts[0].Reshape({b, s, h, dh}), k = parts[1].Reshape({b, s, h, dh});
    const Tensor v = parts[2].Reshape({b, s, h, dh});
    CausalAttentionResult att = CausalAttention(q, k, v, 0.125);
    const Tensor att_rows = att.out.Reshape({b, s, d});
    Tensor r1 = Add(x, Matmul(att_rows, wo));
    LayerNormResult ln2 = LayerNorm(r1, g, g, 1e-5);
    LinearResult h1 = Linear(ln2.y, w1, b1, LinearEpilogue::kBiasGelu);
    Tensor y = Add(r1, Matmul(h1.y, w2));
    // backward, dy = y's shape
    const Tensor& dy = y;
    LinearWeightGrads gw2 = LinearWeightGrad(h1.y, dy, false);
    LinearGeluGrads gh = LinearGeluBackward(dy, w2, h1.pre);
    LinearWeightGrads gw1 = LinearWeightGrad(ln2.y, gh.dpre);
    Tensor dln2 = Matmul(gh.dpre, w1, false, true);
    LayerNormGrads gln2 = LayerNormBackward(r1, g, ln2.mean, ln2.rstd, dln2);
    AddInPlace(gln2.dx, dy);
    LinearWeightGrads gwo = LinearWeightGrad(att_rows, gln2.dx, false);
    Tensor datt = Matmul(gln2.dx, wo, false, true).Reshape({b, s, h, dh});
    CausalAttentionGrads ga = CausalAttentionBackward(q, k, v, att.out, att.lse, datt, 0.125);
    Tensor dqkv =
        Concat({ga.dq.Reshape({b, s, d}), ga.dk.Reshape({b, s, d}), ga.dv.Reshape({b, s, d})}, -1);
    LinearWeightGrads gqkv = LinearWeightGrad(ln1.y, dqkv);
    Tensor dln1 = Matmul(dqkv, wqkv, false, true);
    LayerNormGrads gln1 = LayerNormBackward(x, g, ln1.mean, ln1.rstd, dln1);
    benchmark::DoNotOptimize(gln1);
    benchmark::DoNotOptimize(ga);
    benchmark::DoNotOptimize(gqkv);
    benchmark::DoNotOptimize(gw1);
    benchmark::DoNotOptimize(gw2);
    benchmark::DoNotOptimize(gwo);
    ops += static_cast<int64_t>(counter.ops().size());
    counter.Clear();
  }
  state.SetItemsProcessed(ops);
}
BENCHMARK(BM_MetaTransformerBlockCounted);

// A real CPU op with accounting off (one thread-local read per op) and on.
void BM_CpuTinyAdd(benchmark::State& state) {
  const Tensor a = Tensor::Full({1}, 1.0), b = Tensor::Full({1}, 2.0);
  for (auto _ : state) {
    Tensor c = Add(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
}
BENCHMARK(BM_CpuTinyAdd);

void BM_CpuTinyAddCounted(benchmark::State& state) {
  const Tensor a = Tensor::Full({1}, 1.0), b = Tensor::Full({1}, 2.0);
  MemoryTracker mem;
  OpCounter counter;
  int64_t n = 0;
  for (auto _ : state) {
    Tensor c = Add(a, b);
    benchmark::DoNotOptimize(c.raw_data());
    if (++n % 4096 == 0) counter.Clear();
  }
}
BENCHMARK(BM_CpuTinyAddCounted);

}  // namespace
}  // namespace shardmap
