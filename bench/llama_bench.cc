// Tokens/s of a Llama 3 training step on one CPU rank, 1 thread: forward, backward (the model
// contract's ModelLoss through shard_map + value_and_grad), global-norm clipping 1.0 and AdamW
// (lr 1e-3, betas 0.9/0.95, wd 0.1 on >= 2-dim tensors), f32. Shape: 4 layers, d_model 256,
// 8 heads, 4 kv heads (GQA, head_dim 32), SwiGLU ffn 768 (LlamaFfnDim(256, 256), torchtitan's
// debugmodel rule), vocab 256, seq 256, batch 8, rope theta 500000 (gpt_bench's small GPT-2
// shape, Llama's blocks).
//
//   OPENBLAS_NUM_THREADS=1 bazel run -c opt //bench:llama_bench
//   bash bench/peers/llama_torch.sh        # this and the same step in PyTorch eager
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/value_and_grad.h"
#include "bench/bench_tokens.h"
#include "benchmark/benchmark.h"
#include "models/components/optimizer.h"
#include "models/llama/llama_model.h"
#include "shardmap/shard_map.h"
#include "tensor/ops/elementwise.h"

namespace shardmap {
namespace {

constexpr int64_t kBatch = 8;

LlamaConfig BenchConfig() {
  LlamaConfig c;
  c.layers = 4;
  c.d_model = 256;
  c.heads = 8;
  c.kv_heads = 4;
  c.ffn_dim = LlamaFfnDim(256, 256);
  c.vocab = 256;
  c.seq = 256;
  c.rope_theta = 500000;
  c.dtype = DType::kF32;
  return c;
}

// Scales the gradients so their global L2 norm is at most `max_norm` (PyTorch's
// clip_grad_norm_: coefficient max_norm / (norm + 1e-6) when below 1).
void ClipGlobalNorm(std::vector<NamedTensor>& grads, double max_norm) {
  double sq = 0;
  for (const NamedTensor& g : grads) {
    const float* p = g.tensor.data<float>();
    for (int64_t i = 0; i < g.tensor.numel(); ++i) sq += static_cast<double>(p[i]) * p[i];
  }
  const double coef = max_norm / (std::sqrt(sq) + 1e-6);
  if (coef >= 1) return;
  for (NamedTensor& g : grads) g.tensor = MulScalar(g.tensor, coef);
}

double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

void BM_LlamaStep(benchmark::State& state) {
  const LlamaConfig cfg = BenchConfig();
  const Mesh mesh = *ParseMesh("dp=1");
  auto layout = std::make_shared<const LlamaLayout>(*LlamaLayout::Create(mesh, cfg, false));
  std::vector<NamedTensor> params = layout->Init(1);
  const size_t np = params.size();
  const int64_t rows = kBatch * cfg.seq;
  const std::vector<int64_t> data = bench::RandomTokens(1 << 16, cfg.vocab);
  ShardFn fn = [layout, np, rows](const std::vector<Value>& in) {
    std::vector<Value> p(in.begin(), in.begin() + np);
    return std::vector<Value>{ModelLoss(*layout, ParamUse(*layout, p), in[np], in[np + 1], rows)};
  };
  std::vector<PartitionSpec> specs(np + 2);
  const ShardMapValueAndGrad step = value_and_grad(ShardMap(fn, mesh, specs, {PartitionSpec()}));
  AdamWOptions ao{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (const ParamInfo& p : layout->params()) {
    if (!p.decay) ao.no_decay.insert(p.name);
  }
  AdamW opt(ao);
  int64_t s = 0;
  // One step: the batch of step s, forward + backward, clipping, AdamW. Empty on success.
  auto one_step = [&](double* loss) -> std::string {
    // Sample b of step s: tokens [(s*B+b)*T, +T+1) of the data, wrapping (gpt_bench's rule).
    std::vector<int64_t> ids(rows), targets(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t b = r / cfg.seq, t = r % cfg.seq;
      const int64_t start = (s * kBatch + b) * cfg.seq + t;
      ids[r] = data[start % data.size()];
      targets[r] = data[(start + 1) % data.size()];
    }
    ++s;
    std::vector<Tensor> in;
    for (const NamedTensor& p : params) in.push_back(p.tensor);
    in.push_back(Tensor::FromVector<int64_t>({rows}, ids));
    in.push_back(Tensor::FromVector<int64_t>({rows}, targets));
    absl::StatusOr<ShardMapGrads> r = step(in);
    if (!r.ok()) return std::string(r.status().message());
    std::vector<NamedTensor> grads;
    for (size_t i = 0; i < np; ++i) grads.push_back({params[i].name, r->grads[i]});
    ClipGlobalNorm(grads, 1.0);
    if (absl::Status st = opt.Step(params, grads); !st.ok()) return std::string(st.message());
    *loss = r->outputs[0].at(0);
    return "";
  };
  double loss = 0;
  if (std::string e = one_step(&loss); !e.empty()) {  // warm-up
    state.SkipWithError(e.c_str());
    for (auto _ : state) {
    }
    return;
  }
  const double cpu0 = ProcessCpuSeconds();
  for (auto _ : state) {
    if (std::string e = one_step(&loss); !e.empty()) {
      state.SkipWithError(e.c_str());
      break;
    }
  }
  state.counters["loss"] = loss;
  // The process's CPU time per step (the rank thread's, 1 BLAS thread): unlike the wall time it
  // does not grow when other processes share the cores.
  state.counters["cpu_ms_per_step"] =
      1e3 * (ProcessCpuSeconds() - cpu0) / std::max<int64_t>(1, state.iterations());
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(rows) * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LlamaStep)->Unit(benchmark::kMillisecond)->Iterations(4)->UseRealTime();

}  // namespace
}  // namespace shardmap
