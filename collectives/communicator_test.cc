// ValidatePpermutePairs (the one pair check every backend runs) and ForwardingCommunicator (the
// decorators' base): a decorator that overrides one call forwards the rest unchanged.
#include "collectives/communicator.h"

#include <utility>
#include <vector>

#include "collectives/forwarding_communicator.h"
#include "collectives/in_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::HasSubstr;
using Pairs = std::vector<std::pair<int, int>>;

TEST(ValidatePpermutePairsTest, PeersOfEachRank) {
  const Pairs shift = {{0, 1}, {1, 2}, {2, 0}};
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<PpermutePeers> p = ValidatePpermutePairs(shift, 3, r);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->source, (r + 2) % 3);
    EXPECT_EQ(p->dest, (r + 1) % 3);
  }
  // Rank 0 receives nothing and rank 2 sends nothing in a non-cyclic shift.
  absl::StatusOr<PpermutePeers> p0 = ValidatePpermutePairs(Pairs{{0, 1}, {1, 2}}, 3, 0);
  ASSERT_TRUE(p0.ok());
  EXPECT_EQ(p0->source, -1);
  EXPECT_EQ(p0->dest, 1);
  absl::StatusOr<PpermutePeers> p2 = ValidatePpermutePairs(Pairs{{0, 1}, {1, 2}}, 3, 2);
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(p2->source, 1);
  EXPECT_EQ(p2->dest, -1);
}

TEST(ValidatePpermutePairsTest, RefusesOutOfRangeAndRepeatedRanks) {
  struct Bad {
    Pairs pairs;
    const char* message;
  };
  const std::vector<Bad> cases = {
      {{{0, 4}}, "pair (0, 4) names a rank outside [0, 4)"},
      {{{-1, 0}}, "pair (-1, 0) names a rank outside [0, 4)"},
      {{{0, 1}, {0, 2}}, "pair (0, 2) repeats a source: rank 0 appears twice as a source"},
      {{{0, 2}, {1, 2}}, "pair (1, 2) repeats a destination: rank 2 appears twice as a "
                         "destination"},
  };
  for (const Bad& bad : cases) {
    absl::StatusOr<PpermutePeers> p = ValidatePpermutePairs(bad.pairs, 4, 0);
    ASSERT_FALSE(p.ok()) << bad.message;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(bad.message));
  }
}

// Counts barriers and forwards everything else through the base.
class CountingBarriers : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  absl::Status Barrier() override {
    ++barriers;
    return inner()->Barrier();
  }
  int barriers = 0;
};

TEST(ForwardingCommunicatorTest, ForwardsEveryCallItDoesNotOverride) {
  absl::Status s = RunInProcess(3, [](Communicator& world) -> absl::Status {
    CountingBarriers c(&world);
    if (c.rank() != world.rank() || c.size() != 3 || c.name() != world.name()) {
      return absl::InternalError("rank/size/name not forwarded");
    }
    std::vector<double> x = {1.0 + c.rank(), 10.0 * c.rank()};
    if (absl::Status st = c.AllReduce(x.data(), x.data(), 2, DataType::kF64, ReduceOp::kSum);
        !st.ok()) {
      return st;
    }
    if (x != std::vector<double>{6.0, 30.0}) return absl::InternalError("all_reduce wrong");
    double got = -1, mine = c.rank();
    const Pairs shift = {{0, 1}, {1, 2}, {2, 0}};
    if (absl::Status st = c.Ppermute(&mine, &got, 1, DataType::kF64, shift); !st.ok()) return st;
    if (got != (c.rank() + 2) % 3) return absl::InternalError("ppermute wrong");
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ForwardingCommunicatorTest, InnerRefusalComesBackUnchanged) {
  absl::Status s = RunInProcess(3, [](Communicator& world) -> absl::Status {
    CountingBarriers c(&world);
    double x = 1, y = 0;
    return c.Ppermute(&x, &y, 1, DataType::kF64, Pairs{{0, 1}, {0, 2}});
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 appears twice as a source")) << s;
}

TEST(ForwardingCommunicatorTest, OverriddenCallIsTheDecorators) {
  absl::Status s = RunInProcess(2, [](Communicator& world) -> absl::Status {
    CountingBarriers c(&world);
    for (int i = 0; i < 3; ++i) {
      if (absl::Status st = c.Barrier(); !st.ok()) return st;
    }
    return c.barriers == 3 ? absl::OkStatus() : absl::InternalError("barrier not counted");
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace shardmap::collectives
