// GPT-2 in bf16 mixed precision (GptConfig::compute = bf16, f32 master weights): the losses track
// the f32 run, every mesh gives the 1-device bf16 losses closely, and the master weights, AdamW
// moments and gradients stay f32 while the saved activations shrink.
//
// Tolerances (measured on this model, 5 AdamW steps, lr 3e-3; u = 2^-8, bf16's unit roundoff):
//   bf16 vs f32, step 0 (same weights, forward rounding only): <= 2^-12 relative. Each token's
//     logits carry errors of a few u, but the loss is a mean over 96 tokens whose errors mostly
//     cancel: measured 7e-6 .. 2e-5 relative (f32 vs f64 is ~1e-7).
//   bf16 vs f32, steps 1-4: <= 2^-9 relative (u/2). AdamW divides by sqrt(v), so a gradient
//     element whose bf16 error is comparable to itself moves its parameter by a different ~lr;
//     the trajectories drift apart step by step. Measured <= 7.6e-4 relative (2.7e-3 absolute),
//     while the loss falls by 0.33 over the run: a bf16 run that did not train would fail.
//   sharded bf16 vs 1-device bf16: step 0 <= 2^-14 relative (tp / cp round partial sums and ring
//     blocks to bf16 at other places; measured <= 2.4e-5), steps 1-4 <= 2^-11 (measured
//     <= 1.9e-4 relative, cp2).
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt.h"
#include "models/train/gpt_test_util.h"

namespace shardmap {
namespace {

constexpr int kSteps = 5;

GptConfig Config(std::optional<DType> compute) {
  GptConfig c;
  c.layers = 2;
  c.d_model = 24;
  c.heads = 6;
  c.vocab = 48;
  c.seq = 8;
  c.dtype = DType::kF32;
  c.compute = compute;
  return c;
}

std::vector<int64_t> Tokens(int64_t n, int64_t vocab) {
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = ((i % 9) * 5 + (i / 45) % 3) % vocab;
  return t;
}

TrainResult Train(const std::string& mesh, bool sp, std::optional<DType> compute) {
  const GptConfig c = Config(compute);
  absl::StatusOr<Mesh> m = ParseMesh(mesh);
  EXPECT_TRUE(m.ok()) << m.status();
  absl::StatusOr<GptLayout> layout = GptLayout::Create(*m, c, sp);
  EXPECT_TRUE(layout.ok()) << layout.status();
  TrainOptions o;
  o.steps = kSteps;
  o.batch = 12;
  o.optimizer.adamw.lr = 3e-3;
  o.optimizer.clip = 0.5;
  absl::StatusOr<TrainResult> r = TrainGpt(*layout, InitGpt(c, 7), Tokens(600, c.vocab), o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : TrainResult{};
}

const TrainResult& F32() {
  static const TrainResult* r = new TrainResult(Train("", false, std::nullopt));
  return *r;
}
const TrainResult& Bf16() {
  static const TrainResult* r = new TrainResult(Train("", false, DType::kBF16));
  return *r;
}

// |got - want| <= rel_step0 * |want| at step 0 and rel * |want| after.
void ExpectLossesNear(const TrainResult& got, const TrainResult& want, double rel_step0,
                      double rel) {
  ASSERT_EQ(got.losses.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(want.losses.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], (s == 0 ? rel_step0 : rel) * want.losses[s])
        << "step " << s;
  }
}

void ExpectAllF32(const TrainResult& r) {
  ASSERT_FALSE(r.params.empty());
  for (const NamedTensor& p : r.params) EXPECT_EQ(p.tensor.dtype(), DType::kF32) << p.name;
  for (const NamedTensor& m : r.adam_state.exp_avg) EXPECT_EQ(m.tensor.dtype(), DType::kF32);
  for (const NamedTensor& m : r.adam_state.exp_avg_sq) EXPECT_EQ(m.tensor.dtype(), DType::kF32);
}

TEST(GptBf16Test, OneDeviceTracksF32AndKeepsF32MasterWeights) {
  const TrainResult &f32 = F32(), &bf16 = Bf16();
  ExpectLossesNear(bf16, f32, std::ldexp(1.0, -12), std::ldexp(1.0, -9));
  // bf16 really computes in bf16: its first loss differs from f32's by far more than f32 from
  // f64 (~1e-7), and it trains (the tolerance is far below the loss decrease).
  EXPECT_GT(std::fabs(bf16.losses[0] - f32.losses[0]), 2e-6);
  EXPECT_LT(bf16.losses[kSteps - 1], bf16.losses[0] - 0.2);
  ExpectAllF32(bf16);
  // Per rank: the same f32 parameters, gradients and moments; the taped activations are mostly
  // bf16 (the f32 logits for the loss and the f32 casts' inputs stay): measured 0.56x.
  EXPECT_EQ(bf16.param_bytes_per_rank, f32.param_bytes_per_rank);
  EXPECT_EQ(bf16.optimizer_bytes_per_rank, f32.optimizer_bytes_per_rank);
  EXPECT_LT(bf16.activation_bytes_per_rank, 0.6 * f32.activation_bytes_per_rank);
  EXPECT_GT(bf16.activation_bytes_per_rank, 0.4 * f32.activation_bytes_per_rank);
}

using gpt_testing::Layout;
using gpt_testing::LayoutName;

class GptBf16MeshTest : public ::testing::TestWithParam<Layout> {};

TEST_P(GptBf16MeshTest, MatchesOneDeviceBf16AndTracksF32) {
  const TrainResult got = Train(GetParam().mesh, GetParam().sp, DType::kBF16);
  ExpectLossesNear(got, Bf16(), std::ldexp(1.0, -14), std::ldexp(1.0, -11));
  ExpectLossesNear(got, F32(), std::ldexp(1.0, -12), std::ldexp(1.0, -9));
  ExpectAllF32(got);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, GptBf16MeshTest,
    ::testing::Values(Layout{"dp=2", false}, Layout{"dp_shard=2", false}, Layout{"tp=2", true},
                      Layout{"tp=2", false}, Layout{"dp=3", false}, Layout{"tp=3", true},
                      Layout{"dp_replicate=2,dp_shard=2", false},
                      Layout{"dp_shard=2,tp=2", true}, Layout{"cp=2", false},
                      Layout{"cp=2,tp=2", true}),
    LayoutName);

TEST(GptBf16Test, FsdpHoldsHalfTheF32StatePerRank) {
  const TrainResult fsdp = Train("dp_shard=2", false, DType::kBF16);
  const TrainResult dp = Train("dp=2", false, DType::kBF16);
  EXPECT_EQ(dp.param_bytes_per_rank, F32().param_bytes_per_rank);
  // Every GPT parameter has a dim that 2 divides: exactly half.
  EXPECT_EQ(2 * fsdp.param_bytes_per_rank, dp.param_bytes_per_rank);
  EXPECT_EQ(2 * fsdp.optimizer_bytes_per_rank, dp.optimizer_bytes_per_rank);
}

}  // namespace
}  // namespace shardmap
