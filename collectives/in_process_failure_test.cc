// Failure semantics of the in-process backend: a failing rank poisons its world (sub-groups
// included) and nobody hangs; bad arguments and mismatched calls give clear errors.
#include <atomic>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/communicator.h"
#include "collectives/in_process.h"
#include "collectives/internal/rank_threads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::HasSubstr;

// A long timeout: a poisoned world must fail at once, not after it.
InProcessOptions Slow() {
  InProcessOptions o;
  o.timeout = absl::Seconds(30);
  return o;
}

// Collects what every rank's collectives returned.
struct Outcomes {
  std::mutex mu;
  std::vector<absl::Status> by_rank;
  explicit Outcomes(int n) : by_rank(n) {}
  void Set(int r, absl::Status s) {
    std::lock_guard<std::mutex> l(mu);
    by_rank[r] = std::move(s);
  }
};

absl::Status LoopAllReduce(Communicator& c, int iters) {
  std::vector<float> v(100, 1.0f);
  for (int i = 0; i < iters; ++i) {
    absl::Status s = c.AllReduce(v.data(), v.data(), v.size(), DataType::kF32, ReduceOp::kSum);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

TEST(InProcessFailureTest, RankReturningErrorPoisonsOthersImmediately) {
  for (int n : {2, 3, 8}) {
    Outcomes out(n);
    const absl::Time start = absl::Now();
    absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
      if (c.rank() == n - 1) {
        absl::Status st = LoopAllReduce(c, 3);
        if (!st.ok()) return st;
        return absl::UnavailableError("disk on fire");
      }
      absl::Status st = LoopAllReduce(c, 1000);
      out.Set(c.rank(), st);
      return st;
    }, Slow());
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank " + std::to_string(n - 1)));
    EXPECT_THAT(std::string(s.message()), HasSubstr("disk on fire"));
    for (int r = 0; r + 1 < n; ++r) {
      // The failing rank's own code, so every rank reports the same kind of error.
      EXPECT_EQ(out.by_rank[r].code(), absl::StatusCode::kUnavailable) << out.by_rank[r];
      EXPECT_THAT(std::string(out.by_rank[r].message()),
                  HasSubstr("poisoned by rank " + std::to_string(n - 1) + ": disk on fire"));
    }
  }
}

TEST(InProcessFailureTest, ThrowingRankPoisonsTheWorld) {
  const absl::Time start = absl::Now();
  absl::Status s = RunInProcess(4, [&](Communicator& c) -> absl::Status {
    if (c.rank() == 2) throw std::runtime_error("bad alloc in layer 3");
    return LoopAllReduce(c, 1000);
  }, Slow());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("bad alloc in layer 3"));
}

TEST(InProcessFailureTest, RankReturningEarlyFailsThePeersWaitingForIt) {
  const absl::Time start = absl::Now();
  Outcomes out(3);
  absl::Status s = RunInProcess(3, [&](Communicator& c) -> absl::Status {
    if (c.rank() == 1) return LoopAllReduce(c, 2);  // returns OK, two calls short
    absl::Status st = LoopAllReduce(c, 4);
    out.Set(c.rank(), st);
    return st;
  }, Slow());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 returned from its function"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("call #3"));
}

TEST(InProcessFailureTest, TimeoutNamesTheMissingRank) {
  InProcessOptions o;
  o.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::Status s = RunInProcess(3, [&](Communicator& c) -> absl::Status {
    if (c.rank() == 2) absl::SleepFor(absl::Seconds(1));  // stuck in "compute"
    return LoopAllReduce(c, 1);
  }, o);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("waiting for rank 2"));
}

TEST(InProcessFailureTest, SubgroupsArePoisonedWithTheirWorld) {
  Outcomes out(6);
  const absl::Time start = absl::Now();
  absl::Status s = RunInProcess(6, [&](Communicator& c) -> absl::Status {
    auto sub = c.Split(c.rank() % 2, c.rank());
    if (!sub.ok()) return sub.status();
    if (c.rank() == 0) return absl::InternalError("rank zero gives up");
    // Odd ranks' group does not contain rank 0, yet must fail too.
    absl::Status st = LoopAllReduce(**sub, 100000);
    out.Set(c.rank(), st);
    return st;
  }, Slow());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank zero gives up"));
  for (int r = 1; r < 6; ++r) {
    EXPECT_EQ(out.by_rank[r].code(), absl::StatusCode::kInternal) << r << out.by_rank[r];
    EXPECT_THAT(std::string(out.by_rank[r].message()), HasSubstr("split(color="));
    EXPECT_THAT(std::string(out.by_rank[r].message()), HasSubstr("rank zero gives up"));
  }
}

TEST(InProcessFailureTest, MismatchedCallsAreReportedNotDeadlocked) {
  struct Case {
    const char* name;
    std::function<absl::Status(Communicator&)> odd;  // what odd ranks call instead
    const char* expect;
  };
  std::vector<float> buf(64, 1.0f);
  const std::vector<Case> cases = {
      {"count", [&](Communicator& c) {
         return c.AllReduce(buf.data(), buf.data(), 11, DataType::kF32, ReduceOp::kSum); },
       "count=11"},
      {"op", [&](Communicator& c) { return c.Barrier(); }, "called Barrier()"},
      {"dtype", [&](Communicator& c) {
         return c.AllReduce(buf.data(), buf.data(), 10, DataType::kI32, ReduceOp::kSum); },
       "i32"},
      {"reduce", [&](Communicator& c) {
         return c.AllReduce(buf.data(), buf.data(), 10, DataType::kF32, ReduceOp::kMax); },
       "max"},
  };
  for (const Case& k : cases) {
    absl::Status s = RunInProcess(4, [&](Communicator& c) -> absl::Status {
      std::vector<float> mine(64, 1.0f);
      if (c.rank() % 2 == 1) return k.odd(c);
      return c.AllReduce(mine.data(), mine.data(), 10, DataType::kF32, ReduceOp::kSum);
    }, Slow());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << k.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("mismatched collectives")) << k.name;
    EXPECT_THAT(std::string(s.message()), HasSubstr(k.expect)) << k.name << ": " << s;
  }
}

// A rank that learns of a peer's failure reports the peer's own code and message: a mismatch
// or a bad argument is INVALID_ARGUMENT on every rank, whichever rank found it.
TEST(InProcessFailureTest, EveryRankReportsTheFailingRanksOwnCode) {
  for (int n : {2, 3, 5}) {
    Outcomes out(n);
    absl::Status s = RunInProcess(n, [&](Communicator& c) -> absl::Status {
      std::vector<float> x(16, 1.0f);
      absl::Status st;
      if (c.rank() == n - 1) {  // a bad argument, found only here
        st = c.Broadcast(x.data(), 4, DataType::kF32, n + 7);
      } else {
        st = LoopAllReduce(c, 1000);
      }
      out.Set(c.rank(), st);
      return st;
    }, Slow());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(out.by_rank[r].code(), absl::StatusCode::kInvalidArgument)
          << "n=" << n << " rank " << r << ": " << out.by_rank[r];
      EXPECT_THAT(std::string(out.by_rank[r].message()),
                  HasSubstr(absl::StrCat("root ", n + 7, " is not a rank")));
    }
  }
}

// Named, not inlined, so the debug report can show it as a call site.
[[gnu::noinline]] absl::Status CallSiteOfTheOddOne(Communicator& c) {
  float x = 0;
  return c.AllGather(&x, &x, 1, DataType::kF32);
}

TEST(InProcessFailureTest, DebugModeReportsBothCallSites) {
  InProcessOptions o = Slow();
  o.debug_check_calls = true;
  absl::Status s = RunInProcess(2, [&](Communicator& c) -> absl::Status {
    float x = 1;
    if (c.rank() == 1) return CallSiteOfTheOddOne(c);
    return c.AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum);
  }, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("AllReduce(f32, count=1, sum) call #1"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("AllGather(f32, count=1) call #1"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("CallSiteOfTheOddOne"));
}

TEST(InProcessFailureTest, DebugModeTimeoutSaysWhereTheOtherRankIs) {
  // Rank 0 calls on the world, rank 1 on a sub-group: different groups, no common barrier.
  InProcessOptions o;
  o.timeout = absl::Milliseconds(300);
  o.debug_check_calls = true;
  absl::Status s = RunInProcess(2, [&](Communicator& c) -> absl::Status {
    auto sub = c.Split(0, c.rank());
    if (!sub.ok()) return sub.status();
    float x = 1;
    if (c.rank() == 0) return c.AllReduce(&x, &x, 1, DataType::kF32, ReduceOp::kSum);
    return CallSiteOfTheOddOne(**sub);
  }, o);
  // Whichever rank times out first reports where the other one is.
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(" is in: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("AllGather(f32, count=1) call #1 on group "
                                                  "'in-process world(2)/split(color=0)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("AllReduce(f32, count=1, sum) call #2 on group "
                                                  "'in-process world(2)'"));
}

TEST(InProcessFailureTest, BadArgumentsGiveClearErrors) {
  struct Case {
    const char* name;
    std::function<absl::Status(Communicator&)> call;
    absl::StatusCode code;
    const char* expect;
  };
  float f[64] = {};
  const std::vector<Case> cases = {
      {"null", [&](Communicator& c) {
         return c.AllReduce(nullptr, f, 3, DataType::kF32, ReduceOp::kSum); },
       absl::StatusCode::kInvalidArgument, "send is null"},
      {"root", [&](Communicator& c) { return c.Broadcast(f, 1, DataType::kF32, 3); },
       absl::StatusCode::kInvalidArgument, "root 3 is not a rank"},
      {"counts", [&](Communicator& c) {
         std::vector<size_t> counts = {1, 2};
         return c.AllGatherV(f, f + 8, counts, DataType::kF32); },
       absl::StatusCode::kInvalidArgument, "counts has 2 entries but the group has 3"},
      {"pairs", [&](Communicator& c) {
         std::vector<std::pair<int, int>> p = {{0, 1}, {2, 1}};
         return c.Ppermute(f, f + 8, 1, DataType::kF32, p); },
       absl::StatusCode::kInvalidArgument, "repeats a destination"},
      {"pair range", [&](Communicator& c) {
         std::vector<std::pair<int, int>> p = {{0, 5}};
         return c.Ppermute(f, f + 8, 1, DataType::kF32, p); },
       absl::StatusCode::kInvalidArgument, "outside [0, 3)"},
      {"self send", [&](Communicator& c) { return c.Send(f, 1, DataType::kF32, c.rank()); },
       absl::StatusCode::kInvalidArgument, "peer must be another rank"},
      {"dtype", [&](Communicator& c) {
         return c.AllReduce(f, f, 1, static_cast<DataType>(42), ReduceOp::kSum); },
       absl::StatusCode::kInvalidArgument, "invalid DataType value 42"},
      {"alltoallv", [&](Communicator& c) {
         std::vector<size_t> sc = {1, 1, 1}, rc = {1, 1, 1};
         if (c.rank() == 1) sc[2] = 2;  // rank 2 expects 1 from rank 1
         return c.AllToAllV(f, sc, f + 16, rc, DataType::kF32); },
       absl::StatusCode::kInvalidArgument, "rank 1 sends 2 elements to rank 2 which expects 1"},
  };
  for (const Case& k : cases) {
    const absl::Time start = absl::Now();
    absl::Status s = RunInProcess(3, [&](Communicator& c) -> absl::Status {
      float local[64] = {};
      (void)local;
      return k.call(c);
    }, Slow());
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << k.name;
    EXPECT_EQ(s.code(), k.code) << k.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(k.expect)) << k.name << ": " << s;
  }
}

TEST(InProcessFailureTest, SendRecvMismatchAndDeadPeer) {
  absl::Status s = RunInProcess(2, [&](Communicator& c) -> absl::Status {
    int64_t v[4] = {};
    if (c.rank() == 0) return c.Send(v, 4, DataType::kI64, 1);
    return c.Recv(v, 3, DataType::kI64, 0);
  }, Slow());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("mismatched Send/Recv"));

  const absl::Time start = absl::Now();
  s = RunInProcess(2, [&](Communicator& c) -> absl::Status {
    int64_t v[4] = {};
    if (c.rank() == 0) return absl::OkStatus();  // never sends
    return c.Recv(v, 4, DataType::kI64, 0);
  }, Slow());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 returned from its function"));
}

TEST(InProcessFailureTest, InvalidRunArguments) {
  auto ok = [](Communicator&) { return absl::OkStatus(); };
  EXPECT_EQ(RunInProcess(0, ok).code(), absl::StatusCode::kInvalidArgument);
  InProcessOptions o;
  o.timeout = absl::ZeroDuration();
  EXPECT_EQ(RunInProcess(2, ok, o).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RunInProcess(2, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// A rank thread that cannot be created is a Status, not std::terminate; no rank ran (so none
// waits for the missing one), and the next call works.
TEST(InProcessFailure, ThreadCreationFailureIsAStatus) {
  internal::RankThreads& pool = internal::RankThreads::Shared();
  const int n = pool.idle() + 3;  // needs 3 new threads
  pool.FailThreadCreationAfterForTesting(1);
  std::atomic<int> ran{0};
  absl::Status s = RunInProcess(n, [&](Communicator& comm) {
    ran.fetch_add(1);
    return comm.Barrier();
  });
  pool.FailThreadCreationAfterForTesting(-1);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("RunInProcess: starting")) << s;
  EXPECT_EQ(ran.load(), 0);
  EXPECT_TRUE(RunInProcess(n, [](Communicator& comm) { return comm.Barrier(); }).ok());
}

}  // namespace
}  // namespace shardmap::collectives
