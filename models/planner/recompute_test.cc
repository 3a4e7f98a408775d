// Recomputation's estimate against Korthikanti et al. 2022's per-layer activation formulas
// (table 2) and the forward FLOPs it adds, with and without tensor / sequence parallelism and
// fused attention; bad input is an error.
#include "models/planner/recompute.h"

#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/llama/llama_model.h"

namespace shardmap::planner {
namespace {

RecomputeShape Gpt3(int tp, bool sp, bool fused = false) {
  RecomputeShape sh;
  sh.config = ModelShape{.layers = 96, .d_model = 12288, .heads = 96, .kv_heads = 96,
                         .vocab = 51200, .seq = 2048, .dtype = DType::kF32,
                         .compute = DType::kBF16};
  // Megatron's block: QKV [h, 3h] and the MLP's [h, 4h] column-parallel, the two projections
  // row-parallel.
  const int64_t h = 12288;
  sh.block_matmuls = {{3 * h / tp, h}, {h, h / tp}, {4 * h / tp, h}, {h, 4 * h / tp}};
  sh.tp = tp;
  sh.sp = sp;
  sh.microbatch_rows = 1;
  sh.passes = 4;
  sh.fused_attention = fused;
  return sh;
}

TEST(RecomputeTest, BlockActivationsFollowKorthikantiTable2) {
  const double sbh = 2048.0 * 12288;
  const double as_h = 5.0 * 96 * 2048 / 12288;  // 5 a s / h = 80
  EXPECT_DOUBLE_EQ(BlockActivationBytes(Gpt3(1, false), Recompute::kNone), sbh * (34 + as_h));
  EXPECT_DOUBLE_EQ(BlockActivationBytes(Gpt3(8, false), Recompute::kNone),
                   sbh * (10 + 24.0 / 8 + as_h / 8));
  EXPECT_DOUBLE_EQ(BlockActivationBytes(Gpt3(8, true), Recompute::kNone), sbh * (34 + as_h) / 8);
  EXPECT_DOUBLE_EQ(BlockActivationBytes(Gpt3(8, true), Recompute::kSelective), sbh * 34 / 8);
  EXPECT_DOUBLE_EQ(BlockActivationBytes(Gpt3(8, false), Recompute::kFull), 2 * sbh);
  EXPECT_DOUBLE_EQ(BlockActivationBytes(Gpt3(8, true), Recompute::kFull), 2 * sbh / 8);
  // Fused attention stores no scores; f32 activations take twice the bytes.
  EXPECT_DOUBLE_EQ(BlockActivationBytes(Gpt3(8, true, true), Recompute::kNone), sbh * 34 / 8);
  RecomputeShape f32 = Gpt3(1, false);
  f32.config.compute = DType::kF32;
  EXPECT_DOUBLE_EQ(BlockActivationBytes(f32, Recompute::kFull), 4 * sbh);
}

RoleWork Role() {
  RoleWork w;
  w.layers = 12;
  w.in_flight = 3;
  w.activation_peak_bytes = 400e9;
  w.peak_bytes = 500e9;
  w.others.push_back({"layer_norm", DType::kBF16, 0, 3e9});
  w.collectives.push_back({"all_reduce", {"tp"}, 8, 1e6, false, "tp"});
  w.collectives.push_back({"all_reduce", {"tp"}, 8, 1e6, true, "tp"});
  return w;
}

double Flops(const RoleWork& w) {
  double f = 0;
  for (const GemmWork& g : w.recompute_gemms) f += g.flops();
  for (const OtherWork& o : w.recompute_others) f += o.flops;
  return f;
}

TEST(RecomputeTest, FullKeepsBlockInputsAndRerunsTheForward) {
  const RecomputeShape sh = Gpt3(8, false);
  absl::StatusOr<RoleWork> full = KorthikantiRecompute()(Role(), Recompute::kFull, sh);
  ASSERT_TRUE(full.ok()) << full.status();
  const double none = BlockActivationBytes(sh, Recompute::kNone);
  const double kept = BlockActivationBytes(sh, Recompute::kFull);
  // The profile's 400 GB shrink to the kept share, plus one block's share of them.
  EXPECT_DOUBLE_EQ(full->activation_peak_bytes, 400e9 * kept / none + 400e9 / (3 * 12));
  EXPECT_DOUBLE_EQ(full->peak_bytes, 100e9 + full->activation_peak_bytes);
  // Megatron's forward FLOPs per layer and microbatch: 24 b s h^2 + 4 b s^2 h, over t.
  const double b = 1, s = 2048, h = 12288, per = (24 * b * s * h * h + 4 * b * s * s * h) / 8;
  EXPECT_NEAR(Flops(*full), per * 12 * 4 + 3e9 * 0, per * 1e-9 * 48);
  // The forward's TP all-reduce runs again (in the backward); the norm's bytes a third again.
  EXPECT_EQ(full->collectives.size(), 3u);
  EXPECT_TRUE(full->collectives.back().backward);
  ASSERT_FALSE(full->recompute_others.empty());
}

TEST(RecomputeTest, SelectiveRerunsTheAttentionCoreUnlessFused) {
  const RecomputeShape sh = Gpt3(8, false);
  absl::StatusOr<RoleWork> sel = KorthikantiRecompute()(Role(), Recompute::kSelective, sh);
  ASSERT_TRUE(sel.ok()) << sel.status();
  const double s = 2048, h = 12288;
  double gemm = 0;
  for (const GemmWork& g : sel->recompute_gemms) gemm += g.flops();
  EXPECT_NEAR(gemm, 4 * s * s * h / 8 * 12 * 4, 1);
  EXPECT_LT(sel->activation_peak_bytes, 400e9);
  EXPECT_EQ(sel->collectives.size(), 2u);  // no TP collective in the attention core
  // Fused attention already recomputes its scores: selective changes nothing.
  absl::StatusOr<RoleWork> fused =
      KorthikantiRecompute()(Role(), Recompute::kSelective, Gpt3(8, false, true));
  ASSERT_TRUE(fused.ok());
  EXPECT_DOUBLE_EQ(fused->peak_bytes, 500e9);
  EXPECT_TRUE(fused->recompute_gemms.empty());
}

// The block GEMMs one rank reruns, read off the parameter table: GPT-2's four ([in, out]
// layouts) and Llama's seven (nn.Linear's [out, in], taken as [k, n]: the same FLOPs and
// min-dim rate), each divided by tp where the weight is split.
TEST(RecomputeTest, BlockMatmulsFromTheParameterTable) {
  auto list = [](const std::vector<BlockMatmul>& v) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const BlockMatmul& m : v) out.push_back({m.n, m.k});
    return out;
  };
  using L = std::vector<std::pair<int64_t, int64_t>>;
  const GptConfig gpt{.layers = 2, .d_model = 64, .heads = 4, .vocab = 128, .seq = 16};
  absl::StatusOr<GptLayout> g = GptLayout::Create(*ParseMesh("dp=2,tp=2"), gpt, false);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(list(BlockMatmuls(*g, 2)), (L{{96, 64}, {64, 32}, {128, 64}, {64, 128}}));
  const LlamaConfig llama{.layers = 2, .d_model = 64, .heads = 8, .kv_heads = 2, .ffn_dim = 160,
                          .vocab = 128, .seq = 16};
  absl::StatusOr<LlamaLayout> l = LlamaLayout::Create(*ParseMesh("dp_shard=2,tp=2"), llama, true);
  ASSERT_TRUE(l.ok()) << l.status();
  // q [64, 64], k and v [16, 64] (2 kv heads of 8), o [64, 64]; gate, up [160, 64], down
  // [64, 160]: the out dim split for the column-parallel ones, the in dim for o and down.
  EXPECT_EQ(list(BlockMatmuls(*l, 2)),
            (L{{64, 32}, {64, 8}, {64, 8}, {32, 64}, {64, 80}, {64, 80}, {80, 64}}));
  absl::StatusOr<LlamaLayout> one = LlamaLayout::Create(Mesh(), llama, false);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(list(BlockMatmuls(*one, 1)),
            (L{{64, 64}, {64, 16}, {64, 16}, {64, 64}, {64, 160}, {64, 160}, {160, 64}}));
}

TEST(RecomputeTest, NoneIsTheProfileAndBadInputIsAnError) {
  absl::StatusOr<RoleWork> none = KorthikantiRecompute()(Role(), Recompute::kNone, Gpt3(8, true));
  ASSERT_TRUE(none.ok());
  EXPECT_DOUBLE_EQ(none->peak_bytes, 500e9);
  RoleWork no_layers = Role();
  no_layers.layers = 0;
  EXPECT_FALSE(KorthikantiRecompute()(no_layers, Recompute::kFull, Gpt3(8, true)).ok());
  RecomputeShape rows = Gpt3(8, true);
  rows.microbatch_rows = 0;
  EXPECT_FALSE(KorthikantiRecompute()(Role(), Recompute::kFull, rows).ok());
  EXPECT_EQ(*ParseRecompute("selective"), Recompute::kSelective);
  EXPECT_FALSE(ParseRecompute("some").ok());
}

}  // namespace
}  // namespace shardmap::planner
