// The NCCL backend's failure-to-status mapping (internal::ResolveNcclFailure, NcclCallRecord),
// host-side: runs with or without CUDA and a GPU. The multi-process behaviour is in
// nccl_multiprocess_test (needs two GPUs).
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "collectives/internal/free_port.h"
#include "collectives/nccl_communicator.h"
#include "collectives/peer_failure_board.h"
#include "collectives/self_communicator.h"
#include "collectives/store_world_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardmap::collectives::internal {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const absl::Status kTimeout = absl::DeadlineExceededError("timed out after 3s waiting for NCCL");
const absl::Status kRemote = absl::InternalError("asynchronous NCCL error: remote process exited");

TEST(ResolveNcclFailureTest, ALocalFailureIsReportedAsIsAndPublished) {
  const absl::Status bad_root = absl::InvalidArgumentError("root 7 is not a rank of this group");
  ResolvedNcclFailure r =
      ResolveNcclFailure(bad_root, FailureOrigin::kLocal, 0, std::nullopt, std::nullopt);
  EXPECT_EQ(r.status, bad_root);
  EXPECT_TRUE(r.publish);
  // Never a mismatch for a local failure (nothing was waited for).
  r = ResolveNcclFailure(bad_root, FailureOrigin::kLocal, 0, std::nullopt,
                         absl::InvalidArgumentError("mismatched"));
  EXPECT_EQ(r.status, bad_root);
}

// A call made after a peer's failure may fail at once (NCCL reports the torn-down peer): the
// world failed first, so the peer's status it is.
TEST(ResolveNcclFailureTest, ALocalFailureAfterAPeersPublishedOneReportsThePeers) {
  const PeerFailure peer{2, absl::UnavailableError("lost its GPU")};
  ResolvedNcclFailure r = ResolveNcclFailure(absl::InternalError("ncclSystemError"),
                                             FailureOrigin::kLocal, 0, peer, std::nullopt);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(r.status.message()), StartsWith("rank 2 failed: lost its GPU"));
  EXPECT_FALSE(r.publish);
}

TEST(ResolveNcclFailureTest, APeersPublishedFailureGivesItsCodeAndMessage) {
  const PeerFailure peer{2, absl::InvalidArgumentError("NCCL Broadcast(f32, count=4) on group "
                                                       "'nccl world(3)' (rank 2 of 3) failed: "
                                                       "root 7 is not a rank")};
  for (const absl::Status& own : {kTimeout, kRemote}) {
    ResolvedNcclFailure r = ResolveNcclFailure(own, FailureOrigin::kPeer, 0, peer, std::nullopt);
    EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << r.status;
    EXPECT_THAT(std::string(r.status.message()), StartsWith("rank 2 failed: NCCL Broadcast"));
    EXPECT_THAT(std::string(r.status.message()), HasSubstr(std::string(own.message())));
    EXPECT_FALSE(r.publish);  // the peer told it already
  }
}

TEST(ResolveNcclFailureTest, APeersFailureWinsOverAMismatchSeenLater) {
  const PeerFailure peer{1, absl::ResourceExhaustedError("out of memory")};
  ResolvedNcclFailure r = ResolveNcclFailure(kTimeout, FailureOrigin::kPeer, 0, peer,
                                             absl::InvalidArgumentError("mismatched"));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(r.publish);
}

TEST(ResolveNcclFailureTest, AMismatchFoundHereIsInvalidArgumentAndPublished) {
  const absl::Status mismatch = absl::InvalidArgumentError(
      "mismatched collectives on group 'nccl world(3)': rank 0 called AllReduce(f32, count=4, "
      "sum) #2 but rank 2 called AllReduce(f32, count=5, sum) #2");
  ResolvedNcclFailure r =
      ResolveNcclFailure(kTimeout, FailureOrigin::kPeer, 1, std::nullopt, mismatch);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status.message()), StartsWith(std::string(mismatch.message())));
  EXPECT_THAT(std::string(r.status.message()), HasSubstr("found at: timed out"));
  EXPECT_TRUE(r.publish);
}

TEST(ResolveNcclFailureTest, NothingPublishedGivesTheOwnErrorPublishedForThePeers) {
  ResolvedNcclFailure r =
      ResolveNcclFailure(kRemote, FailureOrigin::kPeer, 1, std::nullopt, std::nullopt);
  EXPECT_EQ(r.status, kRemote);
  EXPECT_TRUE(r.publish);
}

// Another group of this process published first (the same world rank): its own error, and not
// published twice.
TEST(ResolveNcclFailureTest, ItsOwnEarlierPublicationIsNotRepeated) {
  const PeerFailure self{3, absl::InvalidArgumentError("bad count")};
  ResolvedNcclFailure r = ResolveNcclFailure(kTimeout, FailureOrigin::kPeer, 3, self, std::nullopt);
  EXPECT_EQ(r.status, kTimeout);
  EXPECT_FALSE(r.publish);
}

TEST(AbortNcclWorldTest, RefusesANonNcclCommunicator) {
  SelfCommunicator self;
  absl::Status s = AbortNcclWorld(self, absl::InternalError("x"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("not an NCCL communicator"));
}

TEST(CreateNcclCommunicatorTest, RefusesANegativePeerFailureWaitOrANullStore) {
  if (!NcclCompiledIn()) GTEST_SKIP() << "built without CUDA: the factory is Unimplemented";
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  TcpStoreOptions o;
  o.port = *port;
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  NcclOptions options;
  options.peer_failure_wait = absl::Seconds(-1);
  auto comm = CreateNcclCommunicator(std::shared_ptr<TcpStore>(*std::move(store)), options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("peer_failure_wait"));
  EXPECT_EQ(CreateNcclCommunicator(std::shared_ptr<TcpStore>(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CreateNcclCommunicatorTest, RefusesANegativeWatchTimeout) {
  if (!NcclCompiledIn()) GTEST_SKIP() << "built without CUDA: the factory is Unimplemented";
  absl::StatusOr<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status();
  TcpStoreOptions o;
  o.port = *port;
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  NcclOptions options;
  options.watch_timeout = absl::Milliseconds(-5);
  auto comm = CreateNcclCommunicator(std::shared_ptr<TcpStore>(*std::move(store)), options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("watch_timeout"));
}
// One TcpStore client per rank of a world of `n` (rank 0 serves), as the ranks' processes have.
std::vector<std::shared_ptr<TcpStore>> Stores(int n) {
  return testing::ConnectStoreWorld(n, "nccl-failure-status-test-token");
}

NcclCallFailure Call(int rank, int n, absl::string_view what, int64_t number, absl::Status own,
                     FailureOrigin origin) {
  NcclCallFailure c;
  c.where =
      absl::StrCat("NCCL ", what, " on group 'nccl world(", n, ")' (rank ", rank, " of ", n, ")");
  c.own = std::move(own);
  c.origin = origin;
  c.group_key = "world";
  c.group_name = absl::StrCat("nccl world(", n, ")");
  c.group_rank = rank;
  c.group_size = n;
  c.call_record = NcclCallRecord(what, number);
  c.world_rank = rank;
  c.peer_failure_wait = absl::Seconds(3);
  return c;
}

// The failure paths of whole jobs, one thread per rank with its own store client and board (as
// the NCCL communicator does, minus NCCL): what every rank reports.
TEST(ReportNcclCallFailureTest, ABadArgumentOnOneRankReachesEveryPeerWithItsCode) {
  for (const int n : {2, 3, 5}) {
    const int bad = n / 2;
    std::vector<std::shared_ptr<TcpStore>> stores = Stores(n);
    std::vector<absl::Status> got(n);
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r) {
      ranks.emplace_back([&, r] {
        PeerFailureBoard board(stores[r], "nccl/unique_id/1/board");
        if (r == bad) {
          got[r] = ReportNcclCallFailure(
              &board, Call(r, n, "Broadcast(f32, count=4)", 2,
                           absl::InvalidArgumentError(absl::StrCat("root ", n, " is not a rank")),
                           FailureOrigin::kLocal));
        } else {
          absl::SleepFor(absl::Milliseconds(10 * r));  // their NCCL calls fail at other moments
          got[r] = ReportNcclCallFailure(
              &board, Call(r, n, "Broadcast(f32, count=4)", 2,
                           absl::InternalError("asynchronous NCCL error: remote process exited"),
                           FailureOrigin::kPeer));
        }
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(got[r].code(), absl::StatusCode::kInvalidArgument) << got[r];
      EXPECT_THAT(std::string(got[r].message()),
                  HasSubstr(absl::StrCat("(rank ", bad, " of ", n, ") failed: root ", n,
                                         " is not a rank")));
      if (r != bad) {
        EXPECT_THAT(std::string(got[r].message()),
                    StartsWith(absl::StrCat("NCCL Broadcast(f32, count=4) on group 'nccl world(", n,
                                            ")' (rank ", r, " of ", n, ") failed: rank ", bad,
                                            " failed: ")));
        EXPECT_THAT(std::string(got[r].message()), HasSubstr("remote process exited"));
      }
    }
  }
}

TEST(ReportNcclCallFailureTest, MismatchedCallsAtATimeoutAreInvalidArgumentOnEveryRank) {
  for (const int n : {2, 3, 5}) {
    std::vector<std::shared_ptr<TcpStore>> stores = Stores(n);
    std::vector<absl::Status> got(n);
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; ++r) {
      ranks.emplace_back([&, r] {
        PeerFailureBoard board(stores[r], "nccl/unique_id/1/board");
        absl::SleepFor(absl::Milliseconds(23 * r));  // each rank's timeout ends at its moment
        const std::string what =
            r == n - 1 ? "AllReduce(f32, count=5, sum)" : "AllReduce(f32, count=4, sum)";
        got[r] = ReportNcclCallFailure(
            &board, Call(r, n, what, 2, absl::DeadlineExceededError("timed out after 5s"),
                         FailureOrigin::kPeer));
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(got[r].code(), absl::StatusCode::kInvalidArgument) << "n=" << n << ": " << got[r];
      EXPECT_THAT(std::string(got[r].message()),
                  HasSubstr(absl::StrCat("mismatched collectives on group 'nccl world(", n, ")'")));
      EXPECT_THAT(std::string(got[r].message()),
                  HasSubstr(absl::StrCat("called AllReduce(f32, count=4, sum) #2 but rank ", n - 1,
                                         " called AllReduce(f32, count=5, sum) #2")));
    }
  }
}

TEST(ReportNcclCallFailureTest, ATimeoutInTheSameCallEverywhereStaysATimeout) {
  constexpr int kRanks = 3;
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(kRanks);
  std::vector<absl::Status> got(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      PeerFailureBoard board(stores[r], "nccl/unique_id/1/board");
      got[r] = ReportNcclCallFailure(
          &board, Call(r, kRanks, "Barrier()", 7, absl::DeadlineExceededError("timed out after 5s"),
                       FailureOrigin::kPeer));
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(got[r].code(), absl::StatusCode::kDeadlineExceeded) << got[r];
    EXPECT_THAT(std::string(got[r].message()), HasSubstr("timed out after 5s"));
    EXPECT_THAT(std::string(got[r].message()), ::testing::Not(HasSubstr("mismatched")));
  }
}

// A Send on one rank and the matching Recv on its peer are not a mismatch: point-to-point calls
// carry no record and are never compared.
TEST(ReportNcclCallFailureTest, PointToPointTimeoutsAreNeverAMismatch) {
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(2);
  std::vector<absl::Status> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      PeerFailureBoard board(stores[r], "nccl/unique_id/1/board");
      NcclCallFailure c =
          Call(r, 2, r == 0 ? "Send(f32, count=4) to rank 1" : "Recv(f32, count=4) from rank 0", 1,
               absl::DeadlineExceededError("timed out after 5s"), FailureOrigin::kPeer);
      c.call_record.clear();
      c.peer_failure_wait = absl::Milliseconds(300);
      got[r] = ReportNcclCallFailure(&board, c);
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), absl::StatusCode::kDeadlineExceeded) << got[r];
    EXPECT_THAT(std::string(got[r].message()), ::testing::Not(HasSubstr("mismatched")));
  }
}

TEST(ReportNcclCallFailureTest, WithoutABoardOrWithADeadStoreTheOwnErrorComesBackInTime) {
  const NcclCallFailure call = Call(1, 2, "AllGather(bf16, count=3)", 4,
                                    absl::InternalError("NCCL remote error"), FailureOrigin::kPeer);
  absl::Status s = ReportNcclCallFailure(nullptr, call);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(),
            "NCCL AllGather(bf16, count=3) on group 'nccl world(2)' (rank 1 of 2) failed: NCCL "
            "remote error; the communicator was aborted");
  std::vector<std::shared_ptr<TcpStore>> stores = Stores(2);
  PeerFailureBoard board(stores[1], "nccl/unique_id/1/board");
  stores[0].reset();                           // the master's process is gone
  for (const bool compared : {false, true}) {  // point-to-point, collective
    NcclCallFailure c = call;
    if (!compared) c.call_record.clear();
    const absl::Time start = absl::Now();
    absl::Status t = ReportNcclCallFailure(&board, c);
    EXPECT_LT(absl::Now() - start, absl::Seconds(8));
    EXPECT_EQ(t, s);
  }
}

TEST(NcclCallRecordTest, NamesTheCallAndItsNumber) {
  EXPECT_EQ(NcclCallRecord("AllReduce(f32, count=4, sum)", 2), "AllReduce(f32, count=4, sum) #2");
  EXPECT_NE(NcclCallRecord("Barrier()", 1), NcclCallRecord("Barrier()", 2));
}

}  // namespace
}  // namespace shardmap::collectives::internal
