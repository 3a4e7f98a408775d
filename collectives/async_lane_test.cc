// AsyncLane through the in-process backend's started calls (AllReduceStart, AllGatherStart,
// ReduceScatterStart): calls that proceed before Wait(), results equal to the blocking calls,
// several in flight interleaved with blocking calls, and every misuse and failure reported on
// every rank without a hang. The same calls on every backend: collectives/conformance/.
#include "collectives/async_lane.h"

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
#include "collectives/in_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

InProcessOptions Options(absl::Duration timeout = absl::Seconds(30)) {
  InProcessOptions o;
  o.timeout = timeout;
  return o;
}

std::vector<double> Input(int r, size_t count, double offset = 0) {
  std::vector<double> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = offset + 1.0 / (3 + r) + 0.25 * i;
  return x;
}

// Waits (bounded) until `pred` holds; false on the bound.
template <typename P>
bool WaitFor(P pred, absl::Duration bound = absl::Seconds(20)) {
  const absl::Time end = absl::Now() + bound;
  while (!pred()) {
    if (absl::Now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(AsyncLaneTest, AStartedCallReturnsBeforeItsPeersHaveStarted) {
  // Rank 1 starts only once rank 0's start returned: a start that waited for its peers (the
  // blocking default) would never return, and rank 1 would give up below. The first started
  // call opens the lane (a Split, which does wait for every rank): one call warms it up.
  for (int n : {2, 3, 5}) {
    std::atomic<int> returned{0};
    absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
      EXPECT_TRUE(c.OverlapsStartedCalls());
      int64_t warm = 1;
      auto first = c.AllReduceStart(&warm, &warm, 1, DataType::kI64, ReduceOp::kSum);
      if (!first.ok()) return first.status();
      if (absl::Status w = (*first)->Wait(); !w.ok()) return w;
      std::vector<double> x = Input(c.rank(), 9), want(9, 0.0);
      for (int r = 0; r < n; ++r) {
        const std::vector<double> xr = Input(r, 9);
        for (int i = 0; i < 9; ++i) want[i] += xr[i];
      }
      if (c.rank() != 0 && !WaitFor([&] { return returned.load() == 1; })) {
        return absl::InternalError("rank 0's AllReduceStart did not return before its peers");
      }
      absl::StatusOr<std::unique_ptr<PendingCollective>> h =
          c.AllReduceStart(x.data(), x.data(), x.size(), DataType::kF64, ReduceOp::kSum);
      if (!h.ok()) return h.status();
      if (c.rank() == 0) returned.store(1);
      if (absl::Status w = (*h)->Wait(); !w.ok()) return w;
      EXPECT_EQ(x, want) << "n=" << n << " rank " << c.rank();
      return absl::OkStatus();
    }, Options());
    EXPECT_TRUE(s.ok()) << "n=" << n << ": " << s;
  }
}

TEST(AsyncLaneTest, SeveralInFlightInterleavedWithBlockingCallsEqualTheBlockingResults) {
  for (int n : {1, 3, 5}) {
    absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
      const int me = c.rank();
      constexpr size_t kOdd = 13;
      // The blocking results first.
      std::vector<double> ar_want = Input(me, kOdd), ag_want(kOdd * n),
                          rs_in = Input(me, kOdd * n, 7), rs_want(kOdd);
      const std::vector<double> ag_in = Input(me, kOdd, 3);
      if (absl::Status b = c.AllReduce(ar_want.data(), ar_want.data(), kOdd, DataType::kF64,
                                       ReduceOp::kSum); !b.ok()) return b;
      if (absl::Status b = c.AllGather(ag_in.data(), ag_want.data(), kOdd, DataType::kF64);
          !b.ok()) return b;
      if (absl::Status b = c.ReduceScatter(rs_in.data(), rs_want.data(), kOdd, DataType::kF64,
                                           ReduceOp::kMax); !b.ok()) return b;
      // The same three started, a blocking call between, waited in reverse order.
      std::vector<double> ar = Input(me, kOdd), ag(kOdd * n, -1), rs(kOdd, -1);
      auto h1 = c.AllReduceStart(ar.data(), ar.data(), kOdd, DataType::kF64, ReduceOp::kSum);
      if (!h1.ok()) return h1.status();
      auto h2 = c.AllGatherStart(ag_in.data(), ag.data(), kOdd, DataType::kF64);
      if (!h2.ok()) return h2.status();
      int64_t one = 1;
      if (absl::Status b = c.AllReduce(&one, &one, 1, DataType::kI64, ReduceOp::kSum); !b.ok()) {
        return b;
      }
      EXPECT_EQ(one, n);
      auto h3 = c.ReduceScatterStart(rs_in.data(), rs.data(), kOdd, DataType::kF64,
                                     ReduceOp::kMax);
      if (!h3.ok()) return h3.status();
      for (auto* h : {&*h3, &*h2, &*h1}) {
        if (absl::Status w = (*h)->Wait(); !w.ok()) return w;
      }
      EXPECT_EQ(0, std::memcmp(ar.data(), ar_want.data(), kOdd * 8)) << "n=" << n;
      EXPECT_EQ(ag, ag_want) << "n=" << n;
      EXPECT_EQ(0, std::memcmp(rs.data(), rs_want.data(), kOdd * 8)) << "n=" << n;
      return c.Barrier();
    }, Options());
    EXPECT_TRUE(s.ok()) << "n=" << n << ": " << s;
  }
}

TEST(AsyncLaneTest, WaitingTwiceIsRefused) {
  absl::Status s = RunInProcess(2, [](Communicator& c) -> absl::Status {
    double x = 1;
    auto h = c.AllReduceStart(&x, &x, 1, DataType::kF64, ReduceOp::kSum);
    if (!h.ok()) return h.status();
    if (absl::Status w = (*h)->Wait(); !w.ok()) return w;
    absl::Status again = (*h)->Wait();
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    EXPECT_THAT(std::string(again.message()), HasSubstr("Wait() called twice"));
    EXPECT_EQ(x, 2);
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(AsyncLaneTest, AHandleDroppedUnwaitedFailsTheWorldAtOnce) {
  const absl::Time start = absl::Now();
  std::vector<double> buffer_after(3, 0);
  absl::Status s = RunInProcess(3, [&](Communicator& c) -> absl::Status {
    std::vector<double> x(1000, 1.0);
    if (c.rank() == 1) {
      // Rank 1 drops its handle: the destructor reports it, then waits for the call to end.
      { auto h = c.AllReduceStart(x.data(), x.data(), x.size(), DataType::kF64, ReduceOp::kSum);
        if (!h.ok()) return h.status(); }
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto h = c.AllReduceStart(x.data(), x.data(), x.size(), DataType::kF64, ReduceOp::kSum);
    if (!h.ok()) return h.status();
    return (*h)->Wait();
  }, Options(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "the misuse must not wait out the timeout";
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("AllReduceStart(f64, sum, count=1000)"),
                                              HasSubstr("never waited")));
}

TEST(AsyncLaneTest, MismatchedStartedCallsFailEveryRankNamingBothTags) {
  // The tags set before the first start (which opens the lane with a Split) must reach the
  // started call, not the Split: rank 2's differs.
  static auto describe = [](const uint64_t* w) { return absl::StrCat("tagged call #", w[0]); };
  std::vector<absl::Status> statuses(3);
  absl::Status s = RunInProcess(3, [&](Communicator& c) -> absl::Status {
    CallTag tag;
    tag.words[0] = c.rank() == 2 ? 8 : 7;
    tag.describe = +describe;
    c.TagNextCall(tag);
    float x = 1;
    auto h = c.AllReduceStart(&x, &x, 1, DataType::kF32, ReduceOp::kSum);
    statuses[c.rank()] = h.ok() ? (*h)->Wait() : h.status();
    return statuses[c.rank()];
  }, Options());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kInvalidArgument) << r << ": " << statuses[r];
    EXPECT_THAT(std::string(statuses[r].message()),
                AllOf(HasSubstr("tagged call #7"), HasSubstr("tagged call #8")))
        << "rank " << r;
  }
}

TEST(AsyncLaneTest, AFailureFailsLaterStartedCallsWithItsCode) {
  std::vector<absl::Status> later(3);
  absl::Status s = RunInProcess(3, [&](Communicator& c) -> absl::Status {
    std::vector<float> x(8, 1.0f);
    const size_t count = c.rank() == 1 ? 5 : 4;  // rank 1 disagrees
    auto h = c.AllReduceStart(x.data(), x.data(), count, DataType::kF32, ReduceOp::kSum);
    absl::Status first = h.ok() ? (*h)->Wait() : h.status();
    auto h2 = c.AllGatherStart(x.data(), x.data(), 1, DataType::kF32);
    later[c.rank()] = h2.ok() ? (*h2)->Wait() : h2.status();
    return first;
  }, Options());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(later[r].code(), absl::StatusCode::kInvalidArgument) << later[r];
    EXPECT_THAT(std::string(later[r].message()),
                AllOf(HasSubstr("AllGatherStart(f32, count=1)"), HasSubstr("refused")))
        << later[r];
  }
}

TEST(AsyncLaneTest, AFailingRankFailsItsPeersStartedCallsWithItsStatus) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> all(4);
  absl::Status s = RunInProcess(4, [&](Communicator& c) -> absl::Status {
    std::vector<double> x(4096, 1.0);
    if (c.rank() == 3) return absl::UnavailableError("rank 3's disk is on fire");
    auto h1 = c.AllReduceStart(x.data(), x.data(), 2048, DataType::kF64, ReduceOp::kSum);
    if (!h1.ok()) return all[c.rank()] = h1.status();
    auto h2 = c.AllReduceStart(x.data() + 2048, x.data() + 2048, 2048, DataType::kF64,
                               ReduceOp::kSum);
    absl::Status w1 = (*h1)->Wait();
    absl::Status w2 = h2.ok() ? (*h2)->Wait() : h2.status();
    all[c.rank()] = w1.ok() ? w2 : w1;
    return all[c.rank()];
  }, Options(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(all[r].code(), absl::StatusCode::kUnavailable) << all[r];
    EXPECT_THAT(std::string(all[r].message()), HasSubstr("disk is on fire")) << all[r];
  }
}

}  // namespace
}  // namespace shardmap::collectives
