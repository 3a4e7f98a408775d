// The Gloo backend's started calls (AllReduceStart, AllGatherStart, ReduceScatterStart on its
// lane, async_lane.h): they proceed before Wait(), give the blocking calls' bits, and a rank
// that fails or leaves while they are in flight fails its peers' started calls at once, with its
// own status where it could send it. Ranks are threads with their own Gloo contexts
// (gloo_threads.h), as in gloo_failure_test.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/communicator.h"
#include "collectives/gloo_communicator.h"
#include "collectives/gloo_threads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

GlooOptions WithTimeout(absl::Duration t) {
  GlooOptions o;
  o.timeout = t;
  return o;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// Opens the lane (its first started call makes the duplicate group, a collective).
absl::Status WarmUp(Communicator& c) {
  int64_t x = 1;
  auto h = c.AllReduceStart(&x, &x, 1, DataType::kI64, ReduceOp::kSum);
  if (!h.ok()) return h.status();
  return (*h)->Wait();
}

TEST(GlooStartedCallsTest, AStartReturnsBeforeItsPeersStartAndMatchesTheBlockingBits) {
  for (int n : {2, 3}) {
    std::atomic<bool> returned{false};
    std::vector<absl::Status> all = RunGlooThreadsEach(n, [&](Communicator& c) -> absl::Status {
      EXPECT_TRUE(c.OverlapsStartedCalls());
      if (absl::Status s = WarmUp(c); !s.ok()) return s;
      // Large enough for the reduce-scatter + all-gather algorithm; odd.
      constexpr size_t kCount = 20001;
      std::vector<float> x(kCount), want(kCount);
      for (size_t i = 0; i < kCount; ++i) x[i] = 1.0f / (3 + c.rank() + i % 7);
      want = x;
      if (absl::Status s = c.AllReduce(want.data(), want.data(), kCount, DataType::kF32,
                                       ReduceOp::kSum); !s.ok()) return s;
      if (c.rank() != 0) {  // only once rank 0's start returned
        const absl::Time end = absl::Now() + absl::Seconds(20);
        while (!returned.load()) {
          if (absl::Now() > end) return absl::InternalError("rank 0's start never returned");
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      auto h = c.AllReduceStart(x.data(), x.data(), kCount, DataType::kF32, ReduceOp::kSum);
      if (!h.ok()) return h.status();
      if (c.rank() == 0) returned.store(true);
      if (absl::Status s = (*h)->Wait(); !s.ok()) return s;
      EXPECT_EQ(0, std::memcmp(x.data(), want.data(), kCount * 4)) << "n=" << n;
      return c.Barrier();
    }, WithTimeout(absl::Seconds(30)));
    for (int r = 0; r < n; ++r) EXPECT_TRUE(all[r].ok()) << "n=" << n << " rank " << r << all[r];
  }
}

TEST(GlooStartedCallsTest, AFailingRanksStatusReachesItsPeersStartedCalls) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> all = RunGlooThreadsEach(4, [](Communicator& c) -> absl::Status {
    if (absl::Status s = WarmUp(c); !s.ok()) return s;
    float f[4] = {};
    if (c.rank() == 2) {  // fails in a blocking call while its peers' started calls wait on it
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return c.Broadcast(f, 4, DataType::kF32, /*root=*/9);
    }
    std::vector<float> x(50000, 1.0f);
    auto h1 = c.AllReduceStart(x.data(), x.data(), 25000, DataType::kF32, ReduceOp::kSum);
    if (!h1.ok()) return h1.status();
    auto h2 = c.ReduceScatterStart(x.data(), x.data() + 40000, 100, DataType::kF32,
                                   ReduceOp::kSum);
    absl::Status w1 = (*h1)->Wait();
    absl::Status w2 = h2.ok() ? (*h2)->Wait() : h2.status();
    EXPECT_FALSE(w2.ok()) << "rank " << c.rank();
    return w1;
  }, WithTimeout(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "far below the 60 s timeout";
  EXPECT_EQ(all[2].code(), absl::StatusCode::kInvalidArgument) << all[2];
  for (int r : {0, 1, 3}) {
    // Rank 2's own code and message, heard from it or from a peer that heard it.
    EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument) << "rank " << r << all[r];
    EXPECT_THAT(Message(all[r]), AllOf(HasSubstr("AllReduce(f32, sum, count=25000)"),
                                       HasSubstr("root 9 is not a rank of this group of 4")))
        << "rank " << r;
  }
}

TEST(GlooStartedCallsTest, ARankThatLeavesFailsItsPeersStartedCallsWithoutAHang) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> all = RunGlooThreadsEach(3, [](Communicator& c) -> absl::Status {
    if (absl::Status s = WarmUp(c); !s.ok()) return s;
    // Rank 1 leaves: its communicator (and its lane's duplicate group) close their
    // connections, as a process that died does.
    if (c.rank() == 1) return absl::InternalError("rank 1 gives up");
    std::vector<float> x(100000, 1.0f);
    auto h = c.AllGatherStart(x.data(), x.data(), 1000, DataType::kF32);
    if (!h.ok()) return h.status();
    return (*h)->Wait();
  }, WithTimeout(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  for (int r : {0, 2}) {
    EXPECT_THAT(all[r].code(),
                AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kAborted)) << all[r];
    EXPECT_THAT(Message(all[r]), AllOf(HasSubstr("AllGather(f32, count=1000)"),
                                       HasSubstr("lost rank 1")))
        << "rank " << r;
  }
}

TEST(GlooStartedCallsTest, AFailureOnTheOwnersThreadEndsItsOwnLanesWaitAtOnce) {
  // Rank 0's started call waits for peers that never start it; rank 0 then fails a blocking
  // call. Closing its connections wakes the peers, not rank 0's own lane: the lane's wait must
  // be aborted too, with rank 0's status, long before the 60 s timeout.
  const absl::Time start = absl::Now();
  std::vector<absl::Status> waited(2);
  std::vector<absl::Status> all = RunGlooThreadsEach(2, [&](Communicator& c) -> absl::Status {
    if (absl::Status s = WarmUp(c); !s.ok()) return s;
    float f[4] = {};
    if (c.rank() == 1) return c.Barrier();  // fails when rank 0 does
    auto h = c.AllReduceStart(f, f, 4, DataType::kF32, ReduceOp::kSum);
    if (!h.ok()) return h.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the lane is waiting now
    absl::Status bad = c.Broadcast(f, 4, DataType::kF32, /*root=*/7);
    waited[0] = (*h)->Wait();
    return bad;
  }, WithTimeout(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(all[0].code(), absl::StatusCode::kInvalidArgument) << all[0];
  EXPECT_EQ(waited[0].code(), absl::StatusCode::kInvalidArgument) << waited[0];
  EXPECT_THAT(Message(waited[0]), AllOf(HasSubstr("AllReduce(f32, sum, count=4)"),
                                        HasSubstr("root 7 is not a rank")));
  EXPECT_EQ(all[1].code(), absl::StatusCode::kInvalidArgument) << all[1];
}

TEST(GlooStartedCallsTest, MismatchedStartedCallsAndUnwaitedHandlesFailEveryRank) {
  std::vector<absl::Status> all = RunGlooThreadsEach(3, [](Communicator& c) -> absl::Status {
    float x[8] = {};
    const size_t count = c.rank() == 0 ? 3 : 4;
    auto h = c.AllReduceStart(x, x, count, DataType::kF32, ReduceOp::kSum);
    if (!h.ok()) return h.status();
    return (*h)->Wait();
  }, WithTimeout(absl::Seconds(30)));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(all[r].code(), absl::StatusCode::kInvalidArgument) << all[r];
    EXPECT_THAT(Message(all[r]), AllOf(HasSubstr("count=3"), HasSubstr("count=4")));
  }
  const absl::Time start = absl::Now();
  all = RunGlooThreadsEach(2, [](Communicator& c) -> absl::Status {
    if (absl::Status s = WarmUp(c); !s.ok()) return s;
    std::vector<float> x(1000, 1.0f);
    if (c.rank() == 0) {
      auto dropped = c.AllReduceStart(x.data(), x.data(), x.size(), DataType::kF32,
                                      ReduceOp::kSum);
      return dropped.ok() ? absl::OkStatus() : dropped.status();  // never waited
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto h = c.AllReduceStart(x.data(), x.data(), x.size(), DataType::kF32, ReduceOp::kSum);
    if (!h.ok()) return h.status();
    return (*h)->Wait();
  }, WithTimeout(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(all[1].code(), absl::StatusCode::kFailedPrecondition) << all[1];
  EXPECT_THAT(Message(all[1]), AllOf(HasSubstr("rank 0 (world rank 0) failed"), HasSubstr("never waited")));
}

}  // namespace
}  // namespace shardmap::collectives
