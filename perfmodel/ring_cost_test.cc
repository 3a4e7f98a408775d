// The ring alpha-beta cost against hand-computed values, and the collectives' names.
#include "perfmodel/ring_cost.h"

#include <string>

#include "gtest/gtest.h"

namespace shardmap::perfmodel {
namespace {

TEST(RingCostTest, ByHand) {
  CollectiveCost cost = RingCost({/*alpha_s=*/1e-5, /*busbw=*/1e9});
  // all_reduce of 1 MB over 4: 1e-5 + 2 * 3/4 * 1e6 / 1e9 = 1.51e-3 s.
  EXPECT_NEAR(cost(CollectiveKind::kAllReduce, 4, 1e6), 1.51e-3, 1e-12);
  // all_gather of 1 MB over 2: 1e-5 + 1/2 * 1e-3 = 5.1e-4 s.
  EXPECT_NEAR(cost(CollectiveKind::kAllGather, 2, 1e6), 5.1e-4, 1e-12);
  // reduce_scatter of 8 MB over 8: 1e-5 + 7/8 * 8e-3 = 1e-5 + 7e-3 s.
  EXPECT_NEAR(cost(CollectiveKind::kReduceScatter, 8, 8e6), 1e-5 + 7e-3, 1e-12);
  // Odd group: all_reduce of 3 MB over 3: 1e-5 + 2 * 2/3 * 3e-3 = 1e-5 + 4e-3 s.
  EXPECT_NEAR(cost(CollectiveKind::kAllReduce, 3, 3e6), 1e-5 + 4e-3, 1e-12);
  // One rank moves nothing, not even the latency.
  EXPECT_EQ(cost(CollectiveKind::kAllReduce, 1, 1e6), 0.0);
  EXPECT_EQ(cost(CollectiveKind::kAllGather, 0, 1e6), 0.0);
}

TEST(RingCostTest, Names) {
  EXPECT_EQ(std::string(CollectiveName(CollectiveKind::kAllReduce)), "all_reduce");
  EXPECT_EQ(std::string(CollectiveName(CollectiveKind::kAllGather)), "all_gather");
  EXPECT_EQ(std::string(CollectiveName(CollectiveKind::kReduceScatter)), "reduce_scatter");
  EXPECT_EQ(std::string(CollectiveName(static_cast<CollectiveKind>(99))), "?");
}

}  // namespace
}  // namespace shardmap::perfmodel
