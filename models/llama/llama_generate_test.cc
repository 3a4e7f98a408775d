// Llama 3 generation with the KV cache (models/model/kv_cache.h through the contract's Decode*
// hooks) against the recomputation of the whole prefix on one device: f64 logits of every step
// to 1e-12 and the same greedy tokens, with grouped-query attention (the cache holds kv_heads)
// and the kv heads split over tp; f32 greedy gives the same tokens.
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt/generate_steps_testing.h"
#include "models/llama/llama_model.h"
#include "models/parallel/parallel_dims.h"
#include "shardmap/mesh.h"

namespace shardmap {
namespace {

using generate_testing::GreedySteps;
using generate_testing::MaxRelDiff;
using generate_testing::Steps;

// heads 6 over kv_heads 2 (3 query heads per kv head): tp 2 splits both; seq 10.
LlamaConfig Config(DType dtype) {
  return LlamaConfig{.layers = 2, .d_model = 24, .heads = 6, .kv_heads = 2, .ffn_dim = 40,
                     .vocab = 50, .seq = 10, .rope_theta = 10000, .dtype = dtype};
}

// Llama's init times 20 (norm weights kept at 1): logits far from uniform, so greedy tokens are
// not decided by rounding.
std::vector<NamedTensor> Params(const LlamaConfig& c) {
  std::vector<NamedTensor> p = InitLlama(c, 3);
  for (NamedTensor& t : p) {
    if (t.tensor.rank() < 2) continue;
    std::vector<double> v = t.tensor.ToVector<double>();
    for (double& x : v) x *= 20;
    t.tensor = Tensor::FromVector<double>(t.tensor.shape(), v, c.dtype);
  }
  return p;
}

LlamaLayout Layout(const std::string& mesh, bool sp, const LlamaConfig& c) {
  absl::StatusOr<Mesh> m = ParseMesh(mesh);
  EXPECT_TRUE(m.ok()) << m.status();
  absl::StatusOr<LlamaLayout> l = LlamaLayout::Create(*m, c, sp);
  EXPECT_TRUE(l.ok()) << mesh << ": " << l.status();
  return *l;
}

TEST(LlamaGenerateTest, KvCacheEqualsRecomputationF64) {
  const LlamaConfig c = Config(DType::kF64);
  const auto params = Params(c);
  const std::vector<int64_t> prompt = {4, 41, 9, 17};  // 4 + 7 - 1 = 10 = seq
  const Steps want = GreedySteps(Layout("dp=1", false, c), params, prompt, 7, KvCacheMode::kOff);
  ASSERT_EQ(want.tokens.size(), 7u);
  for (auto [mesh, sp] : {std::pair<std::string, bool>{"dp=1", false}, {"tp=2", false},
                          {"tp=2", true}, {"dp=3", false}, {"dp_shard=2,tp=2", true},
                          {"cp=5", false}, {"dp=2,tp=2", true}}) {
    const LlamaLayout l = Layout(mesh, sp, c);
    const Steps got = GreedySteps(l, params, prompt, 7, KvCacheMode::kOn);
    EXPECT_EQ(got.tokens, want.tokens) << mesh;
    EXPECT_LT(MaxRelDiff(got, want), 1e-12) << mesh << (sp ? " sp" : "");
  }
}

TEST(LlamaGenerateTest, KvCacheF32GreedyTokens) {
  const LlamaConfig c = Config(DType::kF32);
  const auto params = Params(c);
  for (auto [mesh, sp] : {std::pair<std::string, bool>{"dp=1", false}, {"tp=2", true}}) {
    const LlamaLayout l = Layout(mesh, sp, c);
    const Steps off = GreedySteps(l, params, {1, 2, 3}, 8, KvCacheMode::kOff);
    const Steps on = GreedySteps(l, params, {1, 2, 3}, 8, KvCacheMode::kOn);
    EXPECT_EQ(on.tokens, off.tokens) << mesh;
    EXPECT_LT(MaxRelDiff(on, off), 1e-4) << mesh;
  }
}

TEST(LlamaGenerateTest, KvCacheSupportAndLengthError) {
  const LlamaConfig c = Config(DType::kF64);
  const LlamaLayout l = Layout("tp=2", true, c);
  EXPECT_TRUE(l.KvCacheSupport().ok());
  SampleOptions on{.tokens = 8};
  on.kv_cache = KvCacheMode::kOn;
  absl::StatusOr<std::vector<int64_t>> r = GenerateGpt(l, Params(c), {1, 2, 3, 4}, on);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("model's seq = 10"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace shardmap
