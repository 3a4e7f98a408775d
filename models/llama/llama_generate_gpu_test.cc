// Llama 3 generation on GPU ranks (every rank on GPU 0): the KV-cache path (the CUDA fused
// attention with grouped kv heads and a q_offset, RMSNorm, SiLU, rope) against the recomputed
// window on the GPU and against the CPU, f64 and f32, on one device and tp2. Skips without a GPU
// (tools/gpu_bundle.sh bundles it: its name says gpu).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt/gpt_generate.h"
#include "models/llama/llama_model.h"
#include "models/parallel/parallel_dims.h"
#include "shardmap/device_placement.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

// head_dim 64 so bf16/f16 would take the tensor cores; here f64 and f32 (SIMT kernels).
LlamaConfig Config(DType dtype) {
  return LlamaConfig{.layers = 2, .d_model = 256, .heads = 4, .kv_heads = 2, .ffn_dim = 128,
                     .vocab = 64, .seq = 24, .rope_theta = 10000, .dtype = dtype};
}

std::vector<NamedTensor> Params(const LlamaConfig& c) {
  std::vector<NamedTensor> p = InitLlama(c, 5);
  for (NamedTensor& t : p) {
    if (t.tensor.rank() < 2) continue;
    std::vector<double> v = t.tensor.ToVector<double>();
    for (double& x : v) x *= 10;
    t.tensor = Tensor::FromVector<double>(t.tensor.shape(), v, c.dtype);
  }
  return p;
}

struct Steps {
  std::vector<int64_t> tokens;
  std::vector<std::vector<double>> logits;
};
Steps Greedy(const std::string& mesh, const LlamaConfig& c, KvCacheMode mode, bool gpu) {
  const LlamaLayout l = *LlamaLayout::Create(*ParseMesh(mesh), c, false);
  Steps out;
  SampleOptions o{.tokens = 12};
  o.kv_cache = mode;
  o.step_logits = &out.logits;
  if (gpu) o.placement = DevicePlacement::SharedGpu(0);
  absl::StatusOr<std::vector<int64_t>> r = GenerateGpt(l, Params(c), {3, 1, 4, 1, 5}, o);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) out.tokens = *r;
  return out;
}

double MaxRelDiff(const Steps& a, const Steps& b) {
  EXPECT_EQ(a.logits.size(), b.logits.size());
  double worst = 0;
  for (size_t s = 0; s < std::min(a.logits.size(), b.logits.size()); ++s) {
    for (size_t v = 0; v < a.logits[s].size(); ++v) {
      worst = std::max(worst, std::abs(a.logits[s][v] - b.logits[s][v]) /
                                  std::max(1.0, std::abs(b.logits[s][v])));
    }
  }
  return worst;
}

TEST(LlamaGenerateGpuTest, KvCacheOnGpuEqualsRecomputationAndCpu) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF64, DType::kF32}) {
    const LlamaConfig c = Config(dt);
    const double tol = dt == DType::kF64 ? 1e-12 : 1e-4;
    const Steps cpu = Greedy("dp=1", c, KvCacheMode::kOff, false);
    for (const std::string mesh : {"dp=1", "tp=2"}) {
      const Steps on = Greedy(mesh, c, KvCacheMode::kOn, true);
      const Steps off = Greedy(mesh, c, KvCacheMode::kOff, true);
      EXPECT_EQ(on.tokens, off.tokens) << mesh << " " << DTypeName(dt);
      EXPECT_EQ(on.tokens, cpu.tokens) << mesh << " " << DTypeName(dt);
      EXPECT_LT(MaxRelDiff(on, off), tol) << mesh << " " << DTypeName(dt);
      EXPECT_LT(MaxRelDiff(on, cpu), tol) << mesh << " " << DTypeName(dt);
    }
  }
}

}  // namespace
}  // namespace shardmap
