// PeerFailureBoard against a live TcpStore on loopback (one client per rank, as across
// processes), and its pure pieces: the record format, StatusAfterFailure, MismatchFromCalls.
#include "collectives/peer_failure_board.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/internal/free_port.h"
#include "collectives/store_world_test_util.h"
#include "collectives/tcp_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "peer-failure-board-test-token";
// One TcpStore client per rank of a world of `n` (rank 0 serves).
std::vector<std::shared_ptr<TcpStore>> Stores(int n, absl::Duration timeout = absl::Seconds(20)) {
  return testing::ConnectStoreWorld(n, kToken, timeout);
}

TEST(PeerFailureRecordTest, RoundTripsCodeRankAndAMultiLineMessage) {
  const absl::Status s = absl::InvalidArgumentError("bad root 7\nsecond line: x y");
  absl::StatusOr<PeerFailure> f = DecodePeerFailure(EncodePeerFailure(3, s));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->rank, 3);
  EXPECT_EQ(f->status, s);
}

TEST(PeerFailureRecordTest, MalformedRecordsAreRefused) {
  for (const char* bad : {"", "v1 0 3", "v2 0 3\nx", "v1 -1 3\nx", "v1 a 3\nx", "v1 0 0\nok?",
                          "v1 0 17\nx", "v1 0\nx", "v1  3\nx", "v1 0 3x\nx"}) {
    absl::StatusOr<PeerFailure> f = DecodePeerFailure(bad);
    EXPECT_FALSE(f.ok()) << "accepted '" << bad << "'";
    if (!f.ok()) {
      EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
    }
  }
}

TEST(StatusAfterFailureTest, APeerCausedFailureTakesThePeersCodeAndMessage) {
  const absl::Status own = absl::InternalError("NCCL remote error");
  const PeerFailure peer{2, absl::InvalidArgumentError("root 7 is not a rank")};
  const absl::Status s = StatusAfterFailure(own, FailureOrigin::kPeer, 0, peer);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "rank 2 failed: root 7 is not a rank (here: NCCL remote error)");
}

TEST(StatusAfterFailureTest, OwnStatusWhenLocalOrFirstOrNothingPublished) {
  const absl::Status own = absl::DeadlineExceededError("timed out");
  const PeerFailure peer{1, absl::InvalidArgumentError("mismatch")};
  EXPECT_EQ(StatusAfterFailure(own, FailureOrigin::kLocal, 0, peer), own);
  EXPECT_EQ(StatusAfterFailure(own, FailureOrigin::kPeer, 1, peer), own);  // published it itself
  EXPECT_EQ(StatusAfterFailure(own, FailureOrigin::kPeer, 0, std::nullopt), own);
  EXPECT_EQ(StatusAfterFailure(own, FailureOrigin::kPeer, 0, PeerFailure{1, absl::OkStatus()}),
            own);
}

TEST(MismatchFromCallsTest, NamesTheFirstTwoRanksThatDisagree) {
  const std::vector<std::optional<std::string>> calls = {
      std::nullopt, "AllReduce(f32, count=4, sum) #2", "AllReduce(f32, count=4, sum) #2",
      "AllReduce(f32, count=5, sum) #2", "AllGather(f32, count=4) #2"};
  std::optional<absl::Status> m = MismatchFromCalls("nccl world(5)", calls);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m->message()),
              HasSubstr("mismatched collectives on group 'nccl world(5)': rank 1 called "
                        "AllReduce(f32, count=4, sum) #2 but rank 3 called AllReduce(f32, "
                        "count=5, sum) #2"));
}

// A rank one call further (its part of a broadcast was done) while the others wait for a missing
// rank is no mismatch; once every rank is stuck, different calls are one.
TEST(MismatchFromCallsTest, DifferentPlacesCountOnlyWhenEveryRankIsStuck) {
  std::vector<std::optional<std::string>> calls = {"Broadcast(f32, count=4) #5",
                                                   "AllReduce(f32, count=4, sum) #6", std::nullopt};
  EXPECT_FALSE(MismatchFromCalls("g", calls).has_value());
  calls[2] = "Broadcast(f32, count=4) #5";
  std::optional<absl::Status> m = MismatchFromCalls("g", calls);
  ASSERT_TRUE(m.has_value());
  EXPECT_THAT(std::string(m->message()),
              HasSubstr("rank 0 called Broadcast(f32, count=4) #5 but rank 1 called AllReduce(f32, "
                        "count=4, sum) #6"));
  // The same place with a rank missing is still a mismatch, named by the pair that differs.
  calls = {std::nullopt, "Barrier() #3", "AllGather(f32, count=4) #3"};
  m = MismatchFromCalls("g", calls);
  ASSERT_TRUE(m.has_value());
  EXPECT_THAT(std::string(m->message()),
              HasSubstr("rank 1 called Barrier() #3 but rank 2 called AllGather(f32, count=4) #3"));
}

TEST(MismatchFromCallsTest, NothingWhenThePublishedCallsAgree) {
  EXPECT_FALSE(MismatchFromCalls("g", {}).has_value());
  EXPECT_FALSE(MismatchFromCalls("g", {std::nullopt, std::nullopt}).has_value());
  EXPECT_FALSE(MismatchFromCalls("g", {"Barrier() #1", std::nullopt, "Barrier() #1"}).has_value());
}

TEST(PeerFailureBoardTest, APublishedFailureReachesEveryRankWithItsCode) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(3);
  PeerFailureBoard b0(stores[0], "w"), b1(stores[1], "w"), b2(stores[2], "w");
  ASSERT_TRUE(b2.Publish(absl::InvalidArgumentError("root 7 is not a rank of this group")).ok());
  for (PeerFailureBoard* b : {&b0, &b1, &b2}) {
    std::optional<PeerFailure> f = b->First(absl::Seconds(2));
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->rank, 2);
    EXPECT_EQ(f->status, absl::InvalidArgumentError("root 7 is not a rank of this group"));
  }
}

TEST(PeerFailureBoardTest, TheFirstPublicationWins) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(3);
  PeerFailureBoard b0(stores[0], "w"), b1(stores[1], "w"), b2(stores[2], "w");
  ASSERT_TRUE(b1.Publish(absl::InvalidArgumentError("first")).ok());
  ASSERT_TRUE(b0.Publish(absl::DeadlineExceededError("second")).ok());
  ASSERT_TRUE(b2.Publish(absl::AbortedError("third")).ok());
  for (PeerFailureBoard* b : {&b0, &b1, &b2}) {
    std::optional<PeerFailure> f = b->First(absl::Seconds(2));
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->rank, 1);
    EXPECT_EQ(f->status.code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(PeerFailureBoardTest, AFailurePublishedDuringTheWaitIsSeen) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(2);
  PeerFailureBoard b0(stores[0], "w"), b1(stores[1], "w");
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_TRUE(b1.Publish(absl::ResourceExhaustedError("out of memory")).ok());
  });
  std::optional<PeerFailure> f = b0.First(absl::Seconds(5));
  late.join();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->status.code(), absl::StatusCode::kResourceExhausted);
}

TEST(PeerFailureBoardTest, NothingPublishedReturnsWithinTheWaitAndKeepsTheStoreUsable) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(2);
  PeerFailureBoard b1(stores[1], "w");
  const absl::Time start = absl::Now();
  EXPECT_FALSE(b1.First(absl::Milliseconds(300)).has_value());
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(2));
  // The wait never let a Get time out, which would have closed the client's connection.
  EXPECT_TRUE(stores[1]->Set("still", "usable").ok());
  EXPECT_TRUE(b1.Publish(absl::InternalError("x")).ok());
}

TEST(PeerFailureBoardTest, PrefixesKeepWorldsApart) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(2);
  PeerFailureBoard a0(stores[0], "nccl/unique_id/1/board"), a1(stores[1], "nccl/unique_id/1/board");
  PeerFailureBoard b0(stores[0], "nccl/unique_id/2/board");
  ASSERT_TRUE(a1.Publish(absl::UnavailableError("world 1 failed")).ok());
  EXPECT_FALSE(b0.First(absl::Milliseconds(200)).has_value());
  std::optional<PeerFailure> f = a0.First(absl::Seconds(1));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->status.message(), "world 1 failed");
}

TEST(PeerFailureBoardTest, PollIsNonBlockingAndSeesAPublication) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(2);
  PeerFailureBoard b0(stores[0], "w"), b1(stores[1], "w");
  const absl::Time start = absl::Now();
  for (int i = 0; i < 20; ++i) {
    EXPECT_FALSE(b0.Poll().has_value());
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ASSERT_TRUE(b1.Publish(absl::DataLossError("corrupt checkpoint")).ok());
  std::optional<PeerFailure> f;
  for (int i = 0; i < 500 && !f.has_value(); ++i) {
    f = b0.Poll();
    if (!f.has_value()) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(b0.Poll().has_value());  // stays seen
}

// The master is gone (its process died): every operation fails or gives up at once, never hangs.
TEST(PeerFailureBoardTest, ADeadStoreNeverBlocksFailureHandling) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(2, absl::Seconds(30));
  PeerFailureBoard b1(stores[1], "w");
  stores[0].reset();  // rank 0 stops serving (after its bounded shutdown grace)
  const absl::Time start = absl::Now();
  EXPECT_FALSE(b1.Publish(absl::InternalError("x")).ok());
  EXPECT_FALSE(b1.First(absl::Seconds(1)).has_value());
  EXPECT_FALSE(b1.Poll().has_value());
  PeerFailureBoard::StuckCallDiagnosis d =
      b1.DiagnoseStuckCall("w", "world", 1, 2, "Barrier() #1", absl::Seconds(1));
  EXPECT_FALSE(d.first.has_value());
  EXPECT_FALSE(d.mismatch.has_value());
  EXPECT_LT(absl::Now() - start, absl::Seconds(6));
}

// The store does not answer (as when the master is stopped): the client's one connection is
// held by a request that waits for 20 s; the board still returns within its limits.
TEST(PeerFailureBoardTest, AStoreThatDoesNotAnswerIsAbandonedAtTheLimit) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(2, absl::Seconds(20));
  std::thread blocker([s = stores[1]] { (void)s->Get("never-set", absl::Seconds(4)); });
  absl::SleepFor(absl::Milliseconds(100));  // the blocker holds the client's connection now
  PeerFailureBoard b1(stores[1], "w", /*op_limit=*/absl::Milliseconds(300));
  absl::Time start = absl::Now();
  absl::Status s = b1.Publish(absl::InternalError("x"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  start = absl::Now();
  EXPECT_FALSE(b1.First(absl::Milliseconds(300)).has_value());
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  blocker.join();
}

TEST(PeerFailureBoardTest, ATimeoutOnMismatchedCallsIsDiagnosedOnEveryRank) {
  for (const int n : {2, 3, 5}) {
    std::vector<std::shared_ptr<TcpStore>> stores = Stores(n);
    std::vector<PeerFailureBoard::StuckCallDiagnosis> got(n);
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r) {
      ranks.emplace_back([&, r] {
        PeerFailureBoard b(stores[r], "w");
        absl::SleepFor(absl::Milliseconds(37 * r));  // ranks time out at different moments
        const std::string call =
            r == n - 1 ? "AllReduce(f32, count=5, sum) #2" : "AllReduce(f32, count=4, sum) #2";
        got[r] = b.DiagnoseStuckCall("w", "world", r, n, call, absl::Seconds(5));
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(got[r].mismatch.has_value()) << "n=" << n << " rank " << r;
      EXPECT_EQ(got[r].mismatch->code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(
          std::string(got[r].mismatch->message()),
          HasSubstr(absl::StrCat("rank ", n - 1, " called AllReduce(f32, count=5, sum) #2")));
      EXPECT_THAT(std::string(got[r].mismatch->message()),
                  HasSubstr("called AllReduce(f32, count=4, sum) #2 but rank"));
    }
  }
}

TEST(PeerFailureBoardTest, ATimeoutWithAgreeingCallsIsNoMismatchAndGroupsAreSeparate) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(4);
  // Group "tp0" (world ranks 0, 1) agrees; group "tp1" (world ranks 2, 3) disagrees.
  std::vector<PeerFailureBoard::StuckCallDiagnosis> got(4);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      PeerFailureBoard b(stores[r], "w");
      const std::string group = r < 2 ? "w/s1c0" : "w/s1c1";
      const std::string call = r == 3 ? "Barrier() #7" : "Barrier() #6";
      got[r] = b.DiagnoseStuckCall(group, group, r % 2, 2, call, absl::Seconds(3));
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_FALSE(got[0].mismatch.has_value());
  EXPECT_FALSE(got[1].mismatch.has_value());
  ASSERT_TRUE(got[2].mismatch.has_value());
  ASSERT_TRUE(got[3].mismatch.has_value());
  EXPECT_THAT(std::string(got[2].mismatch->message()),
              HasSubstr("rank 0 called Barrier() #6 but rank 1 called Barrier() #7"));
}

TEST(PeerFailureBoardTest, APublishedFailureEndsAStuckCallDiagnosisEarly) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(3);
  PeerFailureBoard b0(stores[0], "w"), b2(stores[2], "w");
  ASSERT_TRUE(b2.Publish(absl::InvalidArgumentError("bad peer")).ok());
  const absl::Time start = absl::Now();
  PeerFailureBoard::StuckCallDiagnosis d =
      b0.DiagnoseStuckCall("w", "world", 0, 3, "Barrier() #1", absl::Seconds(10));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_TRUE(d.first.has_value());
  EXPECT_EQ(d.first->rank, 2);
  EXPECT_FALSE(d.mismatch.has_value());
}

// Every rank fails at once, several times over: exactly one publication is the first, and every
// rank reads that same one.
TEST(PeerFailureBoardTest, ConcurrentPublishersAgreeOnOneFirstFailure) {
  constexpr int kRanks = 6;
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(kRanks);
  for (int round = 0; round < 20; ++round) {
    const std::string prefix = absl::StrCat("round/", round);
    std::vector<std::optional<PeerFailure>> seen(kRanks);
    std::atomic<int> go{0};
    std::vector<std::thread> ranks;
    for (int r = 0; r < kRanks; ++r) {
      ranks.emplace_back([&, r] {
        PeerFailureBoard b(stores[r], prefix);
        go.fetch_add(1);
        while (go.load() < kRanks) std::this_thread::yield();
        if (r % 2 == 0) {
          EXPECT_TRUE(b.Publish(absl::Status(static_cast<absl::StatusCode>(1 + r),
                                             absl::StrCat("rank ", r, " broke")))
                          .ok());
        }
        seen[r] = b.First(absl::Seconds(5));
      });
    }
    for (std::thread& t : ranks) t.join();
    ASSERT_TRUE(seen[0].has_value());
    EXPECT_EQ(seen[0]->rank % 2, 0);
    EXPECT_EQ(seen[0]->status.code(), static_cast<absl::StatusCode>(1 + seen[0]->rank));
    for (int r = 1; r < kRanks; ++r) {
      ASSERT_TRUE(seen[r].has_value());
      EXPECT_EQ(seen[r]->rank, seen[0]->rank) << "round " << round;
      EXPECT_EQ(seen[r]->status, seen[0]->status);
    }
  }
}

}  // namespace
}  // namespace shardmap::collectives
