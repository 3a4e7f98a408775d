// Llama 3 generation on GPU ranks (every rank on GPU 0): the KV-cache path (the CUDA fused
// attention with grouped kv heads and a q_offset, RMSNorm, SiLU, rope) against the recomputed
// window on the GPU and against the CPU, f64 and f32, on one device and tp2. Skips without a GPU
// (tools/gpu_bundle.sh bundles it: its name says gpu).
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt/generate_steps_testing.h"
#include "models/llama/llama_model.h"
#include "models/parallel/parallel_dims.h"
#include "shardmap/device_placement.h"
#include "tensor/testing/test_util.h"

namespace shardmap {
namespace {

using generate_testing::GreedySteps;
using generate_testing::MaxRelDiff;
using generate_testing::Steps;

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

// Greedy on `mesh`, its ranks on GPU 0 or on the CPU.
Steps Greedy(const std::string& mesh, const LlamaConfig& c, KvCacheMode mode, bool gpu) {
  const LlamaLayout l = *LlamaLayout::Create(*ParseMesh(mesh), c, false);
  SampleOptions o{.tokens = 12};
  o.kv_cache = mode;
  if (gpu) o.placement = DevicePlacement::SharedGpu(0);
  return GreedySteps(l, Params(c), {3, 1, 4, 1, 5}, o);
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
