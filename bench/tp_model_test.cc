// The TP model: hand-computed predictions, and LayerCollectives against the collectives the
// layers really issue (tiny f32 layers on 2 and 3 simulated devices). The ring cost and the
// alpha-beta fit are tested in perfmodel/.
#include "bench/tp_model.h"

#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardmap::bench {
namespace {

TEST(TpModelTest, MlpPredictionByHand) {
  // MLP, tokens 4, d 2 (ffn 8), fwd+bwd, no SP, t = 2, f32:
  // flops = 3 * (2*4*2*8 + 2*4*8*2) = 768; compute = 768 / 2 / 96 = 4 s.
  // collectives: forward all_reduce of [4, 2] f32 (32 B) + its transpose in the backward,
  // each 1 + 2 * 1/2 * 32 / 16 = 3 s -> comm 6 s.
  LayerCase c{Layer::kMlp, 2, false, true, 4, 2};
  c.head_dim = 1;
  Prediction p = Predict(c, 96, 4, RingCost({1, 16}));
  EXPECT_DOUBLE_EQ(p.compute_s, 4);
  EXPECT_DOUBLE_EQ(p.comm_s, 6);
  EXPECT_DOUBLE_EQ(p.total(), 10);
  // With SP: all_gather + reduce_scatter forward, all_gather + reduce_scatter backward, each
  // 1 + 1/2 * 32 / 16 = 2 s.
  c.sp = true;
  EXPECT_DOUBLE_EQ(Predict(c, 96, 4, RingCost({1, 16})).comm_s, 8);
  EXPECT_DOUBLE_EQ(Efficiency(8, 5, 2), 0.8);
}

TEST(TpModelTest, AttentionFlopsByHand) {
  // tokens 8, d 4, seq 4: qkv 2*8*4*12 = 768, scores + pv 2 * 2*8*4*4 = 512, proj 2*8*4*4 = 256.
  LayerCase c{Layer::kAttention, 1, false, false, 8, 4};
  c.head_dim = 2;
  c.seq_len = 4;
  EXPECT_DOUBLE_EQ(LayerFlops(c), 1536);
  c.fwd_bwd = true;
  EXPECT_DOUBLE_EQ(LayerFlops(c), 3 * 1536);
  // 2 sequences x 2 heads x 4 x 4 scores.
  EXPECT_DOUBLE_EQ(AttentionScoreElements(c), 64);
  // The score einsums are 512 of the 1536 forward FLOPs; at their own rate (64 FLOP/s against
  // 256 for the rest, t = 1, no collectives): (3 * 1024) / 256 + (3 * 512) / 64 = 36 s.
  EXPECT_DOUBLE_EQ(AttentionEinsumFlops(c), 3 * 512);
  EXPECT_DOUBLE_EQ(Predict(c, 256, 64, 4, RingCost({1, 16})).compute_s, 36);
  EXPECT_DOUBLE_EQ(Predict(c, 256, 0, 4, RingCost({1, 16})).compute_s, 3 * 1536 / 256.0);
  c.tp = 2;  // both parts split over t
  EXPECT_DOUBLE_EQ(Predict(c, 256, 64, 4, RingCost({1, 16})).compute_s, 18);
  c.layer = Layer::kMlp;
  EXPECT_DOUBLE_EQ(AttentionScoreElements(c), 0);
  EXPECT_DOUBLE_EQ(AttentionEinsumFlops(c), 0);
}

// LayerCollectives must list what each layer really issues: per op, the calls and the bytes the
// rank passed (measured by the timing communicator on a real run).
TEST(TpModelTest, CollectivesMatchWhatTheLayersIssue) {
  for (Layer layer :
       {Layer::kColumn, Layer::kRow, Layer::kMlp, Layer::kAttention, Layer::kBlock}) {
    for (int tp : {2, 3}) {
      for (bool sp : {false, true}) {
        for (bool fwd_bwd : {false, true}) {
          LayerCase c{layer, tp, sp, fwd_bwd, /*tokens=*/12, /*d=*/4 * tp};
          c.head_dim = tp == 2 ? 4 : 2;  // 1 head per rank at tp 2, 2 at tp 3
          c.seq_len = 6;
          SCOPED_TRACE(c.Name());
          absl::StatusOr<LayerTiming> t = RunLayer(c, 0, 1);
          ASSERT_TRUE(t.ok()) << t.status();
          std::map<std::string, OpStats> want;
          for (const CollectiveCall& call : LayerCollectives(c, 4)) {
            OpStats& o = want[CollectiveName(call.kind)];
            o.calls += 1;
            o.bytes += RankBytes(call, tp);
          }
          std::string got;
          for (const auto& [op, o] : t->comm.by_op) absl::StrAppend(&got, op, " x", o.calls, " ", o.bytes, "B; ");
          EXPECT_EQ(t->comm.by_op.size(), want.size()) << got;
          if (t->comm.by_op.size() != want.size()) continue;
          for (const auto& [op, w] : want) {
            ASSERT_EQ(t->comm.by_op.count(op), 1u) << op;
            EXPECT_EQ(t->comm.by_op.at(op).calls, w.calls) << op;
            EXPECT_EQ(t->comm.by_op.at(op).bytes, w.bytes) << op;
          }
        }
      }
    }
  }
}

TEST(TpModelTest, BadLayerCaseIsAnError) {
  LayerCase c{Layer::kAttention, 2, false, false, 12, 10};
  c.head_dim = 4;  // 10 is no multiple of 4
  absl::StatusOr<LayerTiming> t = RunLayer(c, 0, 1);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(std::string(t.status().message()).find("multiple of head_dim"), std::string::npos);
}

}  // namespace
}  // namespace shardmap::bench
