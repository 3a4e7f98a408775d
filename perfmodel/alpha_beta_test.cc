// The least-squares alpha-beta fit (a known line recovered, its errors) and the fitted cost.
#include "perfmodel/alpha_beta.h"

#include <stdexcept>
#include <string>

#include "gtest/gtest.h"

namespace shardmap::perfmodel {
namespace {

TEST(AlphaBetaTest, FitRecoversALine) {
  AlphaBeta ab = FitAlphaBeta({1e3, 1e4, 1e5}, {2e-6 + 1e3 * 3e-9, 2e-6 + 1e4 * 3e-9,
                                                2e-6 + 1e5 * 3e-9});
  EXPECT_NEAR(ab.alpha_s, 2e-6, 1e-15);
  EXPECT_NEAR(ab.seconds_per_byte, 3e-9, 1e-18);
}

// Noisy points symmetric about a line: the fit is that line (residuals +e, -2e, +e at
// equally spaced x sum to zero and are uncorrelated with x).
TEST(AlphaBetaTest, FitOfSymmetricNoiseIsTheLine) {
  const double e = 1e-7;
  AlphaBeta ab = FitAlphaBeta({1, 2, 3}, {1 + 2 + e, 1 + 4 - 2 * e, 1 + 6 + e});
  EXPECT_NEAR(ab.alpha_s, 1, 1e-12);
  EXPECT_NEAR(ab.seconds_per_byte, 2, 1e-12);
}

TEST(AlphaBetaTest, FitRefusesTooFewOrMismatchedOrEqualSizes) {
  EXPECT_THROW(FitAlphaBeta({1, 1}, {1, 2}), std::invalid_argument);
  EXPECT_THROW(FitAlphaBeta({1}, {1}), std::invalid_argument);
  EXPECT_THROW(FitAlphaBeta({}, {}), std::invalid_argument);
  EXPECT_THROW(FitAlphaBeta({1, 2, 3}, {1, 2}), std::invalid_argument);
  try {
    FitAlphaBeta({5, 5, 5}, {1, 2, 3});
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("all sizes are the same"), std::string::npos);
  }
}

TEST(AlphaBetaTest, FittedCostReadsTheTable) {
  const AlphaBeta ab{/*alpha_s=*/2e-6, /*seconds_per_byte=*/3e-9};
  CollectiveCost cost = FittedCost({{{CollectiveKind::kAllReduce, 2}, ab},
                                    {{CollectiveKind::kAllGather, 3}, {1e-5, 0}}});
  EXPECT_NEAR(cost(CollectiveKind::kAllReduce, 2, 1e4), 2e-6 + 3e-5, 1e-15);
  EXPECT_DOUBLE_EQ(cost(CollectiveKind::kAllGather, 3, 1e9), 1e-5);
  try {
    cost(CollectiveKind::kAllGather, 2, 1e4);
    ADD_FAILURE() << "no exception";
  } catch (const std::out_of_range& err) {
    EXPECT_NE(std::string(err.what()).find("no fit for all_gather over 2 ranks"),
              std::string::npos)
        << err.what();
  }
}

}  // namespace
}  // namespace shardmap::perfmodel
