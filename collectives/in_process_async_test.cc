// Communicator::PpermuteStart: the in-process backend's non-blocking ppermute (values against a
// per-rank reference, transfers that complete while a partner computes, several calls in flight,
// every error path failing every rank without a hang) and the default (blocking) implementation.
#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "collectives/communicator.h"
#include "collectives/in_process.h"
#include "collectives/in_process_async.h"
#include "collectives/self_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::HasSubstr;

InProcessOptions Options(absl::Duration timeout = absl::Seconds(30)) {
  InProcessOptions o;
  o.timeout = timeout;
  return o;
}

using Pairs = std::vector<std::pair<int, int>>;

Pairs Ring(int n, int shift) {
  Pairs p;
  for (int i = 0; i < n; ++i) p.push_back({i, (i + shift) % n});
  return p;
}

// What rank r holds after a ppermute of x_s = {100 s + i} under `pairs`: its source's x, or 0.
std::vector<double> Expected(int r, const Pairs& pairs, size_t count) {
  std::vector<double> y(count, 0.0);
  for (auto [s, t] : pairs) {
    if (t == r) {
      for (size_t i = 0; i < count; ++i) y[i] = 100.0 * s + i;
    }
  }
  return y;
}

std::vector<double> Input(int r, size_t count) {
  std::vector<double> x(count);
  for (size_t i = 0; i < count; ++i) x[i] = 100.0 * r + i;
  return x;
}

TEST(InProcessAsyncTest, MatchesTheReferenceOnRingsAndPartialPairs) {
  constexpr size_t kCount = 7;
  for (int n : {1, 2, 3, 4}) {
    for (const Pairs& pairs : {Ring(n, 1), Ring(n, n - 1), Pairs{{0, n - 1}}}) {
      absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
        std::vector<double> x = Input(c.rank(), kCount), y(kCount, -1.0);
        auto call = c.PpermuteStart(x.data(), y.data(), kCount, DataType::kF64, pairs);
        if (!call.ok()) return call.status();
        if (absl::Status w = (*call)->Wait(); !w.ok()) return w;
        if (y != Expected(c.rank(), pairs, kCount)) return absl::InternalError("wrong values");
        return absl::OkStatus();
      }, Options());
      EXPECT_TRUE(s.ok()) << "n=" << n << ": " << s;
    }
  }
}

// The point of the design: a transfer completes while its other rank is still busy (it has not
// called Wait() yet and will not until the transfer is over). With a call that needs both ranks
// inside it (the blocking Ppermute), this would time out.
TEST(InProcessAsyncTest, TransferCompletesWhileThePartnerComputes) {
  for (int waiter : {0, 1}) {  // the receiver finishes first, then the sender does
    std::atomic<bool> done{false};
    absl::Status s = RunInProcess(2, [&](Communicator& c) -> absl::Status {
      std::vector<double> x = Input(c.rank(), 5), y(5, -1.0);
      auto call = c.PpermuteStart(x.data(), y.data(), 5, DataType::kF64, Ring(2, 1));
      if (!call.ok()) return call.status();
      if (c.rank() != waiter) {
        const absl::Time give_up = absl::Now() + absl::Seconds(20);
        while (!done.load() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
        if (!done.load()) return absl::InternalError("the partner's Wait() did not complete");
      }
      absl::Status w = (*call)->Wait();
      if (c.rank() == waiter) done.store(true);
      if (!w.ok()) return w;
      return y == Expected(c.rank(), Ring(2, 1), 5) ? absl::OkStatus()
                                                     : absl::InternalError("wrong values");
    }, Options());
    EXPECT_TRUE(s.ok()) << "waiter " << waiter << ": " << s;
  }
}

TEST(InProcessAsyncTest, SeveralInFlightWaitedInAnyOrderAndInPlace) {
  absl::Status s = RunInProcess(3, [&](Communicator& c) -> absl::Status {
    std::vector<std::vector<double>> x, y;
    std::vector<std::unique_ptr<PendingCollective>> calls;
    for (int k = 0; k < internal::kMaxAsyncPpermutes; ++k) {
      x.push_back(Input(c.rank(), 3 + k));
      y.push_back(std::vector<double>(3 + k, -1.0));
    }
    for (int k = 0; k < internal::kMaxAsyncPpermutes; ++k) {
      // Odd calls in place (send == recv).
      void* recv = k % 2 ? static_cast<void*>(x[k].data()) : y[k].data();
      auto call = c.PpermuteStart(x[k].data(), recv, x[k].size(), DataType::kF64,
                                  Ring(3, 1 + k % 2));
      if (!call.ok()) return call.status();
      calls.push_back(std::move(*call));
    }
    for (int k = internal::kMaxAsyncPpermutes - 1; k >= 0; --k) {
      if (absl::Status w = calls[k]->Wait(); !w.ok()) return w;
      const std::vector<double>& got = k % 2 ? x[k] : y[k];
      if (got != Expected(c.rank(), Ring(3, 1 + k % 2), got.size())) {
        return absl::InternalError(absl::StrCat("wrong values in call ", k));
      }
    }
    return absl::OkStatus();
  }, Options());
  EXPECT_TRUE(s.ok()) << s;
}

TEST(InProcessAsyncTest, TooManyInFlightIsAnError) {
  absl::Status s = RunInProcess(2, [&](Communicator& c) -> absl::Status {
    double x = 1, y[internal::kMaxAsyncPpermutes + 1];
    std::vector<std::unique_ptr<PendingCollective>> calls;
    for (int k = 0; k <= internal::kMaxAsyncPpermutes; ++k) {
      auto call = c.PpermuteStart(&x, &y[k], 1, DataType::kF64, Ring(2, 1));
      if (!call.ok()) return call.status();
      calls.push_back(std::move(*call));
    }
    return absl::OkStatus();
  }, Options());
  EXPECT_THAT(s.message(), HasSubstr("already in flight"));
}

TEST(InProcessAsyncTest, WaitingTwiceIsAnError) {
  absl::Status s = RunInProcess(2, [&](Communicator& c) -> absl::Status {
    double x = c.rank(), y = -1;
    auto call = c.PpermuteStart(&x, &y, 1, DataType::kF64, Ring(2, 1));
    if (!call.ok()) return call.status();
    if (absl::Status w = (*call)->Wait(); !w.ok()) return w;
    return (*call)->Wait();
  }, Options());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("Wait() called twice"));
}

TEST(InProcessAsyncTest, NeverWaitedFailsTheWorld) {
  absl::Status s = RunInProcess(3, [&](Communicator& c) -> absl::Status {
    double x = c.rank(), y = -1;
    {
      auto call = c.PpermuteStart(&x, &y, 1, DataType::kF64, Ring(3, 1));
      if (!call.ok()) return call.status();
      if (c.rank() != 1) {
        if (absl::Status w = (*call)->Wait(); !w.ok()) return w;
      }
    }  // rank 1 drops its call
    return c.Barrier();
  }, Options());
  EXPECT_THAT(s.message(), HasSubstr("never waited")) << s;
  EXPECT_THAT(s.message(), HasSubstr("rank 1"));
}

// Rank 2 sends 6 elements where the others send 5.
TEST(InProcessAsyncTest, MismatchedCountsFailEveryRank) {
  std::vector<absl::Status> got(4);
  std::mutex mu;
  absl::Status s = RunInProcess(4, [&](Communicator& c) -> absl::Status {
    std::vector<double> x(c.rank() == 2 ? 6 : 5, 1.0), y(x.size());
    absl::Status w;
    auto call = c.PpermuteStart(x.data(), y.data(), x.size(), DataType::kF64, Ring(4, 1));
    w = call.ok() ? (*call)->Wait() : call.status();
    // A rank whose partners matched (rank 0: 3 -> 0 -> 1) may finish its part; its next
    // collective fails.
    if (w.ok()) w = c.Barrier();
    std::lock_guard<std::mutex> l(mu);
    got[c.rank()] = w;
    return w;
  }, Options());
  EXPECT_THAT(s.message(), HasSubstr("mismatched ppermutes")) << s;
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(got[r].ok()) << "rank " << r;
}

TEST(InProcessAsyncTest, MismatchedPairsFail) {
  absl::Status s = RunInProcess(3, [&](Communicator& c) -> absl::Status {
    double x = 1, y = 0;
    auto call = c.PpermuteStart(&x, &y, 1, DataType::kF64, Ring(3, c.rank() == 0 ? 2 : 1));
    return call.ok() ? (*call)->Wait() : call.status();
  }, Options());
  EXPECT_THAT(s.message(), HasSubstr("different pairs list")) << s;
}

TEST(InProcessAsyncTest, BadPairsAreErrors) {
  for (const Pairs& bad : {Pairs{{0, 2}}, Pairs{{0, 1}, {0, 0}}, Pairs{{1, 0}, {0, 0}}}) {
    absl::Status s = RunInProcess(2, [&](Communicator& c) -> absl::Status {
      double x = 1, y = 0;
      auto call = c.PpermuteStart(&x, &y, 1, DataType::kF64, bad);
      return call.ok() ? (*call)->Wait() : call.status();
    }, Options());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("pair ("));
  }
}

// A partner that never starts the call: fails at once when it returns, by timeout otherwise.
TEST(InProcessAsyncTest, MissingPartnerFailsWithoutHanging) {
  const absl::Time t0 = absl::Now();
  absl::Status s = RunInProcess(2, [&](Communicator& c) -> absl::Status {
    if (c.rank() == 1) return absl::OkStatus();
    double x = 1, y = 0;
    auto call = c.PpermuteStart(&x, &y, 1, DataType::kF64, Ring(2, 1));
    return call.ok() ? (*call)->Wait() : call.status();
  }, Options(absl::Seconds(60)));
  EXPECT_THAT(s.message(), HasSubstr("without starting the matching ppermute")) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(30));
  s = RunInProcess(2, [&](Communicator& c) -> absl::Status {
    double x = 1, y = 0;
    if (c.rank() == 1) return c.Barrier();  // busy elsewhere: the timeout ends it
    auto call = c.PpermuteStart(&x, &y, 1, DataType::kF64, Ring(2, 1));
    return call.ok() ? (*call)->Wait() : call.status();
  }, Options(absl::Milliseconds(300)));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

// The default: the blocking call at start, Wait() exactly once.
TEST(InProcessAsyncTest, DefaultImplementationRunsTheBlockingCall) {
  SelfCommunicator self;
  double x[2] = {1, 2}, y[2] = {0, 0};
  auto call = self.PpermuteStart(x, y, 2, DataType::kF64, {{0, 0}});
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(y[0], 1);
  EXPECT_EQ(y[1], 2);
  EXPECT_TRUE((*call)->Wait().ok());
  EXPECT_EQ((*call)->Wait().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace shardmap::collectives
