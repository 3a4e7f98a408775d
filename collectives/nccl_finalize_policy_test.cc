#include "collectives/nccl_finalize_policy.h"

#include "gtest/gtest.h"

namespace shardmap {
namespace {

FinalizeState At(absl::Duration waited, std::optional<absl::Duration> failing_for = std::nullopt) {
  FinalizeState s;
  s.waited = waited;
  s.timeout = absl::Minutes(5);
  s.failing_for = failing_for;
  return s;
}

TEST(NccFinalizePolicyTest, AHealthyJobWaitsUpToTheTimeout) {
  EXPECT_EQ(DecideFinalize(At(absl::Seconds(1))), FinalizeAction::kWait);
  EXPECT_EQ(DecideFinalize(At(absl::Minutes(4))), FinalizeAction::kWait);
  EXPECT_EQ(DecideFinalize(At(absl::Minutes(5))), FinalizeAction::kAbort);
}

TEST(NccFinalizePolicyTest, AFailingJobAbortsAfterTheGracePeriod) {
  // Known failing for less than the grace: finalize may still finish.
  EXPECT_EQ(DecideFinalize(At(absl::Seconds(10), absl::Seconds(1))), FinalizeAction::kWait);
  // Known for the grace period: abort, minutes before the timeout.
  EXPECT_EQ(DecideFinalize(At(absl::Seconds(10), kFinalizeGraceWhenFailing)),
            FinalizeAction::kAbort);
  EXPECT_LT(kFinalizeGraceWhenFailing, absl::Seconds(10));
  // The failure became known just now, long after finalize began: still the grace.
  EXPECT_EQ(DecideFinalize(At(absl::Minutes(2), absl::ZeroDuration())), FinalizeAction::kWait);
}

TEST(NccFinalizePolicyTest, DoneOrFailedEndsTheWait) {
  FinalizeState s = At(absl::Seconds(1), absl::Minutes(1));
  s.finished = true;  // finished wins over failing: destroy cleanly
  EXPECT_EQ(DecideFinalize(s), FinalizeAction::kDestroy);
  s.finished = false;
  s.error = true;
  EXPECT_EQ(DecideFinalize(s), FinalizeAction::kAbort);
}

}  // namespace
}  // namespace shardmap
