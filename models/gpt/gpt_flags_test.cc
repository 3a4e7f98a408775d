#include "models/gpt/gpt_flags.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap {
namespace {

using ::testing::HasSubstr;

GptConfigFlagValues Small() {
  GptConfigFlagValues v;
  v.layers = 2;
  v.d_model = 64;
  v.heads = 4;
  v.vocab = 256;
  v.seq = 16;
  v.dtype = "f32";
  return v;
}

TEST(GptFlagsTest, TheFlagsBecomeTheConfig) {
  GptConfigFlagValues v = Small();
  v.experts = 4;
  v.topk = 2;
  v.capacity = 1.5;
  v.aux_loss_coef = 0.02;
  v.expert_axes = "dp_shard,ep";
  absl::StatusOr<GptConfig> cfg = GptConfigFromFlags(v);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->layers, 2);
  EXPECT_EQ(cfg->d_model, 64);
  EXPECT_EQ(cfg->heads, 4);
  EXPECT_EQ(cfg->vocab, 256);
  EXPECT_EQ(cfg->seq, 16);
  EXPECT_EQ(cfg->dtype, DType::kF32);
  EXPECT_FALSE(cfg->compute.has_value());
  EXPECT_EQ(cfg->moe.experts, 4);
  EXPECT_EQ(cfg->moe.topk, 2);
  EXPECT_EQ(cfg->moe.capacity_factor, 1.5);
  EXPECT_EQ(cfg->moe.aux_loss_coef, 0.02);
  EXPECT_EQ(cfg->moe.expert_axes, (std::vector<std::string>{"dp_shard", "ep"}));
}

TEST(GptFlagsTest, PrecisionNames) {
  GptConfig cfg;
  ASSERT_TRUE(ParsePrecisionFlag("bf16", &cfg).ok());
  EXPECT_EQ(cfg.dtype, DType::kF32);  // master weights
  EXPECT_EQ(cfg.compute, DType::kBF16);
  GptConfig f64;
  ASSERT_TRUE(ParsePrecisionFlag("f64", &f64).ok());
  EXPECT_EQ(f64.dtype, DType::kF64);
  EXPECT_FALSE(f64.compute.has_value());
  absl::Status bad = ParsePrecisionFlag("fp8", &cfg);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("--dtype fp8: use f32, f64 or bf16"));
}

TEST(GptFlagsTest, BadShapesNameTheFlag) {
  GptConfigFlagValues v = Small();
  v.seq = 0;
  EXPECT_THAT(GptConfigFromFlags(v).status().message(), HasSubstr("--seq 0 must be >= 1"));
  v = Small();
  v.layers = -3;
  EXPECT_THAT(GptConfigFromFlags(v).status().message(), HasSubstr("--layers -3 must be >= 1"));
  v = Small();
  v.heads = 5;
  EXPECT_THAT(GptConfigFromFlags(v).status().message(),
              HasSubstr("--d_model 64 is not divisible by --heads 5"));
  v = Small();
  v.dtype = "half";
  EXPECT_THAT(GptConfigFromFlags(v).status().message(), HasSubstr("--dtype half"));
}

}  // namespace
}  // namespace shardmap
