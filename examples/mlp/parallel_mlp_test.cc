// The demo's training loop (examples/mlp/parallel_mlp.h) on several dp x tp meshes, including
// non-power-of-two ones, equals the unsharded loop (plain tensor ops, hand-written backward):
// per-step losses and final weights; and issues one all_reduce over tp each way per step
// (checked with the public testing library, spmd_testing).
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "examples/mlp/parallel_mlp.h"
#include "examples/mlp/params_near.h"
#include "shardmap/mesh.h"
#include "spmd_testing/collectives.h"

namespace shardmap {
namespace {

TEST(ParallelMlpTest, ShardedTrainingMatchesUnsharded) {
  for (auto [dp, tp] : std::vector<std::pair<int, int>>{{2, 4}, {3, 1}, {1, 3}, {3, 2}}) {
    SCOPED_TRACE(absl::StrCat("dp=", dp, " tp=", tp));
    Mesh mesh = *Mesh::Create({{"dp", dp}, {"tp", tp}});
    MlpConfig cfg;
    cfg.batch = 4 * dp;
    cfg.d_model = 6;
    cfg.d_hidden = 4 * tp;
    MlpParams sharded = InitMlp(cfg), reference = sharded;
    MlpBatch batch = SyntheticBatch(cfg);
    double first = 0, last = 0;
    for (int step = 0; step < 3; ++step) {
      absl::StatusOr<ShardedStep> s = ShardedTrainStep(mesh, sharded, batch);
      ASSERT_TRUE(s.ok()) << s.status();
      ReferenceStep r = ReferenceTrainStep(reference, batch);
      EXPECT_NEAR(s->loss, r.loss, 1e-5 * std::max(1.0, std::fabs(r.loss))) << "step " << step;
      EXPECT_TRUE(testing::ParamsNear(s->grads, r.grads, 1e-5)) << "step " << step;
      // This rank's [4, d_model] f32 rows each way (the dp gradient sums are on the host).
      const int64_t rows_bytes = 4 * cfg.d_model * 4;
      spmd_testing::ExpectCollectives(mesh, s->log,
                                      {spmd_testing::AllReduce("tp").Bytes(rows_bytes)},
                                      {spmd_testing::AllReduce("tp").Bytes(rows_bytes)});
      EXPECT_EQ(SummarizeCollectives(mesh, s->log),
                "fwd: all_reduce(tp) x1 | bwd: all_reduce(tp) x1");
      if (step == 0) first = s->loss;
      last = s->loss;
      SgdUpdate(sharded, s->grads, 0.5);
      SgdUpdate(reference, r.grads, 0.5);
    }
    EXPECT_LT(last, first);
    EXPECT_TRUE(testing::ParamsNear(sharded, reference, 1e-5));
  }
}

TEST(ParallelMlpTest, TraceRecordsSpmdTypesOnRankZero) {
  Mesh mesh = *Mesh::Create({{"dp", 2}, {"tp", 2}});
  MlpConfig cfg;
  cfg.batch = 4;
  cfg.d_model = 3;
  cfg.d_hidden = 4;
  MlpTrace trace;
  absl::StatusOr<ShardedStep> s = ShardedTrainStep(mesh, InitMlp(cfg), SyntheticBatch(cfg),
                                                   &trace);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(trace.types.size(), 6u);
  EXPECT_EQ(trace.types[0].second, "f32[2,3]{dp:S0,tp:R}");       // x
  EXPECT_EQ(trace.types[1].second, "f32[2,2]{dp:S0,tp:S1}");      // h
  EXPECT_EQ(trace.types[3].second.find("tp:P") != std::string::npos, true)
      << trace.types[3].second;                                      // yp
  EXPECT_EQ(trace.types[5].second.find("dp:P") != std::string::npos, true)
      << trace.types[5].second;                                      // loss
}

}  // namespace
}  // namespace shardmap
