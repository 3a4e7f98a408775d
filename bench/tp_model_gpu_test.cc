// The GPU-fed TP model: the per-rank GEMM lists against LayerFlops, and hand-computed one-GPU and
// multi-node predictions. The profile's parser and links are tested in perfmodel/.
#include "bench/tp_model_gpu.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardmap::bench {
namespace {

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(TpModelGpuTest, RankGemmsOfTheMlpByHand) {
  // tokens 8, d 4 (ffn 16), t 2: [8,4]x[4,8] and [8,8]x[8,4].
  LayerCase c{Layer::kMlp, 2, false, false, 8, 4};
  c.head_dim = 2;
  std::vector<GemmShape> want = {{1, 8, 4, 8}, {1, 8, 8, 4}};
  EXPECT_EQ(RankGemms(c), want);
  c.fwd_bwd = true;  // + dA (m,n,k) and dB (k,m,n) of each
  want = {{1, 8, 4, 8}, {1, 8, 8, 4}, {1, 8, 8, 4}, {1, 4, 8, 8}, {1, 8, 4, 8}, {1, 8, 8, 4}};
  EXPECT_EQ(RankGemms(c), want);
}

TEST(TpModelGpuTest, RankGemmsOfAttentionByHand) {
  // tokens 8, d 4, heads of 2 (2 heads), seq 4, t 2: qkv [8,4]x[4,6]; scores (2 sequences x 1
  // head) x [4,2]x[2,4]; p v 2 x [4,4]x[4,2]; projection [8,2]x[2,4].
  LayerCase c{Layer::kAttention, 2, false, false, 8, 4};
  c.head_dim = 2;
  c.seq_len = 4;
  std::vector<GemmShape> want = {{1, 8, 4, 6}, {2, 4, 2, 4}, {2, 4, 4, 2}, {1, 8, 2, 4}};
  EXPECT_EQ(RankGemms(c), want);
}

// Every layer's per-rank GEMMs add up to its FLOPs split over t.
TEST(TpModelGpuTest, RankGemmFlopsSumToLayerFlopsOverT) {
  for (Layer layer :
       {Layer::kColumn, Layer::kRow, Layer::kMlp, Layer::kAttention, Layer::kBlock}) {
    for (int t : {1, 2, 4, 8}) {
      for (bool fwd_bwd : {false, true}) {
        LayerCase c{layer, t, t > 1, fwd_bwd, 512, 512};
        SCOPED_TRACE(c.Name());
        double flops = 0;
        for (const GemmShape& g : RankGemms(c)) flops += g.Flops();
        EXPECT_DOUBLE_EQ(flops, LayerFlops(c) / t);
      }
    }
  }
  EXPECT_TRUE(RankGemms({Layer::kAsyncMlp, 2, true, true, 8, 4}).empty());
}

// MLP, tokens 8, d 4, f32, no SP, forward, t = 2 virtual ranks on one GPU: GEMMs 1 ms + 2 ms per
// rank, both ranks' on the one card: 6 ms; one all_reduce of [8, 4] f32 = 128 bytes: 0.5 ms.
TEST(TpModelGpuTest, SharedGpuPredictionByHand) {
  GpuProfile p;
  p.gemm_s[{DType::kF32, GemmShape{1, 8, 4, 8}}] = 1e-3;
  p.gemm_s[{DType::kF32, GemmShape{1, 8, 8, 4}}] = 2e-3;
  p.collective_s[{CollectiveKind::kAllReduce, DType::kF32, 2, 128.0}] = 0.5e-3;
  LayerCase c{Layer::kMlp, 2, false, false, 8, 4};
  c.head_dim = 2;
  c.backend = Backend::kSharedGpu;
  absl::StatusOr<Prediction> pred = PredictSharedGpu(p, c);
  ASSERT_TRUE(pred.ok()) << pred.status();
  EXPECT_DOUBLE_EQ(pred->compute_s, 6e-3);
  EXPECT_DOUBLE_EQ(pred->comm_s, 0.5e-3);
  EXPECT_DOUBLE_EQ(*RankGemmSeconds(p, c), 3e-3);

  c.dtype = DType::kBF16;  // nothing measured in bf16
  pred = PredictSharedGpu(p, c);
  ASSERT_FALSE(pred.ok());
  EXPECT_EQ(pred.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(std::string(pred.status().message()), "bf16 8x4x8")) << pred.status();
  c.dtype = DType::kF32;
  c.sp = true;  // all_gather + reduce_scatter: not measured
  pred = PredictSharedGpu(p, c);
  ASSERT_FALSE(pred.ok());
  EXPECT_TRUE(Contains(std::string(pred.status().message()), "all_gather of 128 bytes"))
      << pred.status();
}

TEST(TpModelGpuTest, RankParametersByHand) {
  // d 4, ffn 16, t 2: MLP 4*16/2 + 16/2 + 16*4/2 + 4 = 76; attention 4*12/2 + 12/2 + 4*4/2 + 4
  // = 42; block 76 + 42 + 4 * 4 (two LayerNorms) = 134.
  LayerCase c{Layer::kMlp, 2, false, true, 8, 4};
  EXPECT_DOUBLE_EQ(RankParameters(c), 76);
  c.layer = Layer::kAttention;
  EXPECT_DOUBLE_EQ(RankParameters(c), 42);
  c.layer = Layer::kBlock;
  EXPECT_DOUBLE_EQ(RankParameters(c), 134);
}

// MLP fwd+bwd, tokens 8, d 4, f32, no SP, 2 GPUs per node. Every GEMM 1 ms: a rank at t = 2 runs
// 6 of them (6 ms). Intra link alpha 1 us, 1 GB/s; inter alpha 2 us, 0.1 GB/s.
TEST(TpModelGpuTest, MultiNodePredictionByHand) {
  GpuProfile p;
  LayerCase c{Layer::kMlp, 0, false, true, 8, 4};
  c.head_dim = 2;
  LayerCase at2 = c;
  at2.tp = 2;
  for (const GemmShape& g : RankGemms(at2)) p.gemm_s[{DType::kF32, g}] = 1e-3;
  ClusterLinks links;
  links.intra = {1e-6, 1e9};
  links.inter = {2e-6, 1e8};
  links.gpus_per_node = 2;

  absl::StatusOr<MultiNodeRow> r = PredictMultiNode(p, c, 2, links);
  ASSERT_TRUE(r.ok()) << r.status();
  // TP 2 in the node: 6 ms + 2 all_reduces of 128 B, each 1e-6 + 2 * 1/2 * 128 / 1e9.
  EXPECT_DOUBLE_EQ(r->tp_node.compute_s, 6e-3);
  EXPECT_NEAR(r->tp_node.comm_s, 2 * (1e-6 + 128e-9), 1e-15);
  // Gradients: 76 parameters x 4 B = 304 B all_reduced over 2 nodes: 2e-6 + 2 * 1/2 * 304 / 1e8.
  EXPECT_NEAR(r->dp_allreduce_s, 2e-6 + 3.04e-6, 1e-15);
  EXPECT_NEAR(r->tokens_per_s_tp_node, 16 / (6e-3 + 2.256e-6 + 5.04e-6), 1e-6);
  // TP 4 over both nodes: per-rank rate 6144 / 2 FLOPs in 6 ms; 6144 / 4 FLOPs at that rate =
  // 3 ms; 2 all_reduces over 4 on the inter link: 2e-6 + 2 * 3/4 * 128 / 1e8 each.
  EXPECT_NEAR(r->tp_all.compute_s, 3e-3, 1e-15);
  EXPECT_NEAR(r->tp_all.comm_s, 2 * (2e-6 + 1.92e-6), 1e-15);
  EXPECT_NEAR(r->tokens_per_s_tp_all, 8 / (3e-3 + 7.84e-6), 1e-6);

  // One node: no gradient all_reduce across nodes; "all" is the node's own group.
  r = PredictMultiNode(p, c, 1, links);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->dp_allreduce_s, 0);
  EXPECT_NEAR(r->tp_all.total(), r->tp_node.total(), 1e-15);

  EXPECT_EQ(PredictMultiNode(p, c, 0, links).status().code(),
            absl::StatusCode::kInvalidArgument);
  links.gpus_per_node = 4;  // t = 4 GEMMs were not measured
  EXPECT_EQ(PredictMultiNode(p, c, 2, links).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardmap::bench
