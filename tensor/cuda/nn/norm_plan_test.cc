// The register-resident norm kernels' plan (norm_plan.h), replayed on the host: every element of
// a row is owned by exactly one (thread, vector), no thread holds more than 32 elements, the
// limits and the backward's group count.
#include <vector>

#include "gtest/gtest.h"
#include "tensor/cuda/nn/norm_plan.h"

namespace shardmap::cuda::nn_kernels {
namespace {

TEST(NormPlanTest, EveryElementOfARowHasOneOwner) {
  for (int bytes : {4, 2}) {
    const int v = 16 / bytes;
    for (int64_t h = v; h <= 8192; h += (h < 512 ? v : 37 * v)) {
      const VecNormPlan p = PlanVecNorm(h, bytes);
      ASSERT_TRUE(p.ok) << "h " << h << " bytes " << bytes;
      EXPECT_LE(p.vecs * v, p.tpr == 512 ? kVecNormMaxElems / 2 : kVecNormMaxElems);
      EXPECT_EQ(p.threads % p.tpr, 0);
      EXPECT_EQ(p.rows_per_block * p.tpr, p.threads);
      std::vector<int> owners(h, 0);
      for (int lane = 0; lane < p.tpr; ++lane) {
        for (int i = 0; i < p.vecs; ++i) {
          const int64_t j = (static_cast<int64_t>(i) * p.tpr + lane) * v;
          if (j >= h) continue;  // the kernel's guard
          for (int e = 0; e < v; ++e) ++owners[j + e];
        }
      }
      for (int64_t j = 0; j < h; ++j) ASSERT_EQ(owners[j], 1) << "h " << h << " element " << j;
    }
  }
}

TEST(NormPlanTest, PicksTheSmallestGroupThatFits) {
  EXPECT_EQ(PlanVecNorm(768, 4).tpr, 32);     // GPT-2 small, f32: a warp, 6 vectors -> 8
  EXPECT_EQ(PlanVecNorm(768, 4).vecs, 8);
  EXPECT_EQ(PlanVecNorm(1024, 4).tpr, 32);
  EXPECT_EQ(PlanVecNorm(4096, 4).tpr, 128);   // 8 vectors of 4
  EXPECT_EQ(PlanVecNorm(4096, 2).tpr, 128);   // 4 vectors of 8
  EXPECT_EQ(PlanVecNorm(4096, 2).vecs, 4);
  EXPECT_EQ(PlanVecNorm(8192, 4).tpr, 512);     // 4 vectors of 4
  EXPECT_EQ(PlanVecNorm(8192, 2).vecs, 2);
  EXPECT_EQ(PlanVecNorm(8192, 4).rows_per_block, 1);
  EXPECT_EQ(PlanVecNorm(64, 4).rows_per_block, 4);
}

TEST(NormPlanTest, RefusesWhatTheGeneralKernelsDo) {
  EXPECT_FALSE(PlanVecNorm(0, 4).ok);
  EXPECT_FALSE(PlanVecNorm(6, 4).ok);      // not a multiple of 4 floats
  EXPECT_FALSE(PlanVecNorm(12, 2).ok);     // not a multiple of 8 halves
  EXPECT_FALSE(PlanVecNorm(8196, 4).ok);   // more than 512 threads x 16
  EXPECT_FALSE(PlanVecNorm(16384, 2).ok);
  EXPECT_FALSE(PlanVecNorm(64, 8).ok);     // f64
}

TEST(NormPlanTest, BackwardGroupsAreCappedAndCoverTheRows) {
  const VecNormPlan p = PlanVecNorm(4096, 2);
  EXPECT_EQ(VecNormBackwardBlocks(p, 16384, 4096), 1024);
  EXPECT_EQ(VecNormBackwardBlocks(p, 5, 4096), 5);
  EXPECT_EQ(VecNormBackwardBlocks(p, 0, 4096), 1);
  const VecNormPlan w = PlanVecNorm(8192, 4);
  EXPECT_EQ(VecNormBackwardBlocks(w, 100000, 8192), 1024);  // 64 MiB of partial rows
  const VecNormPlan s = PlanVecNorm(256, 4);  // 4 rows per block
  EXPECT_EQ(VecNormBackwardBlocks(s, 100000, 256) * s.rows_per_block, 1024);
  EXPECT_EQ(VecNormBlocks(s, 9), 3);
}

}  // namespace
}  // namespace shardmap::cuda::nn_kernels
